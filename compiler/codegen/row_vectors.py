"""A value's lanes along its last axis as one vector: the elemental emitter, widened.

`reader(v, buffers, vtype)` gives `read(b, idx) -> vector` of v[idx], v[idx + 1 on the
last axis], ... (vtype's lane count of them; the caller keeps them inside the last
axis), or None where that is not one vector load per leaf. It is when every op between
v and its buffers keeps the last axis contiguous:

  elementwise float32 ops of REGISTER_OPS      lanes combine lane by lane
  transpose with the last axis last             lane j reads the operand's lane j
  reshape from a buffer, or whose input's last  row-major offsets of consecutive lanes
  dim is a multiple of its output's             are consecutive (the last group of dims
                                                keeps the lanes in one input row)
  slice with step 1 on the last axis            an offset run of the operand's lanes
  gather on another axis, broadcast keeping     the indices (scalars, read by the plain
  the last dim                                  emitter) pick the row, the lanes run on

and a value whose last dim is 1 (or a scalar) is read once by the plain emitter and
splat. The fused attention kernel reads its query rows, its values and its mask so
(kernels/attention.py): a query or value row behind Swin's head split (reshape,
transpose, gather of a QKV product) or a mask made of a bias and a window mask was 16
scalar reads, index arithmetic and inserts per vector before.
"""

from __future__ import annotations

from llvmlite import ir

from compiler.codegen.emitter import ElementEmitter, linear_index
from compiler.codegen.register_ops import REGISTER_OPS
from compiler.ir import Value
from compiler.kernels import gemm


def refusal(v: Value, buffers: dict) -> str | None:
    """None if v's lanes along its last axis read as vectors (module docstring), else
    why not."""
    seen: dict[Value, str | None] = {}

    def check(u: Value) -> str | None:
        if u not in seen:
            seen[u] = _refusal_at(u, buffers, check)
        return seen[u]

    return check(v)


def _refusal_at(u: Value, buffers: dict, check) -> str | None:
    if u.dtype != "f32":
        return f"%{u.name} is {u.dtype}"
    if not u.shape or u.shape[-1] == 1:
        return None  # one element per row: the plain emitter's, splat
    if u in buffers:
        return None
    p = u.producer
    if p is None or p.op == "const":
        return f"%{u.name} has no buffer"
    last = len(u.shape) - 1
    if p.op in REGISTER_OPS:
        return next((why for w in p.inputs if (why := check(w))), None)
    x = p.inputs[0]
    if p.op == "transpose" and p.attrs["perm"][-1] != last:
        return "a transpose moves the last axis"
    if p.op == "reshape" and x not in buffers and (not x.shape or x.shape[-1] % u.shape[-1]):
        return "a reshape splits the lanes across rows of its input"
    if p.op == "slice" and p.attrs["steps"][-1] != 1:
        return "a strided slice of the last axis"
    if p.op == "gather" and p.attrs["axis"] % len(x.shape) == len(x.shape) - 1:
        return "a gather on the last axis"
    if p.op == "broadcast" and x.shape and x.shape[-1] not in (1, u.shape[-1]):
        return "a broadcast of the last axis"
    if p.op not in ("transpose", "reshape", "slice", "gather", "broadcast"):
        return f"{p.op} is not read as vectors"
    if p.op == "reshape" and x in buffers:
        return None
    return check(x)


class VectorEmitter(ElementEmitter):
    """ElementEmitter whose values are vectors of `vtype` along the last axis; movement
    ops keep the base class's index maps (they move lane 0's index)."""

    def __init__(self, b: ir.IRBuilder, buffers: dict, vtype: ir.VectorType):
        super().__init__(b, buffers)
        self.vtype = vtype
        self.scalar = ElementEmitter(b, buffers)

    def index_at(self, v: Value, idx: list):
        return self.scalar.at(v, idx)

    def _reads_flat(self, v: Value) -> bool:
        return False  # its values are vectors along the last axis: reshapes map lane 0

    def load(self, v: Value, idx: list, base=None):
        off = linear_index(self.b, idx, v.shape)
        ptr = self.b.gep(self.buffers[v] if base is None else base, [off],
                         source_etype=gemm.F32, inbounds=True)
        return self.b.load(self.b.bitcast(ptr, self.vtype.as_pointer()), typ=self.vtype,
                           align=4)

    def _emit(self, v: Value, idx: list):
        if not v.shape or v.shape[-1] == 1:
            return gemm.splat(self.b, self.scalar.at(v, idx), self.vtype)
        p = v.producer
        if v not in self.buffers and p.op in REGISTER_OPS:
            args = [self.at(u, self._operand_index(idx, u, v)) for u in p.inputs]
            return REGISTER_OPS[p.op](self.b, *args)
        return super()._emit(v, idx)


def reader(v: Value, buffers: dict, vtype: ir.VectorType):
    """`read(b, idx) -> vector` of v's lanes from index idx along its last axis, or None
    (`refusal`)."""
    if refusal(v, buffers) is not None:
        return None
    return lambda b, idx: VectorEmitter(b, buffers, vtype).at(v, idx)
