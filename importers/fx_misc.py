"""aten converters with no family of their own: copysign, signbit, nextafter, angle (of
real tensors), frexp, masked_scatter, unbind_copy, as_strided_scatter, diagonal_scatter and
_batch_norm_with_update_functional.

  copysign(a, b) = -|a| where b's sign bit is set, else |a|
A float b's sign bit is read through a bitcast to the signed integer of its width
(negative where the bit is set: -0.0 and a NaN with its sign bit set included, as
torch copies the bit); an integer b's is b < 0. A Python scalar b is read exactly
(math.copysign).
  angle(x) = pi where x < 0, NaN where x is NaN, else 0 (-0.0 included), real x only.
  frexp(x) = (m, e), x = m 2^e, |m| in [0.5, 1): read from x's bits (bitcast): e is
the exponent field less the bias of [0.5, 1), m x's bits with that field set to it.

as_strided_scatter(x, src, size, stride, offset) = x.clone() with
out.as_strided(size, stride, offset) overwritten by src: the clone of a contiguous x
is row-major, so the view's elements are flat positions known now,
  pos[i] = offset + sum_k i_k * stride_k,
and the result is one gather from x and src side by side (importers/scans.py,
scatter_nd_ir). Positions written twice make torch's copy_ raise: refused.

_batch_norm_with_update_functional (training-mode batch norm, torch >= 2.4's form) is
_native_batch_norm_legit_functional's computation with training=True (its converter
in importers/fx_nn.py), the outputs reordered: (y, save_mean, save_invstd, reserve,
new running_mean, new running_var), reserve an empty u8 tensor on CPU.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from compiler import dtypes
from importers.fx_context import CONVERTERS, Ctx, Fallback, converts, norm_dim
from importers.fx_movement import slice_dim

aten = torch.ops.aten


@converts(aten.copysign.Tensor, aten.copysign.Scalar)
def _copysign(cx: Ctx, a, b):
    """|a| with b's sign (module doc)."""
    dt = cx.out().dtype
    if dt not in dtypes.FLOATS:
        raise Fallback(f"copysign giving {dt}")
    mag = cx.op("abs", cx.cast(a, dt))
    if not isinstance(b, (bool, int, float)):
        return cx.op("select", _sign_bit(cx, b), cx.op("neg", mag), mag)
    negative = math.copysign(1.0, float(b)) < 0
    return cx.op("neg", mag) if negative else mag


# a float dtype -> the signed integer of its width (its sign bit is the integer's)
_BITS = {"f16": "i16", "f32": "i32", "f64": "i64"}


def _sign_bit(cx: Ctx, b):
    """Where b's sign bit is set (bool; module doc)."""
    if b.dtype == "bool" or b.dtype.startswith("u"):
        return cx.op("ne", b, b)  # all false, b's shape
    if b.dtype in dtypes.FLOATS:
        if b.dtype not in _BITS:
            raise Fallback(f"copysign by {b.dtype}")
        b = cx.op("bitcast", b, to=_BITS[b.dtype])
    return cx.op("lt", b, cx.scalar(0, b.dtype))


@converts(aten.signbit.default)
def _signbit(cx: Ctx, x):
    """Whether x's sign bit is set: -0.0 and a NaN with the bit set included."""
    return _sign_bit(cx, x)


@converts(aten.nextafter.default)
def _nextafter(cx: Ctx, x, y):
    """The float after x towards y, from x's bits as a signed integer i: i + 1 moves
    away from zero, i - 1 towards it; y where x == y (so +-0 towards +-0 gives y's zero),
    NaN where either is, the smallest subnormal with y's sign from a zero x."""
    dt = cx.out().dtype
    if dt not in _BITS:
        raise Fallback(f"nextafter of {dt}")
    ity = _BITS[dt]
    x, y = cx.cast(x, dt), cx.cast(y, dt)
    i = cx.op("bitcast", x, to=ity)
    away = cx.op("eq", cx.op("lt", y, x), cx.op("lt", x, cx.scalar(0.0, dt)))
    one = cx.scalar(1, ity)
    step = cx.op("bitcast", cx.op("select", away, cx.op("add", i, one), cx.op("sub", i, one)),
                 to=dt)
    tiny = cx.op("bitcast", one, to=dt)  # the smallest subnormal
    from_zero = cx.op("select", cx.op("lt", y, cx.scalar(0.0, dt)), cx.op("neg", tiny), tiny)
    r = cx.op("select", cx.op("eq", x, cx.scalar(0.0, dt)), from_zero, step)
    r = cx.op("select", cx.op("eq", x, y), y, r)
    nan = cx.op("or", cx.op("isnan", x), cx.op("isnan", y))
    return cx.op("select", nan, cx.op("add", x, y), r)


# frexp's bit layout per float dtype computed on: (integer of its width, mantissa bits,
# exponent mask, the exponent field of [0.5, 1), the scale that makes a subnormal normal)
_FREXP = {"f32": ("i32", 23, 0xFF, 126, 24), "f64": ("i64", 52, 0x7FF, 1022, 54)}


@converts(aten.frexp.Tensor)
def _frexp(cx: Ctx, x):
    """x = m 2^e with |m| in [0.5, 1) (module doc): m keeps x's sign and e is int32; 0,
    +-inf and NaN give (x, 0). A subnormal x is first scaled by 2^k to a normal number
    and k taken from e. float16 is computed in float32 (its values, subnormals included,
    are normal there and m fits float16 exactly)."""
    dt = cx.out(0).dtype
    if dt not in ("f16", "f32", "f64"):
        raise Fallback(f"frexp of {dt}")
    work = dt if dt in _FREXP else "f32"
    ity, bits, mask, half, k = _FREXP[work]
    x = cx.cast(x, work)
    smallest = float(np.finfo(dtypes.to_numpy(work)).tiny)
    ax = cx.op("abs", x)
    sub = cx.op("lt", ax, cx.scalar(smallest, work))
    xn = cx.op("select", sub, cx.op("mul", x, cx.scalar(2.0 ** k, work)), x)
    i = cx.op("bitcast", xn, to=ity)
    field = cx.op("bitand", cx.op("shr", i, cx.scalar(bits, ity)), cx.scalar(mask, ity))
    e = cx.op("sub", field, cx.scalar(half, ity))
    e = cx.op("sub", e, cx.op("select", sub, cx.scalar(k, ity), cx.scalar(0, ity)))
    # the sign bit and the mantissa, as the signed integer they make
    keep = -(1 << (int(ity[1:]) - 1)) | ((1 << bits) - 1)
    m_bits = cx.op("bitor", cx.op("bitand", i, cx.scalar(keep, ity)),
                   cx.scalar(half << bits, ity))
    m = cx.op("bitcast", m_bits, to=work)
    special = cx.op("or", cx.op("eq", x, cx.scalar(0.0, work)),
                    cx.op("or", cx.op("isinf", x), cx.op("isnan", x)))
    m = cx.op("select", special, x, m)
    e = cx.op("select", special, cx.scalar(0, ity), e)
    return cx.cast(m, dt), cx.cast(e, "i32")


@converts(aten.angle.default)
def _angle(cx: Ctx, x):
    """The argument of a real number: 0 or pi, NaN kept (module doc)."""
    dt = cx.out().dtype
    if dt not in dtypes.FLOATS:
        raise Fallback(f"angle giving {dt} (complex: braze has no complex dtype)")
    x = cx.cast(x, dt)
    y = cx.op("select", cx.op("lt", x, cx.scalar(0, dt)), cx.scalar(math.pi, dt),
              cx.scalar(0.0, dt))
    return cx.op("select", cx.op("isnan", x), x, y)


@converts(aten.unbind_copy.int)
def _unbind_copy(cx: Ctx, x, dim=0):
    """One unit slice per index along dim, the dim dropped."""
    if x.type.rank == 0:
        raise Fallback("unbind of a 0-d tensor (torch raises)")
    d = norm_dim(dim, x.type.rank)
    return tuple(cx.reshape(slice_dim(cx, x, d, i, 1, 1), cx.out(i).shape)
                 for i in range(x.shape[d]))


@converts(aten.as_strided_scatter.default)
def _as_strided_scatter(cx: Ctx, x, src, size, stride, storage_offset=None):
    """src written over a strided view of x's (row-major) clone (module doc)."""
    from importers.scans import scatter_nd_ir

    fake = cx.arg_vals[0] if cx.arg_vals else None
    if not isinstance(fake, torch.Tensor) or not fake.is_contiguous():
        raise Fallback("as_strided_scatter into a tensor that is not contiguous (its "
                       "clone's storage order is not the IR's)")
    if not x.type.static or not src.type.static:
        raise Fallback("as_strided_scatter with a dynamic shape")
    size, stride = [int(d) for d in size], [int(s) for s in stride]
    pos = np.full(size, int(storage_offset or 0), np.int64)
    for k, (n, s) in enumerate(zip(size, stride)):
        pos += (np.arange(n, dtype=np.int64) * s).reshape(
            [-1 if j == k else 1 for j in range(len(size))])
    if pos.size == 0:
        return x
    if pos.min() < 0 or pos.max() >= x.type.size:
        raise Fallback("as_strided_scatter writes outside its input's elements (torch "
                       "raises)")
    if np.unique(pos).size != pos.size:
        raise Fallback("as_strided_scatter writes one element twice (torch's copy_ "
                       "raises)")
    return scatter_nd_ir(cx, x, cx.reshape(cx.cast(src, x.dtype), tuple(size)), pos)


@converts(aten.diagonal_scatter.default)
def _diagonal_scatter(cx: Ctx, x, src, offset=0, dim1=0, dim2=1):
    """x with its diagonal (x.diagonal(offset, dim1, dim2)) replaced by src: the
    diagonal's flat positions in x's row-major order, in src's order (x's other dims,
    then the diagonal), and one gather as for as_strided_scatter."""
    from importers.scans import scatter_nd_ir
    from importers.scatter import strides

    if not x.type.static or not src.type.static:
        raise Fallback("diagonal_scatter with a dynamic shape")
    shape = x.shape
    rank = len(shape)
    d1, d2 = norm_dim(dim1, rank), norm_dim(dim2, rank)
    offset = int(offset)
    length = max(0, min(shape[d1] - max(0, -offset), shape[d2] - max(0, offset)))
    if length == 0:
        return x
    st = strides(shape)
    others = [k for k in range(rank) if k not in (d1, d2)]
    grids = np.meshgrid(*[np.arange(shape[k], dtype=np.int64) for k in others],
                        np.arange(length, dtype=np.int64), indexing="ij")
    t = grids[-1]
    pos = (t + max(0, -offset)) * st[d1] + (t + max(0, offset)) * st[d2]
    for k, g in zip(others, grids[:-1]):
        pos = pos + g * st[k]
    return scatter_nd_ir(cx, x, cx.reshape(cx.cast(src, x.dtype), pos.shape), pos)


@converts(aten.masked_scatter.default)
def _masked_scatter(cx: Ctx, x, mask, src):
    """x with its masked positions (mask broadcast to x, row-major order) taking src's
    elements in order: the k-th masked position reads src's flat element k, k from an
    inclusive prefix sum of the mask less one (importers/scans.py), one gather. More
    masked positions than src has elements reads past src's end: a run-time index fault,
    raised, as torch raises."""
    from importers.scans import cumsum_ir

    out = cx.out()
    if not x.type.static or not src.type.static or not mask.type.static:
        raise Fallback("masked_scatter with a dynamic shape")
    n, s = int(np.prod(out.shape, dtype=np.int64)), int(np.prod(src.shape, dtype=np.int64))
    if n == 0:
        return cx.cast(x, out.dtype)
    if s == 0:
        raise Fallback("masked_scatter from an empty source")
    m = cx.cast(mask, "bool")
    if tuple(m.shape) != tuple(out.shape):
        m = cx.op("broadcast", m, shape=out.shape)
    m = cx.reshape(m, (n,))
    k = cx.op("sub", cumsum_ir(cx, cx.cast(m, "i64"), 0), cx.scalar(1, "i64"))
    k = cx.op("select", m, k, cx.scalar(0, "i64"))
    taken = cx.op("gather", cx.reshape(cx.cast(src, out.dtype), (s,)), k, axis=0)
    flat = cx.op("select", m, taken, cx.reshape(cx.cast(x, out.dtype), (n,)))
    return cx.reshape(flat, tuple(out.shape))


@converts(aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update(cx: Ctx, x, w, b, running_mean, running_var, momentum, eps):
    """Training-mode batch norm with new running statistics (module doc)."""
    train = CONVERTERS[aten._native_batch_norm_legit_functional.default]
    y, mean, invstd, new_mean, new_var = train(cx, x, w, b, running_mean, running_var,
                                               True, momentum, eps)
    reserve = cx.out(3)
    if reserve.size:
        raise Fallback("batch norm with a non-empty reserve (a cuDNN or MIOpen workspace)")
    empty = cx.const(np.zeros(reserve.shape, dtypes.to_numpy(reserve.dtype)))
    return y, mean, invstd, empty, new_mean, new_var
