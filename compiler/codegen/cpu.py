"""Render a cluster's fusion plan as one LLVM module for the CPU.

Every kernel of compiler.passes.fuse.plan becomes a loop nest function
`k<i>(ptr bufs, i64 lo, i64 hi)` over rows [lo, hi) of its outer loop;
`run(ptr bufs, i32 threads)` calls the kernels in order, a big enough one through
`braze_parallel(k<i>, table, rows, threads)` (compiler/codegen/parallel.py: the
threads take ranges of its rows), a split recurrence (whose threads meet at
barriers) through `GOMP_parallel` and an OpenMP outlined function that hands each
thread of the team its share. One ctypes call runs the cluster.

Loop kernels (elementwise and movement roots): cpu_loops.py. Row kernels (reductions
with what they read): cpu_rows.py.

`bufs` holds the pointers of the cluster inputs, its outputs, constant
tensors and the intermediates (slots: codegen/memory.py; runtime/cpu.py fills it).
"""

from __future__ import annotations

import os
import re

import numpy as np
from llvmlite import ir

from compiler import dtypes
from compiler.codegen import fpmode, llvm_cpu, mathlib, parallel, row_vectors
from compiler.codegen.cpu_loops import LoopKernels
from compiler.codegen.cpu_rows import RowKernels
from compiler.codegen.emitter import (ElementEmitter, broadcast_index, delinearize, i64,
                                      linear_index, scalar_constant)
from compiler.codegen.faults import FAULTS, FaultWord
from compiler.codegen.kernel_facts import CODE_SIZE as _CODE_SIZE
from compiler.codegen.kernel_facts import ITEMS, PACKED, TEAM, by_columns
from compiler.codegen.kernel_facts import extent as _extent
from compiler.codegen.kernel_facts import may_fault as _may_fault
from compiler.codegen.kernel_facts import row_group as _row_group
from compiler.codegen.kernel_facts import short_rows as _short_rows
from compiler.codegen.kernel_facts import signature as _signature
from compiler.codegen.kernel_facts import transposed_last as _transposed_last
from compiler.codegen.register_ops import REGISTER_OPS
from compiler.codegen.register_ops import buffer_of as _buffer_of
from compiler.codegen.register_ops import operand_kind as _operand_kind
from compiler.codegen.register_ops import operand_vector as _operand_vector
from compiler.codegen.lowering import (counted_loop, is_flat, kernel_leaves, mul_add,
                                       store_element, without)
from compiler.codegen.ops_llvm import I32, I64, llvm_type, storage_type
from compiler.codegen.symbols import declare
from compiler.ir import Graph, Value
from compiler.kernels import (attention, batched, choice, conv, gemm, grouped, inverted,
                              recurrent, scatter, winograd)
from compiler.passes.fuse import Kernel
from compiler.target import Target

PTR = ir.PointerType()
_LOOP_ID = re.compile(r"!llvm\.loop !\d+")
# Render twins anyway and check that they are twins (tests/conftest.py sets it).
VERIFY_TWINS = os.environ.get("BRAZE_VERIFY_TWINS") == "1"
# `run` calls at most this many kernels itself; a longer cluster's calls go in
# never-inlined pieces of this many. LLVM's -O3 is superlinear in one function's size:
# RWKV's 128 time steps unrolled by the ONNX exporter (4 layers: 4498 kernels, 192
# distinct) spent 141 s optimizing the one `run`.
ENTRY_KERNELS = 64


class Renderer(RowKernels, LoopKernels):
    """Builds the LLVM module of one cluster (`render() -> LLVM IR text`)."""

    def __init__(self, graph: Graph, kplan, slots: dict[Value, int], target: Target,
                 profile: bool = False):
        self.graph, self.plan, self.slots = graph, kplan, slots
        # the CPU compiled for (compiler/target.py) and the register tile it gives
        self.target, self.tile = target, gemm.Tile.of(target)
        # profile: the entry is `run_profiled(table, threads, stamps)`, which also writes
        # the CPU's cycle counter before the first kernel and after each (stamps: i64[n+1])
        self.profile = profile
        self.module = ir.Module(name=graph.name)
        mathlib.for_target(self.module, target)
        self._local: dict = {}  # buffer -> index in the kernel being rendered's table
        self._unique: dict[str, tuple] = {}  # kernel text -> (function, outer, mode)
        self._by_signature: dict[tuple, tuple] = {}  # _signature -> the same
        self.verify_twins = VERIFY_TWINS
        self._faults = None  # the faults.FaultWord of the kernel function being rendered
        self._count = 0  # kernels rendered (names k0, k1, ...; twins are dropped)
        self._omp: dict = {}

    def render(self) -> str:
        self._entry([self._kernel(k) for k in self.plan.kernels])
        return str(self.module)

    # -- one kernel ---------------------------------------------------------------

    def _kernel(self, k: Kernel) -> tuple:
        """(function, outer trip count, how it runs threaded (kernel_facts.extent), its
        buffers in table order) for `k`.

        A kernel reads its buffers from a table of its own, so kernels that compute the
        same thing on other buffers (a ResNet's repeated blocks) are one function: LLVM
        compiles each distinct kernel once (compile time follows the distinct shapes).
        A twin is found by its `_signature`, before rendering (building a kernel's IR
        was most of braze's compile time, and half of ResNet-50's kernels are twins);
        with `verify_twins` set, twins are rendered anyway and their text compared.
        """
        values = self._enter(k)
        sig = _signature(k, self._local)
        twin = self._by_signature.get(sig) if sig is not None else None
        if twin is not None and not self.verify_twins:
            return (*twin, values)
        name = f"k{self._count}"
        self._count += 1
        fn, outer, mode = self._nest(self.module, name, k)
        # a loop's metadata node is its own (lowering.LoopID): its number is no difference
        text = _LOOP_ID.sub("!llvm.loop", str(fn).replace(f'@"{name}"', "@k", 1))
        same = self._unique.get(text)
        if twin is not None and (same is None or same[0] is not twin[0]):
            raise AssertionError(f"kernel %{k.root.name} has a twin's signature but not "
                                 f"its code: _signature misses something")
        if same is not None:  # rendered once; a twin's copy leaves the module
            del self.module.globals[name]
            fn = same[0]
        else:
            self._unique[text] = (fn, outer, mode)
        if sig is not None:
            self._by_signature.setdefault(sig, (fn, outer, mode))
        return fn, outer, mode, values

    def _enter(self, k: Kernel) -> list:
        """Make `k` the kernel being rendered (its table indices in `_local`); returns
        its table's values."""
        values = self._values(k)
        self._local = {v: i for i, v in enumerate(values)}
        return values

    def _values(self, k: Kernel) -> list:
        """The buffers in a kernel's own table, in order: what it reads, its root, and
        its packed operands."""
        return kernel_leaves(k, self.slots) + [k.root] + [
            (PACKED, u) for part in k.parts()
            for u in (part.contraction.inputs if part.contraction else [])
            if (PACKED, u) in self.slots] + (
                [FAULTS] if FAULTS in self.slots and _may_fault(k) else [])

    def _emitter(self, b, bufs, registers=None, flat: bool = False) -> ElementEmitter:
        """An element emitter for the kernel being rendered (recording its faults)."""
        return ElementEmitter(b, bufs, registers, flat, faults=self._faults)

    def _nest(self, module: ir.Module, name: str, k: Kernel,
              linkage: str = "internal") -> tuple[ir.Function, int, str | None]:
        """The kernel's function, its outer trip count, and how it runs threaded
        (kernel_facts.extent: ITEMS, TEAM or None)."""
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), name)
        fn.linkage = linkage
        bufs, lo, hi = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        fpmode.ensure(b, self.target.triple, fpmode.flushes(k))
        ptrs = self._buffers(b, bufs, kernel_leaves(k, self.slots) + [k.root])
        self._faults = FaultWord(b) if FAULTS in self._local else None
        root = k.root
        node = k.contraction
        outer, mode = _extent(k)
        impl = k.impl.name if k.impl is not None else None
        if root.type.size == 0:  # an empty dim (an empty batch): nothing to write
            pass
        elif impl == choice.EMPTY_MATMUL:
            inner = root.shape[-1] if root.shape else 1
            counted_loop(b, lo, hi, lambda b, o: self._row_of_loop(
                b, ptrs, k, o, inner, {node.outputs[0]: scalar_constant(0, root.dtype)}))
        elif impl == choice.GEMM:
            shape = choice.shape(node, k.impl)
            a, w = node.inputs
            packed = self._buffers(b, bufs, [(PACKED, w)])[(PACKED, w)]
            after, before, regs = self._tile_hooks(ptrs, k)
            counted_loop(b, lo, hi, lambda b, o: gemm.emit_item(
                b, shape, ptrs[a], packed, ptrs[root], o, after, before, regs))
        elif k.expand is not None:
            self._inverted(b, bufs, ptrs, k, lo, hi)
        elif impl in (choice.GROUPED, choice.WINOGRAD, choice.DIRECT_CONV):
            self._conv(b, bufs, ptrs, k, lo, hi)
        elif impl == choice.BATCHED:
            self._batched(b, ptrs, k, lo, hi)
        elif impl == choice.ATTENTION:
            self._attention(b, ptrs, k, lo, hi)
        elif impl == choice.RECURRENCE:
            self._recurrence(b, bufs, ptrs, k, lo, hi)
        elif impl == choice.SCATTER:  # its operands read through the emitter
            shape, others = choice.shape(node, k.impl), without(ptrs, root)
            counted_loop(b, lo, hi, lambda b, o: scatter.emit_item(
                b, shape, o, node, ptrs[root], lambda b: self._emitter(b, others),
                self._faults))
        elif impl == choice.ROW_MATMUL:
            counted_loop(b, lo, hi, lambda b, o: self._matmul_row(b, ptrs, k, o))
        elif k.kind == "row" and by_columns(k):
            counted_loop(b, lo, hi, lambda b, o: self._column_kernel(b, ptrs, k, o))
        elif k.kind == "row":
            counted_loop(b, lo, hi, lambda b, o: self._row_kernel(b, ptrs, k, o))
        elif (groups := _row_group(k)) is not None:
            counted_loop(b, lo, hi, lambda b, o: self._row_group(b, ptrs, k, o, groups))
        elif is_flat(k):
            work = root.type.size
            counted_loop(b, lo, hi, lambda b, o: self._flat_block(b, ptrs, k, o, work))
        elif (short := _short_rows(k)) is not None:
            counted_loop(b, lo, hi, lambda b, o: self._short_block(b, ptrs, k, o, short))
        else:
            inner = root.shape[-1] if root.shape else 1
            counted_loop(b, lo, hi, lambda b, o: self._row_of_loop(b, ptrs, k, o, inner))
        if self._faults is not None:
            self._faults.flush(b, self._buffers(b, bufs, [FAULTS])[FAULTS])
            self._faults = None
        b.ret_void()
        return fn, outer, mode

    def _buffers(self, b: ir.IRBuilder, bufs, values) -> dict:
        out = {}
        for v in values:
            slot = b.gep(bufs, [i64(self._local[v])], source_etype=PTR, inbounds=True)
            out[v] = b.load(slot, typ=PTR)
        return out

    def _tile_epilogue(self, ptrs, k: Kernel):
        """For a contraction kernel with an epilogue (fuse.py): a function that applies it,
        in place in the root's buffer, to a tile of rows x NR columns just stored there;
        None when the kernel's root is the contraction's own result."""
        if k.root is k.contraction.outputs[0]:
            return None
        n, nr = k.root.shape[-1], self.tile.nr

        def after(b, rows, row0, panel):
            col0 = b.mul(panel, i64(nr))
            left = b.sub(i64(n), col0)
            # whole panels: a constant trip count, vectorized with no remainder loop
            cols = i64(nr) if n % nr == 0 else \
                b.select(b.icmp_signed("<", left, i64(nr)), left, i64(nr))
            # a loop, not unrolled per row: the epilogue is cheap next to the tile, and one
            # copy of it keeps the kernel's code (and LLVM's compile time) small
            counted_loop(b, row0, b.add(row0, i64(rows)),
                         lambda b, row: self._epilogue(b, ptrs, k, row, col0, cols))

        return after

    def _conv(self, b, bufs, ptrs, k: Kernel, lo, hi) -> None:
        """A conv kernel's loop over its work items: Winograd or the direct implicit GEMM,
        as `k.impl` says (`_extent` counts the same items)."""
        node, root = k.contraction, k.root
        x = node.inputs[0]
        extra = [(PACKED, u) for u in node.inputs[1:]]
        packed = self._buffers(b, bufs, extra)
        weight, bias = packed[extra[0]], packed[extra[1]] if len(extra) > 1 else None
        shape = choice.shape(node, k.impl)
        if k.impl.name == choice.GROUPED:
            apply, after = self._channel_hooks(ptrs, k)
            counted_loop(b, lo, hi, lambda b, o: grouped.emit_item(
                b, shape, ptrs[x], weight, bias, ptrs[root], o, apply, after))
        elif k.impl.name == choice.WINOGRAD:
            zeros = b.bitcast(conv.zeros_row(b, shape.cin), PTR)
            epilogue, post = self._winograd_hooks(ptrs, k)
            counted_loop(b, lo, hi, lambda b, o: winograd.emit_item(
                b, shape, ptrs[x], weight, bias, ptrs[root], o, zeros, epilogue, post))
        else:
            after, before, regs = self._tile_hooks(ptrs, k)
            counted_loop(b, lo, hi, lambda b, o: conv.emit_item(
                b, shape, ptrs[x], weight, bias, ptrs[root], o, after, before, regs))

    def _inverted(self, b, bufs, ptrs, k: Kernel, lo, hi) -> None:
        """An expand conv and the depthwise conv reading it (kernels/inverted.py): output
        rows lo..hi, the expanded rows kept in a ring on this thread's stack."""
        e, dw = k.expand.contraction, k.contraction
        keys = [(PACKED, u) for u in e.inputs[1:] + dw.inputs[1:]]
        packed = self._buffers(b, bufs, keys)
        w1, w2 = packed[keys[0]], packed[(PACKED, dw.inputs[1])]
        b1 = packed[keys[1]] if len(e.inputs) > 2 else None
        b2 = packed[(PACKED, dw.inputs[2])] if len(dw.inputs) > 2 else None
        shape = inverted.InvertedShape.of(e, dw, self.tile)
        transform = self._register_epilogue(ptrs, k.expand)
        if transform is None and k.expand.root is not e.outputs[0]:
            raise AssertionError(f"the epilogue of %{k.expand.root.name} is not on registers")
        apply, after = self._channel_hooks(ptrs, k)
        with b.goto_entry_block():
            ring = b.alloca(gemm.F32, size=i64(shape.ring_floats))
            ring.align = 64
            ring.type = PTR  # opaque, as the buffers' pointers (llvmlite types an alloca)
            ready = b.alloca(I64)
        b.store(i64(0), ready)
        counted_loop(b, lo, hi, lambda b, o: inverted.emit_item(
            b, shape, ptrs[e.inputs[0]], w1, b1, w2, b2, ptrs[k.root], o, ring, ready,
            transform, apply, after))

    def _batched(self, b, ptrs, k: Kernel, lo, hi) -> None:
        """A run-time-operand matmul's items (kernels/batched.py): B packed per thread
        through the emitter (its movement ops are index arithmetic), A's rows in place."""
        node = k.contraction
        a, w = node.inputs
        shape = choice.shape(node, k.impl)
        out_batch = k.contraction.outputs[0].shape[:-2]
        pack, last = batched.scratch(b, shape.scratch_floats)
        bufs = {v: p for v, p in ptrs.items() if v is not k.root}

        def entry_index(b, entry, shape_of):
            if not shape.batch:  # B's batch dims are all 1 (A's fold into M)
                return [i64(0)] * len(shape_of)
            return broadcast_index(delinearize(b, entry, out_batch), shape_of, out_batch)

        def read_b(b, entry, kk, col):
            return ElementEmitter(b, bufs).at(w, entry_index(b, entry, w.shape[:-2]) + [kk, col])

        def a_row(b, entry, row):
            if shape.batch:
                head = linear_index(b, entry_index(b, entry, a.shape[:-2]), a.shape[:-2])
                row = b.add(b.mul(head, i64(shape.m)), row)
            return b.gep(ptrs[a], [b.mul(row, i64(shape.k))], source_etype=gemm.F32,
                         inbounds=True)

        after, before, regs = self._tile_hooks(ptrs, k)
        counted_loop(b, lo, hi, lambda b, o: batched.emit_item(
            b, shape, o, pack, last, read_b, a_row, ptrs[k.root], after, before, regs,
            b_rows_inner=_transposed_last(w)))
        batched.release(b, pack)

    def _attention(self, b, ptrs, k: Kernel, lo, hi) -> None:
        """Fused attention's items (kernels/attention.py): q, k, v and the mask read
        through the emitter (movement ops in front of them are index arithmetic); q, v
        and the mask also a vector at a time where their rows are contiguous
        (row_vectors.py)."""
        node = k.contraction
        shape = choice.shape(node, k.impl)
        bufs = {v: p for v, p in ptrs.items() if v is not k.root}
        scores = node.outputs[0].shape[:-1] + (shape.s,)

        def reader(v):
            def read(b, entry, i, j):
                head = delinearize(b, entry, shape.batch)
                return ElementEmitter(b, bufs).at(v, broadcast_index(head + [i, j], v.shape,
                                                                     scores))
            return read

        def vector_reader(v):
            read = row_vectors.reader(v, bufs, shape.tile.vtype)
            if read is None:
                return None
            return lambda b, entry, i, j: read(b, broadcast_index(
                delinearize(b, entry, shape.batch) + [i, j], v.shape, scores))

        names = ["q", "k", "v", "mask"][:len(node.inputs)]
        reads = {name: reader(v) for name, v in zip(names, node.inputs)}
        for name, v in zip(names, node.inputs):
            vector = vector_reader(v) if name != "k" else None  # K is packed transposed
            if vector is not None:  # read(b, entry, i, j): lanes j, j + 1, ... of row i
                reads[name + "_vector"] = vector
        pack, last = attention.scratch(b, shape)
        counted_loop(b, lo, hi, lambda b, o: attention.emit_item(
            b, shape, o, pack, last, reads, ptrs[k.root]))
        batched.release(b, pack)

    def _recurrence(self, b, bufs, ptrs, k: Kernel, lo, hi) -> None:
        """A recurrence's items (kernels/recurrent.py) on its buffers; R read packed when it
        is a constant, peepholes left out when they are constant zeros."""
        from compiler.ops.recurrence import EXTRA

        node = k.contraction
        shape = choice.shape(node, k.impl)
        names = ("xw", "r", "h0", "lens") + EXTRA[shape.cell]
        r = node.inputs[1]
        packed = (PACKED, r) in self._local
        named = {}
        for name, v in zip(names, node.inputs):
            if name == "r" and packed:
                named[name] = self._buffers(b, bufs, [(PACKED, r)])[(PACKED, r)]
            elif not (name == "p" and v.is_const and not np.asarray(v.const_value).any()):
                v = v if v in ptrs else recurrent.source(v)
                named[name] = ptrs[v] if v in ptrs else self._literal(v)
        named["out"] = ptrs[k.root]
        named["faults"] = self._faults  # None where the lengths are constants
        scratch, last = recurrent.scratch(b, shape, packed)
        if shape.split:  # the team shares the one item (lo, hi only launch it)
            recurrent.emit_split(b, shape, scratch, last, named, packed)
        else:
            counted_loop(b, lo, hi, lambda b, o: recurrent.emit_item(
                b, shape, o, scratch, last, named, packed))
        batched.release(b, scratch)

    def _literal(self, v: Value):
        """A constant that has no buffer (one element: codegen inlines those) as an
        internal global, for kernels that read their operands through pointers."""
        value = np.asarray(v.const_value).reshape(-1)
        elem = llvm_type(v.dtype)
        t = ir.ArrayType(elem, value.size)
        g = ir.GlobalVariable(self.module, t, name=f"lit{len(self.module.globals)}")
        g.linkage, g.global_constant = "internal", True
        g.initializer = ir.Constant(t, [x.item() for x in value])
        return g

    def _tile_hooks(self, ptrs, k: Kernel) -> tuple:
        """(after, before, transform) for a tile kernel: its epilogue on the registers
        when it can (`_register_epilogue`), else in place after the store; prefetches."""
        regs = self._register_epilogue(ptrs, k)
        after = None if regs is not None else self._tile_epilogue(ptrs, k)
        return after, self._tile_prefetch(ptrs, k), regs

    def _register_epilogue(self, ptrs, k: Kernel):
        """The epilogue applied to the tile's accumulator vectors before they are stored
        (`_register_apply` per vector); None where it cannot run on registers. With N not
        a multiple of NR, the last panel's vectors past N (never stored) read their
        operands at the row's start, and with N not a multiple of the vector, the one
        vector of the last panel that holds N's last columns reads only the lanes below N
        (a masked load), so every read stays in bounds. (With N = 72, 88 or 120 the
        epilogue ran as a scalar loop over the stored tile instead: MobileNet-v3's 1x1
        convs at half speed.)"""
        apply = self._register_apply(ptrs, k, multiple=1)
        if apply is None:
            return None
        n, t = k.root.shape[-1], self.tile
        # the vector of a panel holding column N - 1 where it is not a whole one
        partial = ((n - 1) % t.nr) // t.vec if n % t.vec else None
        iota = ir.Constant(ir.VectorType(ir.IntType(64), t.vec), list(range(t.vec)))

        def transform(b, rows, row0, col0, vals):
            nv = len(vals) // rows  # the last panel's tile may be narrower (Tile.narrowed)
            out = []
            for r in range(rows):
                start = b.mul(b.add(row0, i64(r)), i64(n))
                for v in range(nv):
                    col = b.add(col0, i64(v * t.vec))
                    off = b.add(start, col)
                    mask = None
                    if v == partial:
                        cols = b.add(gemm.splat(b, col, iota.type), iota)
                        mask = b.icmp_signed("<", cols, gemm.splat(b, i64(n), iota.type))
                    if n % t.nr:
                        inside = b.icmp_signed("<", col, i64(n))
                        col, off = b.select(inside, col, i64(0)), b.select(inside, off, start)
                    out.append(apply(b, vals[r * nv + v], off, col, mask))
            return out

        return transform

    def _register_apply(self, ptrs, k: Kernel, multiple: int | None = None):
        """`apply(b, vec, off, col) -> vec`: the epilogue on one output vector (`vec` floats at
        element offset `off` of the root, channel `col`), where every op is one vector
        instruction (REGISTER_OPS) and every other operand a scalar constant, a buffer of
        the root's shape, or a row of N values broadcast along the rows (bias-like);
        float32, channels a `multiple` of lanes (whole panels by default: the caller
        applies it to whole vectors only otherwise). None otherwise (or when there is no
        epilogue)."""
        root, raw = k.root, k.contraction.outputs[0]
        n = root.shape[-1]
        # the nodes after it computed from its result (before it: a folded operand's;
        # among them, a reshape of an operand, read in its buffer: operand_kind)
        epi, inside = [], {raw}
        for node in k.nodes[k.nodes.index(k.contraction) + 1:]:
            if any(u in inside for u in node.inputs):
                epi.append(node)
                inside.add(node.outputs[0])
            elif node.op != "reshape":
                return None
        if not epi or root.dtype != "f32" or n % (multiple or self.tile.nr):
            return None
        for node in epi:
            if node.op not in REGISTER_OPS or node.outputs[0].dtype != "f32":
                return None
            for u in node.inputs:
                if u not in inside and _operand_kind(u, root, ptrs) is None:
                    return None

        def apply(b, vec, off, col, mask=None):
            env = {raw: vec}
            for node in epi:
                args = [env[u] if u in env else
                        _operand_vector(b, u, root, ptrs, off, col, self.tile.vtype, mask)
                        for u in node.inputs]
                env[node.outputs[0]] = REGISTER_OPS[node.op](b, *args)
            return env[root]

        return apply

    def _channel_hooks(self, ptrs, k: Kernel) -> tuple:
        """(epilogue on a VEC-lane register, epilogue in place over a pixel's stored
        channels) for a grouped conv: it applies the first where it can, else the second;
        both None when the kernel has no epilogue."""
        if k.root is k.contraction.outputs[0]:
            return None, None
        return (self._register_apply(ptrs, k, multiple=1),
                lambda b, pixel, col0, cols: self._epilogue(b, ptrs, k, pixel, col0, cols))

    def _winograd_hooks(self, ptrs, k: Kernel) -> tuple:
        """(epilogue on registers, in-place epilogue after each store) for a Winograd conv:
        at most one of them; both None when the kernel has no epilogue. The register one
        takes a lane mask for a vector across Cout (winograd._output_transform), the
        in-place one the count of its lanes."""
        if k.root is k.contraction.outputs[0]:
            return None, None
        apply = self._register_apply(ptrs, k, multiple=1)
        if apply is not None:
            return apply, None
        return None, lambda b, pixel, col, lanes: self._epilogue(b, ptrs, k, pixel, col,
                                                                 i64(lanes))

    def _tile_prefetch(self, ptrs, k: Kernel):
        """A function that prefetches, before a tile's K loop, the lines of the tile in the
        root's buffer (written) and in the epilogue's other full-shape buffers (read, e.g.
        a residual). Tiles walk down a column panel, so these lines are a large stride
        apart: without the hint each is a cache miss the prefetcher does not see coming
        (measured: ResNet-50's residual epilogues cost ~10 ms a call without it)."""
        root = k.root
        n = root.shape[-1]
        # full-shape operands, each read in its buffer (a reshaped residual: its source's)
        full = (_buffer_of(u, ptrs) for node in k.nodes if node is not k.contraction
                for u in node.inputs if u.shape == root.shape and u is not root)
        reads = [u for u in dict.fromkeys(full) if u in ptrs]

        nr = self.tile.nr

        def before(b, rows, row0, panel):
            col0 = b.mul(panel, i64(nr))
            for r in range(rows):
                base = b.add(b.mul(b.add(row0, i64(r)), i64(n)), col0)
                for v, write in [(root, True)] + [(u, False) for u in reads]:
                    for line in range(0, nr, 64 // dtypes.itemsize(v.dtype)):
                        ptr = b.gep(ptrs[v], [b.add(base, i64(line))],
                                    source_etype=storage_type(v.dtype), inbounds=True)
                        gemm.prefetch(b, ptr, write)

        return before

    def _epilogue(self, b, ptrs, k: Kernel, row, col0, cols) -> None:
        """root[row, col0:col0 + cols] = epilogue(contraction result there), in place: the
        contraction's value is read from the root's own buffer, where its tile now lies."""
        root, raw = k.root, k.contraction.outputs[0]
        bufs = {**without(ptrs, root), raw: ptrs[root]}
        head = delinearize(b, row, root.shape[:-1])
        base = b.mul(row, i64(root.shape[-1]))

        def element(b, j):
            col = b.add(col0, j)
            value = self._emitter(b, bufs).at(root, head + [col])
            store_element(b, ptrs[root], root.dtype, b.add(base, col), value)

        counted_loop(b, i64(0), cols, element)

    def _matmul_row(self, b, ptrs, k: Kernel, o) -> None:
        """Row o of the output: out[o, :] = sum over p of a[o, p] * w[p, :], the inner
        loop over the output's contiguous columns (vectorized; FMA where contracted);
        then the epilogue, if any, over the row."""
        root = k.root
        a, w = k.contraction.inputs
        n_cols, depth = root.shape[-1], a.shape[-1]
        head = delinearize(b, o, root.shape[:-1])  # batch dims..., row
        base = b.mul(o, i64(n_cols))
        zero = scalar_constant(0, root.dtype)
        counted_loop(b, i64(0), i64(n_cols), lambda b, j: store_element(
            b, ptrs[root], root.dtype, b.add(base, j), zero))
        em = self._emitter(b, ptrs)

        def depth_step(b, p):
            a_idx = broadcast_index(head[:-1], a.shape[:-2], root.shape[:-2]) + [head[-1], p]
            a_val = em.load(a, a_idx)

            def col(b, j):
                w_idx = broadcast_index(head[:-1], w.shape[:-2], root.shape[:-2]) + [p, j]
                ptr = b.gep(ptrs[root], [b.add(base, j)], source_etype=llvm_type(root.dtype),
                            inbounds=True)
                acc = b.load(ptr, typ=llvm_type(root.dtype))
                b.store(mul_add(b, root.dtype, acc, a_val, em.load(w, w_idx)), ptr)

            counted_loop(b, i64(0), i64(n_cols), col)

        counted_loop(b, i64(0), i64(depth), depth_step)
        if root is not k.contraction.outputs[0]:
            self._epilogue(b, ptrs, k, o, i64(0), i64(n_cols))

    # -- the entry point ------------------------------------------------------

    def _outlined(self, nest: ir.Function, outer: int) -> ir.Function:
        """void f(ptr table): this OpenMP thread's share of rows [0, outer) (a TEAM
        kernel's: a split recurrence takes its part by its own thread number)."""
        if (nest.name, outer) in self._omp:
            return self._omp[nest.name, outer]
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR]),
                         f"{nest.name}.omp{len(self._omp)}")
        self._omp[nest.name, outer] = fn
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        tid = b.sext(b.call(self._decl("omp_get_thread_num", I32, []), []), I64)
        nth = b.sext(b.call(self._decl("omp_get_num_threads", I32, []), []), I64)
        chunk = b.sdiv(b.add(i64(outer), b.sub(nth, i64(1))), nth)
        lo = b.mul(tid, chunk)
        hi = b.add(lo, chunk)
        lo = b.select(b.icmp_signed(">", lo, i64(outer)), i64(outer), lo)
        hi = b.select(b.icmp_signed(">", hi, i64(outer)), i64(outer), hi)
        saved = fpmode.save(b, self.target.triple)  # an OpenMP thread is not braze's
        b.call(nest, [fn.args[0], lo, hi])
        fpmode.restore(b, self.target.triple, saved)
        b.ret_void()
        return fn

    def _decl(self, name: str, ret, args):
        return declare(self.module, name, ret, args)

    def _entry(self, nests) -> None:
        """`run(bufs, threads)` (`run_profiled(bufs, threads, stamps)`): the kernels in
        order, each on its own table, with the caller's float mode saved and restored.
        Past ENTRY_KERNELS kernels the calls go in never-inlined pieces of that many."""
        args = [PTR, I32] + ([PTR] if self.profile else [])
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), args),
                         "run_profiled" if self.profile else "run")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        saved = fpmode.save(b, self.target.triple)  # each kernel sets its own
        if self.profile:
            self._stamp(b, fn, 0)
        if len(nests) > ENTRY_KERNELS:
            for start in range(0, len(nests), ENTRY_KERNELS):
                piece = ir.Function(self.module, ir.FunctionType(ir.VoidType(), args),
                                    f"{fn.name}.{start // ENTRY_KERNELS}")
                piece.linkage = "internal"
                piece.attributes.add("noinline")
                pb = ir.IRBuilder(piece.append_basic_block("entry"))
                self._calls(pb, piece, nests[start:start + ENTRY_KERNELS], start)
                pb.ret_void()
                b.call(piece, list(fn.args))
        else:
            self._calls(b, fn, nests, 0)
        fpmode.restore(b, self.target.triple, saved)
        b.ret_void()

    def _stamp(self, b: ir.IRBuilder, fn: ir.Function, j: int) -> None:
        """stamps[j] = the cycle counter (a profiled run)."""
        now = b.call(self._decl("llvm.readcyclecounter", I64, []), [])
        b.store(now, b.gep(fn.args[2], [i64(j)], source_etype=I64, inbounds=True))

    def _calls(self, b: ir.IRBuilder, fn: ir.Function, nests, start: int) -> None:
        """In `fn` (run's arguments), each nest's call on its own table, threaded as its
        mode says (stamp start + 1, ... after each in a profiled run)."""
        bufs, threads = fn.args[:2]
        teams = any(mode == TEAM for _, _, mode, _ in nests) and llvm_cpu.libgomp()
        gomp = self._decl("GOMP_parallel", ir.VoidType(),
                          [PTR, PTR, I32, I32]) if teams else None
        share = self._decl(parallel.PARALLEL, ir.VoidType(), [PTR, PTR, I64, I32])

        def stamp(j: int) -> None:
            if self.profile:
                now = b.call(self._decl("llvm.readcyclecounter", I64, []), [])
                b.store(now, b.gep(fn.args[2], [i64(j)], source_etype=I64, inbounds=True))

        for j, (nest, outer, mode, values) in enumerate(nests, start=start + 1):
            table = self._table(b, bufs, values)
            if mode == ITEMS or (mode == TEAM and gomp is not None):
                many = b.icmp_signed(">", threads, ir.Constant(I32, 1))
                with b.if_else(many) as (then, otherwise):
                    with then:
                        if mode == ITEMS:
                            b.call(share, [nest, table, i64(outer), threads])
                        else:
                            b.call(gomp, [self._outlined(nest, outer), table, threads,
                                          ir.Constant(I32, 0)])
                    with otherwise:
                        b.call(nest, [table, i64(0), i64(outer)])
            else:
                b.call(nest, [table, i64(0), i64(outer)])
            if self.profile:
                self._stamp(b, fn, j)

    def _table(self, b: ir.IRBuilder, bufs, values: list):
        """A kernel's own pointer table: its buffers' pointers, copied from `bufs`."""
        with b.goto_entry_block():
            table = b.alloca(PTR, size=i64(len(values)))
        for i, v in enumerate(values):
            src = b.gep(bufs, [i64(self.slots[v])], source_etype=PTR, inbounds=True)
            dst = b.gep(table, [i64(i)], source_etype=PTR, inbounds=True)
            b.store(b.load(src, typ=PTR), dst)
        return table


class SplitRender:
    """One cluster's kernels cut into `parts` LLVM modules that compile separately (at the
    same time, in compiled.py) and are loaded together. Kernels are grouped by signature
    first (twins share one function, as in `Renderer`), then the groups are dealt to the
    parts by an estimate of their code size; part 0 also holds the entry `run`, which
    calls the other parts' functions by their exported names `<tag>.k<group>` (`tag`
    makes them unique to this cluster's code)."""

    def __init__(self, graph: Graph, kplan, slots: dict[Value, int], target: Target, tag: str,
                 parts: int = 2):
        self.graph, self.plan, self.slots, self.tag = graph, kplan, slots, tag
        self.target = target
        probe = Renderer(graph, kplan, slots, target)
        self.tile = probe.tile
        self.group: list[int] = []  # kernel index -> its group
        self.first: list[int] = []  # group -> its first kernel's index
        seen: dict[tuple, int] = {}
        for i, k in enumerate(kplan.kernels):
            probe._enter(k)
            sig = _signature(k, probe._local)
            g = seen.get(sig) if sig is not None else None
            if g is None:
                g = len(self.first)
                self.first.append(i)
                if sig is not None:
                    seen[sig] = g
            self.group.append(g)
        load = [0.0] * parts
        self.owner = [0] * len(self.first)
        for g in sorted(range(len(self.first)), key=lambda g: -self._size(g)):
            self.owner[g] = min(range(parts), key=load.__getitem__)
            load[self.owner[g]] += self._size(g)
        self.parts = parts

    @property
    def groups(self) -> int:
        return len(self.first)

    def _size(self, g: int) -> float:
        """A rough relative size of group g's code (Winograd and direct convs render the
        most: transforms, micro-kernels and their tails)."""
        impl = self.plan.kernels[self.first[g]].impl
        if impl is None:
            return 1.0
        return _CODE_SIZE.get(impl.name, 2.0)

    def render(self, part: int) -> str:
        """LLVM IR of one part: its groups' functions (exported), and for part 0 the
        entry, with the other parts' functions declared."""
        r = Renderer(self.graph, self.plan, self.slots, self.target)
        kernels = self.plan.kernels
        fns: dict[int, ir.Function] = {}
        for g, i in enumerate(self.first):
            name = f"{self.tag}.k{g}"
            if self.owner[g] == part:
                r._enter(kernels[i])
                fns[g] = r._nest(r.module, name, kernels[i], linkage="external")[0]
            elif part == 0:
                fns[g] = ir.Function(r.module, ir.FunctionType(ir.VoidType(),
                                                               [PTR, I64, I64]), name)
        if part == 0:
            r._entry([(fns[g], *_extent(kernels[self.first[g]]), r._values(k))
                      for k, g in zip(kernels, self.group)])
        return str(r.module)
