"""Render a cluster's fusion plan as LLVM IR for NVIDIA GPUs, and compile it to PTX.

The same lowering as the CPU's (cpu.py): compiler.passes.fuse.plan decides the kernels,
the ElementEmitter and ops_llvm emit every element, cpu.py's accumulators' rules combine
reductions; only the loop structure is the GPU's. Each kernel of the plan becomes one
`.entry` (LLVM's ptx_kernel calling convention) `k<i>(ptr, ...)` taking one pointer per
buffer it reads, then the one it writes (`Launch.args` lists their slots):

- loop kernels: a grid-stride loop over the root's elements (thread t of the grid writes
  elements t, t + threads, ...);
- row kernels (softmax, layer norm): one block per row (a grid-stride loop over rows).
  Per level of reductions each thread folds a strided share of the row into registers;
  a block reduction (warp shuffles, one partial per warp in shared memory, shuffles again
  in every warp) then gives every thread the row's value; a last strided pass writes
  the row. `row_cached` values (fuse.py) are recomputed in each pass here;
- contraction kernels (matmul): one TILE x TILE output tile per block, operand tiles
  staged through shared memory. Simple and correct, not fast: GEMMs on GPU belong to
  cuBLAS (through torch).

A CudaProgram is the result: PTX plus the data runtime/cuda.py needs to run it (slots,
constants, the intermediates' arena, launches). Nothing here needs a GPU.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from compiler import __version__, dtypes
from compiler.codegen import nvptx
from compiler.codegen.memory import plan_memory
from compiler.codegen.lowering import (arg_take, combine, counted_loop, is_flat,
                                      kernel_leaves, mul_add, reduce_init, store_element,
                                      without)
from compiler.codegen.emitter import (ElementEmitter, broadcast_index, delinearize, i64,
                                      linear_index, scalar_constant)
from compiler.codegen.ops_llvm import I64, llvm_type, needs_libm
from compiler.errors import CompileError
from compiler.ir import Graph, Node, Value
from compiler.ops import Family
from compiler.passes.fuse import FusionPlan, Kernel, plan

PTR = ir.PointerType()
SHARED = 3  # NVPTX address space of shared (per-block) memory
BLOCK = 256  # threads per block of loop and matmul kernels: 8 warps
ROW_BLOCK = 256  # most threads sharing one row; short rows get fewer (whole warps)
MAX_GRID = 65535  # blocks per launch: more than any GPU runs at once; loops cover the rest
TILE = 16  # matmul: TILE x TILE outputs per block, one per thread
MAX_WARPS = 32  # partials per reduction in shared memory (1024 threads, CUDA's maximum)

_LIBRARY = ("library-class op {op}: not compiled by braze for CUDA (cuDNN through torch "
            "is the intended path)")


def refusal(node: Node) -> str | None:
    """Why the CUDA target does not compile `node` beyond what it shares with the CPU's
    (codegen.supports asks this first), or None."""
    if node.op == "scatter":
        return ("scatter at run-time positions: no CUDA kernel yet (the CPU's applies the "
                "updates in order, kernels/scatter.py); runs on the host framework")
    if node.opdef.family in (Family.CONTRACTION, Family.POOL) and node.op != "matmul":
        return _LIBRARY.format(op=node.op)
    for v in node.inputs:
        if needs_libm(node.op, v.dtype):
            reason = nvptx.libdevice_refusal()
            if reason is not None:
                return f"{node.op} on {v.dtype} {reason}"
    return None


@dataclass(frozen=True)
class Launch:
    """One kernel launch: `.entry` name, the slot of each pointer parameter, grid and
    block sizes (1-D; the kernels loop over whatever the grid does not cover)."""

    name: str
    kind: str
    args: tuple[int, ...]
    grid: int
    block: int


@dataclass
class CudaProgram:
    """A cluster compiled for NVIDIA GPUs (runtime/cuda.py loads and runs it).

    Slots number the buffers as a CpuProgram's do (memory.plan_memory): `inputs`, then `outputs` (the
    materialized graph outputs, each once), then `constants` (slot, array), then the
    intermediates at `offsets` (slot -> byte offset) in one arena of `arena_bytes`.
    """

    graph: Graph
    plan: FusionPlan
    arch: str
    slots: dict[Value, int]
    inputs: list[Value]
    outputs: list[Value]
    constants: list[tuple[int, np.ndarray]]
    offsets: dict[int, int]
    arena_bytes: int
    launches: list[Launch]
    llvm_ir: str
    ptx: str

    def describe(self) -> str:
        """One comment line per launch (what each kernel computes, its arguments)."""
        names = {i: v.name for v, i in self.slots.items()}
        lines = [f"// braze cluster {self.graph.name}: {len(self.launches)} kernel(s) "
                 f"for {self.arch}"]
        for launch, k in zip(self.launches, self.plan.kernels):
            args = ", ".join("%" + names[s] for s in launch.args)
            lines.append(f"// {launch.name} ({launch.kind}, grid {launch.grid}, block "
                         f"{launch.block}): {args} -> {' '.join(n.op for n in k.nodes)}")
        return "\n".join(lines) + "\n"


def compile_cuda(graph: Graph, arch: str = nvptx.DEFAULT_ARCH, ptx: str | None = None,
                 cache=None) -> CudaProgram:
    """Render the cluster's fusion plan for NVPTX and compile it to PTX for `arch`."""
    nvptx.check_arch(arch)
    kplan = plan(graph, target="cuda")  # no folded operands: the tiled matmul reads buffers
    consts = [(n.outputs[0], np.ascontiguousarray(n.attrs["value"])) for n in graph.nodes
              if n.op == "const" and n.attrs["value"].size != 1]
    mem = plan_memory(graph, kplan, consts)
    renderer = CudaRenderer(graph, kplan, mem.slots)
    llvm_ir = renderer.render()
    text = _compile(llvm_ir, arch, ptx, cache)
    return CudaProgram(graph, kplan, arch, mem.slots, mem.inputs, mem.outputs, mem.constants,
                       mem.offsets, mem.arena_bytes, renderer.launches, llvm_ir, text)


def _compile(llvm_ir: str, arch: str, ptx: str | None, cache) -> str:
    """PTX for the module, from `cache` (get/put by key) when it has it."""
    version = nvptx.ptx_version(arch, ptx)
    if cache is None:
        return nvptx.compile_ptx(llvm_ir, arch, version)
    key = hashlib.sha256("\0".join([llvm_ir, nvptx.TRIPLE, arch, version,
                                    __version__]).encode()).hexdigest()
    text = cache.get(key)
    if text is None:
        text = nvptx.compile_ptx(llvm_ir, arch, version).encode()
        cache.put(key, text)
    return text.decode()


class CudaRenderer:
    """Builds the NVPTX module of one cluster (`render() -> LLVM IR text`, `launches`)."""

    def __init__(self, graph: Graph, kplan: FusionPlan, slots: dict[Value, int]):
        self.graph, self.plan, self.slots = graph, kplan, slots
        self.module = ir.Module(name=graph.name)
        self.module.triple = nvptx.TRIPLE  # ops_llvm calls libdevice for this target
        self.launches: list[Launch] = []

    def render(self) -> str:
        for i, k in enumerate(self.plan.kernels):
            self._kernel(i, k)
        return str(self.module)

    def _kernel(self, index: int, k: Kernel) -> None:
        values = list(dict.fromkeys(kernel_leaves(k, self.slots) + [k.root]))
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR] * len(values)),
                         f"k{index}")
        fn.calling_convention = "ptx_kernel"
        for arg in fn.args:
            arg.add_attribute("noalias")  # the root never overlaps what the kernel reads
        ptrs = dict(zip(values, fn.args))
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        if k.kind == "contraction":
            grid, block = self._matmul(b, ptrs, k, index)
        elif k.kind == "row":
            grid, block = self._rows(b, ptrs, k, index)
        else:
            grid, block = self._loop(b, ptrs, k)
        b.ret_void()
        self.launches.append(Launch(fn.name, k.kind, tuple(self.slots[v] for v in values),
                                    grid, block))

    # -- loop kernels -------------------------------------------------------------

    def _loop(self, b: ir.IRBuilder, ptrs: dict, k: Kernel) -> tuple[int, int]:
        root = k.root
        flat = is_flat(k)

        def element(b, j):
            em = ElementEmitter(b, without(ptrs, root), flat=flat)
            idx = [j] if flat else delinearize(b, j, root.shape)
            store_element(b, ptrs[root], root.dtype, j, em.at(root, idx))

        tid, ntid = nvptx.sreg(b, "tid.x"), nvptx.sreg(b, "ntid.x")
        ctaid, nctaid = nvptx.sreg(b, "ctaid.x"), nvptx.sreg(b, "nctaid.x")
        start = b.add(b.mul(ctaid, ntid), tid)
        _strided(b, start, i64(root.type.size), b.mul(ntid, nctaid), element)
        return _grid(-(-root.type.size // BLOCK)), BLOCK

    # -- row kernels ----------------------------------------------------------------

    def _rows(self, b: ir.IRBuilder, ptrs: dict, k: Kernel, index: int) -> tuple[int, int]:
        rows = _Rows(k)
        shared = {r: self._shared_arrays(r, index, n) for n, r in enumerate(k.reductions)}
        tid, ntid = nvptx.sreg(b, "tid.x"), nvptx.sreg(b, "ntid.x")

        def row(b, o):
            kept = delinearize(b, o, rows.kept_shape)
            registers: dict[Value, ir.Value] = {}
            for level in k.levels:  # a strided pass per level, then its block reductions
                parts = [_Partial(b, r, tid) for r in level]

                def step(b, j):
                    em = ElementEmitter(b, ptrs, registers)
                    idx = rows.index(b, kept, j)
                    for p in parts:
                        p.update(b, em.at(p.node.inputs[0], idx), j)

                _strided(b, tid, i64(rows.n_red), ntid, step)
                for p in parts:
                    registers[p.node.outputs[0]] = _block_reduce(b, p, shared[p.node], tid,
                                                                 ntid)
            self._row_out(b, ptrs, rows, o, kept, registers, tid, ntid)
            nvptx.barrier(b)  # the next row's reductions reuse the shared arrays

        ctaid, nctaid = nvptx.sreg(b, "ctaid.x"), nvptx.sreg(b, "nctaid.x")
        _strided(b, ctaid, i64(rows.rows), nctaid, row)
        warps = -(-min(max(rows.n_red, 1), ROW_BLOCK) // nvptx.WARP)
        return _grid(rows.rows), warps * nvptx.WARP

    def _row_out(self, b, ptrs: dict, rows: _Rows, o, kept: list, registers: dict, tid,
                 ntid) -> None:
        """Write the root for row o: a last strided pass over the row, or (a reduction, or
        a row-shaped value: fuse.py) one element, by thread 0."""
        k, root = rows.kernel, rows.kernel.root
        em_ptrs = without(ptrs, root)
        if root.shape == k.domain and root not in registers:
            def write(b, j):
                idx = rows.index(b, kept, j)
                store_element(b, ptrs[root], root.dtype, linear_index(b, idx, k.domain),
                              ElementEmitter(b, em_ptrs, registers).at(root, idx))

            _strided(b, tid, i64(rows.n_red), ntid, write)
            return
        with b.if_then(b.icmp_unsigned("==", tid, i64(0))):
            if root in registers:
                x = registers[root]
            else:
                idx = list(kept)
                if root.shape == k.row_shapes()[0] and len(root.shape) == len(k.domain):
                    idx = rows.index(b, kept, i64(0))
                x = ElementEmitter(b, em_ptrs, registers).at(root, idx)
            store_element(b, ptrs[root], root.dtype, o, x)

    def _shared_arrays(self, node: Node, index: int, n: int) -> list:
        """Shared memory for one reduction's per-warp partials (and argmax's indices)."""
        types = [llvm_type(node.inputs[0].dtype)]
        if node.op in ("argmax", "argmin"):
            types.append(I64)
        return [_shared(self.module, f"k{index}_red{n}_{c}", t, MAX_WARPS)
                for c, t in enumerate(types)]

    # -- contraction kernels --------------------------------------------------------

    def _matmul(self, b: ir.IRBuilder, ptrs: dict, k: Kernel, index: int) -> tuple[int, int]:
        node = next(n for n in k.nodes if n.opdef.family is Family.CONTRACTION)
        if node.op != "matmul":
            raise CompileError(f"{node.describe()}: no CUDA kernel for {node.op}")
        mm = _TiledMatmul(b, self.module, ptrs, k, node, index)
        ctaid, nctaid = nvptx.sreg(b, "ctaid.x"), nvptx.sreg(b, "nctaid.x")
        _strided(b, ctaid, i64(mm.tiles), nctaid, mm.tile)
        return _grid(mm.tiles), TILE * TILE


class _TiledMatmul:
    """out[..., r, c] = sum over p of a[..., r, p] * w[..., p, c], one TILE x TILE output
    tile per block, one output per thread; TILE-wide slices of a's rows and w's columns
    are staged through shared memory. The root is that sum, or an elementwise epilogue
    of it (fuse.py), computed from the sum in a register."""

    def __init__(self, b: ir.IRBuilder, module: ir.Module, ptrs: dict, k: Kernel, node: Node,
                 index: int):
        self.ptrs, self.root, self.node = ptrs, k.root, node
        self.a, self.w = node.inputs
        self.m, self.n = self.root.shape[-2:]
        self.depth = self.a.shape[-1]
        self.batch = self.root.shape[:-2]
        self.row_tiles, self.col_tiles = -(-self.m // TILE), -(-self.n // TILE)
        self.tiles = (int(np.prod(self.batch, dtype=np.int64)) * self.row_tiles *
                      self.col_tiles)
        self.t = llvm_type(self.root.dtype)
        self.a_tile = _shared(module, f"k{index}_a", self.t, TILE * TILE)
        self.w_tile = _shared(module, f"k{index}_w", self.t, TILE * TILE)
        tid = nvptx.sreg(b, "tid.x")
        self.ty, self.tx = b.udiv(tid, i64(TILE)), b.urem(tid, i64(TILE))
        self.mine = tid  # = ty * TILE + tx: this thread's slot in a tile
        with b.goto_entry_block():
            self.acc = b.alloca(self.t)
        self.zero = scalar_constant(0, self.root.dtype)

    def tile(self, b: ir.IRBuilder, item) -> None:
        """Output tile `item` (batch-major, then row tiles, then column tiles)."""
        rest = b.udiv(item, i64(self.col_tiles))
        row = b.add(b.mul(b.urem(rest, i64(self.row_tiles)), i64(TILE)), self.ty)
        col = b.add(b.mul(b.urem(item, i64(self.col_tiles)), i64(TILE)), self.tx)
        head = delinearize(b, b.udiv(rest, i64(self.row_tiles)), self.batch)
        row_ok = b.icmp_unsigned("<", row, i64(self.m))
        col_ok = b.icmp_unsigned("<", col, i64(self.n))
        b.store(self.zero, self.acc)
        _strided(b, i64(0), i64(-(-self.depth // TILE)), i64(1),
                 lambda b, kt: self._depth_step(b, kt, head, row, col, row_ok, col_ok))
        with b.if_then(b.and_(row_ok, col_ok)):
            idx = head + [row, col]
            raw = {self.node.outputs[0]: b.load(self.acc, typ=self.t)}
            em = ElementEmitter(b, without(self.ptrs, self.root), raw)
            store_element(b, self.ptrs[self.root], self.root.dtype,
                          linear_index(b, idx, self.root.shape), em.at(self.root, idx))

    def _depth_step(self, b: ir.IRBuilder, kt, head, row, col, row_ok, col_ok) -> None:
        """acc += a[row, kt*TILE : +TILE] . w[kt*TILE : +TILE, col], through the tiles."""
        p_a = b.add(b.mul(kt, i64(TILE)), self.tx)
        p_w = b.add(b.mul(kt, i64(TILE)), self.ty)
        depth = i64(self.depth)
        self._stage(b, self.a_tile, self.a, head, [row, p_a],
                    b.and_(row_ok, b.icmp_unsigned("<", p_a, depth)))
        self._stage(b, self.w_tile, self.w, head, [p_w, col],
                    b.and_(col_ok, b.icmp_unsigned("<", p_w, depth)))
        nvptx.barrier(b)
        s = b.load(self.acc, typ=self.t)
        for p in range(TILE):
            x = self._tile_at(b, self.a_tile, b.add(b.mul(self.ty, i64(TILE)), i64(p)))
            y = self._tile_at(b, self.w_tile, b.add(i64(p * TILE), self.tx))
            s = mul_add(b, self.root.dtype, s, x, y)
        b.store(s, self.acc)
        nvptx.barrier(b)  # every thread is done with the tiles before they are refilled

    def _stage(self, b: ir.IRBuilder, tile, v: Value, head: list, idx: list, ok) -> None:
        """tile[mine] = v[..., idx] where `ok`, else 0 (idx clamped: loads stay in bounds)."""
        idx = [b.select(b.icmp_unsigned("<", i, i64(d)), i, i64(d - 1))
               for i, d in zip(idx, v.shape[-2:])]
        x = ElementEmitter(b, self.ptrs).at(v, broadcast_index(head, v.shape[:-2],
                                                               self.batch) + idx)
        b.store(b.select(ok, x, self.zero), _at(b, tile, self.t, TILE * TILE, self.mine))

    def _tile_at(self, b: ir.IRBuilder, tile, i):
        return b.load(_at(b, tile, self.t, TILE * TILE, i), typ=self.t)


# -- block reductions ----------------------------------------------------------------

class _Rows:
    """A row kernel's index space: rows over the kept dims of its domain, `n_red`
    elements per row over the reduced ones."""

    def __init__(self, k: Kernel):
        self.kernel = k
        self.keep_dims = [d for d in range(len(k.domain)) if d not in k.axes]
        self.kept_shape = tuple(k.domain[d] for d in self.keep_dims)
        self.red_shape = tuple(k.domain[d] for d in k.axes)
        self.rows = int(np.prod(self.kept_shape, dtype=np.int64))
        self.n_red = int(np.prod(self.red_shape, dtype=np.int64))

    def index(self, b: ir.IRBuilder, kept: list, j) -> list:
        """The domain index of element j of the row whose kept indices are `kept`."""
        idx = [None] * len(self.kernel.domain)
        for d, i in zip(self.keep_dims, kept):
            idx[d] = i
        for d, i in zip(self.kernel.axes, delinearize(b, j, self.red_shape)):
            idx[d] = i
        return idx


class _Partial:
    """One reduction of a row kernel: this thread's running value over its strided share
    of the row (argmax/argmin: and its index), and how two partial results combine.

    argmax/argmin keep numpy's choice (first or last extreme, NaN first) across threads:
    a thread starts with index `tid` (its first element, or, past the row's end, an index
    that loses every tie) when the first index wins, -1 when the last does; partials
    combine by value, then by index.
    """

    def __init__(self, b: ir.IRBuilder, node: Node, tid):
        self.node, self.op = node, node.op
        self.dtype = node.inputs[0].dtype
        self.t = llvm_type(self.dtype)
        self.arg = node.op in ("argmax", "argmin")
        self.last = self.arg and node.attrs["select_last"]
        with b.goto_entry_block():  # allocas in the entry block: promoted to registers
            self.acc = b.alloca(self.t)
            self.best = b.alloca(I64) if self.arg else None
        b.store(reduce_init(self.op, self.dtype), self.acc)
        if self.arg:
            b.store(i64(-1) if self.last else tid, self.best)

    def update(self, b: ir.IRBuilder, val, j) -> None:
        cur = b.load(self.acc, typ=self.t)
        if not self.arg:
            b.store(combine(b, self.op, self.dtype, cur, val), self.acc)
            return
        take = arg_take(b, self.node, val, cur, self.dtype)
        b.store(b.select(take, val, cur), self.acc)
        b.store(b.select(take, j, b.load(self.best, typ=I64)), self.best)

    def values(self, b: ir.IRBuilder) -> list:
        vals = [b.load(self.acc, typ=self.t)]
        return vals + [b.load(self.best, typ=I64)] if self.arg else vals

    def identity(self) -> list:
        """The partial of a thread that saw nothing."""
        init = [reduce_init(self.op, self.dtype)]
        return init + [i64(-1 if self.last else np.iinfo(np.int64).max)] if self.arg else init

    def combine(self, b: ir.IRBuilder, mine: list, other: list) -> list:
        if not self.arg:
            return [combine(b, self.op, self.dtype, mine[0], other[0])]
        (v1, i1), (v2, i2) = mine, other
        pred = ">" if self.op == "argmax" else "<"
        prefer = b.icmp_signed(">" if self.last else "<", i2, i1)  # ties: by index
        if self.dtype in dtypes.FLOATS:
            n1, n2 = b.fcmp_unordered("uno", v1, v1), b.fcmp_unordered("uno", v2, v2)
            tie = b.or_(b.fcmp_ordered("==", v1, v2), b.and_(n1, n2))
            take = b.or_(b.and_(n2, b.not_(n1)), b.fcmp_ordered(pred, v2, v1))
        else:
            cmp = b.icmp_signed if self.dtype in dtypes.SIGNED else b.icmp_unsigned
            tie, take = b.icmp_unsigned("==", v1, v2), cmp(pred, v2, v1)
        take = b.or_(take, b.and_(tie, prefer))
        return [b.select(take, v2, v1), b.select(take, i2, i1)]

    def result(self, vals: list):
        return vals[1] if self.arg else vals[0]


def _warp_reduce(b: ir.IRBuilder, part: _Partial, vals: list) -> list:
    """Butterfly over the warp's 32 lanes: every lane ends with the warp's result."""
    lane_mask = nvptx.WARP // 2
    while lane_mask:
        vals = part.combine(b, vals, [nvptx.shfl_xor(b, v, lane_mask) for v in vals])
        lane_mask //= 2
    return vals


def _block_reduce(b: ir.IRBuilder, part: _Partial, arrays: list, tid, ntid):
    """The block's result of one reduction, in every thread (block size: whole warps)."""
    vals = _warp_reduce(b, part, part.values(b))
    lane, warp = b.and_(tid, i64(nvptx.WARP - 1)), b.lshr(tid, i64(5))
    with b.if_then(b.icmp_unsigned("==", lane, i64(0))):
        for arr, v in zip(arrays, vals):
            b.store(v, _at(b, arr, v.type, MAX_WARPS, warp))
    nvptx.barrier(b)
    present = b.icmp_unsigned("<", lane, b.lshr(ntid, i64(5)))
    vals = [b.select(present, b.load(_at(b, arr, ident.type, MAX_WARPS, lane), typ=ident.type),
                     ident) for arr, ident in zip(arrays, part.identity())]
    return part.result(_warp_reduce(b, part, vals))


# -- helpers ----------------------------------------------------------------------------

def _strided(b: ir.IRBuilder, start, end, step, body) -> None:
    """for (i = start; i < end; i += step) body(b, i): the CPU renderer's loop"""
    counted_loop(b, start, end, body, step)


def _grid(blocks: int) -> int:
    return min(max(blocks, 1), MAX_GRID)


def _shared(module: ir.Module, name: str, t: ir.Type, count: int) -> ir.GlobalVariable:
    """A block-shared array of `count` elements of `t`."""
    gv = ir.GlobalVariable(module, ir.ArrayType(t, count), name, addrspace=SHARED)
    gv.type = ir.PointerType(addrspace=SHARED)  # opaque pointers (llvmlite types it)
    gv.linkage = "internal"
    gv.initializer = ir.Constant(gv.value_type, ir.Undefined)
    gv.align = 8
    return gv


def _at(b: ir.IRBuilder, arr, t: ir.Type, count: int, i):
    return b.gep(arr, [i64(0), i], source_etype=ir.ArrayType(t, count), inbounds=True)
