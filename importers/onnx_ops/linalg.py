"""Det: the determinant of [..., n, n] matrices, by LU elimination unrolled at import.

The rows are n values of shape [..., 1, n]. Step k (partial pivoting) brings the row of
largest |a[r, k]| among rows k..n-1 to position k by compare-and-swap selects down the
column (each swap flips the sign), then every row below loses f times row k, with
    f = a[r, k] / a[k, k]     (0 where the pivot is 0: the column is all zeros there)
and det = sign * prod_k a[k, k]. Every op is elementwise over the batch, so the whole
determinant is O(n^2) row ops of n elements; n is capped (DET_MAX_N).
"""

from __future__ import annotations

from compiler.errors import InvalidModelError
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext

# Larger matrices are refused: the unrolled elimination is O(n^2) IR ops (row swaps
# and updates), about 200 at n = 8; a big determinant wants a library LU, not this.
DET_MAX_N = 8


def _entry(cx: NodeContext, row, k: int):
    """row[..., 0, k] as [..., 1, 1]."""
    rank = row.type.rank
    return cx.op("slice", row, starts=(0,) * (rank - 1) + (k,), steps=(1,) * rank,
                 sizes=row.shape[:-1] + (1,))


def _pivot(cx: NodeContext, rows: list, k: int, sign):
    """rows with the largest |a[r, k]| (r >= k) moved to k, and the sign of the swaps."""
    for r in range(k + 1, len(rows)):
        swap = cx.op("gt", cx.op("abs", _entry(cx, rows[r], k)),
                     cx.op("abs", _entry(cx, rows[k], k)))
        rows[k], rows[r] = (cx.op("select", swap, rows[r], rows[k]),
                            cx.op("select", swap, rows[k], rows[r]))
        sign = cx.op("select", swap, cx.op("neg", sign), sign)
    return sign


def _eliminate(cx: NodeContext, rows: list, k: int):
    """Subtract multiples of row k from the rows below it; returns the pivot a[k, k]."""
    pivot = _entry(cx, rows[k], k)
    zero = cx.scalar(0, pivot.dtype)
    singular = cx.op("eq", pivot, zero)
    safe = cx.op("select", singular, cx.scalar(1, pivot.dtype), pivot)
    for r in range(k + 1, len(rows)):
        f = cx.op("select", singular, zero, cx.op("div", _entry(cx, rows[r], k), safe))
        rows[r] = cx.op("sub", rows[r], cx.op("mul", f, rows[k]))
    return pivot


@converter("Det", 11)
def convert_det(cx: NodeContext):
    x = cx.x
    if x.type.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise InvalidModelError(f"{cx.describe}: Det of {x.shape}, not [..., n, n]")
    if not x.type.static or x.dtype not in ("f32", "f64"):
        raise Fallback(f"Det of {x.type}: braze takes static float32/float64 matrices")
    n, batch = x.shape[-1], x.shape[:-2]
    if n > DET_MAX_N:
        raise Fallback(f"Det of {n} x {n} matrices (braze unrolls n up to DET_MAX_N = "
                       f"{DET_MAX_N})")
    if n == 0:  # the empty product
        return [cx.op("broadcast", cx.scalar(1, x.dtype), shape=batch)]
    rank = x.type.rank
    rows = [cx.op("slice", x, starts=(0,) * (rank - 2) + (i, 0), steps=(1,) * rank,
                  sizes=batch + (1, n)) for i in range(n)]
    sign = cx.scalar(1, x.dtype)
    det = None
    for k in range(n):
        sign = _pivot(cx, rows, k, sign)
        pivot = _eliminate(cx, rows, k)
        det = pivot if det is None else cx.op("mul", det, pivot)
    return [cx.reshape(cx.op("mul", sign, det), batch)]
