"""`torch.compile(model, backend="braze")`: the PyTorch path, inference and training.

Registered through the `torch_dynamo_backends` entry point, so no import of braze
is needed. The backend is thin: AOTAutograd turns dynamo's graph
into functional aten graphs decomposed to the core aten op set (forward and
backward for training, one inference graph under no_grad); each becomes a
`GraphRunner` that specializes per concrete input signature at call time:
importers.fx -> passes -> clustering with the target's codegen -> an
Executable whose compiled clusters run braze kernels (numpy arrays) and whose
host clusters run eager torch (runtime/fallback_torch.py), in one callable.

Example inputs may be fake tensors and SymInts: only their metadata is read.

Freezing (option freeze, default True): in inference graphs, the inputs that
AOTAutograd reports as static (parameters and buffers) become IR constants at
the first call, so constant folding, batch-norm folding and weight packing apply,
as inductor's freezing does. In a forward graph (gradients on) they do once they
held still for STEADY_CALLS calls (SteadyWeightsRunner): an eval model called without
no_grad gets the compiled convolutions, a training loop keeps weights as inputs.
Each call checks the frozen tensors' storage, version counters and a sampled
fingerprint of their values (bridge/frozen.py); a change (an optimizer step,
load_state_dict, an update through `.data`) recompiles rather than run stale weights.

Never breaks the user's program: an exception in braze's compile or run logs a
WARNING on logger "braze" and runs that graph eagerly (option strict=True raises
instead); nodes left to torch are logged at INFO with their op and reason. A graph
holding a tensor of a dtype braze's IR has no type for (complex32) runs on torch as a
whole, logged at INFO (an error only with allow_fallback=False).
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import operator
import os
import threading

import numpy as np
import torch

from bridge.frozen import FrozenWeights
from bridge.options import TorchOptions
from bridge.specializations import SpecializationCache
from bridge.steps import Part, Steps
from compiler import driver
from compiler.errors import BrazeError
from compiler.ir import Graph
from compiler.passes.padding import PaddingRefused

log = logging.getLogger("braze")

# torch.compile's modes: accepted; braze's pipeline is the same for all of them.
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

_graph_ids = itertools.count()


def braze(gm: torch.fx.GraphModule, example_inputs, *, options: dict | None = None,
          mode: str | None = None, **kwargs):
    """The torch.compile backend: `(gm, example_inputs) -> callable`."""
    if kwargs:
        raise BrazeError(f"unknown argument(s) {', '.join(sorted(kwargs))} to the braze "
                         "backend; pass braze's settings as options={...}")
    if mode not in MODES:
        raise BrazeError(f"unknown mode {mode!r}; torch.compile modes are "
                         f"{', '.join(m for m in MODES if m)}")
    opts = TorchOptions.from_dict(options)
    if opts.fast_guards:
        use_fast_guards()
    if (why := check_for_skip(example_inputs, opts)) is not None:
        log.info("braze: running graph eagerly: %s", why)
        return gm.forward
    from importers.fx_resize import route_interpolate
    from importers.fx_rnn import route_recurrent

    route_recurrent(gm)  # LSTM/GRU/RNN as one op each, not unrolled cells (gradients off)
    route_interpolate(gm)  # F.interpolate as one op, not indexing (gradients off)
    try:
        return _aot(opts)(gm, example_inputs)
    except _DYNAMO_CONTROL_FLOW:
        raise
    except Exception as e:
        if opts.strict:
            raise
        log.warning("braze: AOTAutograd could not trace the graph (%s: %s); running it "
                    "eagerly", type(e).__name__, e)
        return gm.forward


def use_fast_guards() -> None:
    """Turn on dynamo's recursive dict-tag guards (torch._dynamo.config
    use_recursive_dict_tags_for_guards, off in torch by default): a module tree whose
    dicts kept their version tags is passed by one check per tree instead of a walk
    over every submodule and weight. Guards are built after the backend returns, so
    this graph's guards already use it. Measured on efficientnet_b0 (~360 weights),
    the guards cost ~0.5-0.9 ms per call once braze's kernels have evicted them from
    cache, ~0.3 ms less with the tags. Global to the process (dynamo has no
    per-backend setting), logged once; option fast_guards=False leaves it alone."""
    import torch._dynamo.config as dynamo_config

    if getattr(dynamo_config, "use_recursive_dict_tags_for_guards", True):
        return  # on already (or a torch without the setting: nothing to do)
    dynamo_config.use_recursive_dict_tags_for_guards = True
    log.info("braze: turned on torch._dynamo.config.use_recursive_dict_tags_for_guards "
             "(per-call guard cost; options={'fast_guards': False} leaves it off)")


def check_for_skip(example_inputs, opts: TorchOptions) -> str | None:
    """Why braze will not compile this graph at all (None: it will try). Reads metadata."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return f"an input is on {x.device}, braze's target is {opts.target}"
        if isinstance(x, torch.Tensor) and (x.is_sparse or x.is_quantized or x.is_nested):
            return "an input is a sparse, quantized or nested tensor"
    return None


def _dynamo_control_flow() -> tuple:
    from torch._dynamo import exc

    return tuple(getattr(exc, n) for n in ("RestartAnalysis", "TensorifyScalarRestartAnalysis")
                 if hasattr(exc, n))


_DYNAMO_CONTROL_FLOW = _dynamo_control_flow()


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    """The core aten op set (torch._decomp): what importers/fx.py converts."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    # torch's decomposition of this op returns the attention weights ([N, H, L, S])
    # where the op returns its logsumexp ([N, H, L]), which the op's backward reads
    # (training gradients came out wrong), and its math is not the kernel's (2e-5
    # apart on OpInfo's inputs). torch says inductor must not use it; nor does braze:
    # the op runs on torch's own CPU kernel, as a host node.
    table.pop(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    # torch decomposes roll into index_select with a computed index (a gather in
    # braze's IR, an index load per element); importers/fx_movement.py converts it
    # into two slices and a concat, index arithmetic the consumer absorbs (Swin's
    # shifted windows: 12 rolls of 56x56x96 and smaller activations per call).
    table.pop(torch.ops.aten.roll.default, None)
    # torch decomposes select_scatter (functionalized `out[:, t] = h`) into where(arange ==
    # t, h expanded, out): every element then computes h and selects, and a loop of such
    # writes chains the selects (RWKV: 28 of them a kernel, 102 ms of 113). The importer
    # converts the op itself into a gather from concat(out, h), which the identities
    # rule constant_gather turns, chained, into one concat of the rows.
    table.pop(torch.ops.aten.select_scatter.default, None)
    return table


def _aot(opts: TorchOptions):
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_compiler("forward", opts),
                        bw_compiler=_compiler("backward", opts),
                        inference_compiler=_compiler("inference", opts),
                        decompositions=decompositions())


def _compiler(kind: str, opts: TorchOptions):
    """An AOTAutograd compiler: aten graph -> boxed callable (compiles at call time)."""
    from torch._functorch.aot_autograd import make_boxed_func

    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        name = f"g{next(_graph_ids)}_{kind}"
        weights = static_inputs() if kind != "backward" else ()
        static = weights if opts.freeze else ()
        if kind == "forward" and static:
            return make_boxed_func(SteadyWeightsRunner(gm, name, static, opts))
        return make_boxed_func(GraphRunner(gm, name, static, opts,
                                           buckets=kind == "inference", weights=weights))

    return compile_graph


def static_inputs() -> tuple[int, ...]:
    """Indices of the graph's parameter and buffer inputs, as AOTAutograd reports them."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return tuple(getattr(meta, "static_input_indices", None) or ())


class GraphRunner:
    """One aten graph: compiled per input signature at call time, eager on refusal."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, static: tuple, opts: TorchOptions,
                 buckets: bool = False, check_weights: bool = True, weights: tuple = ()):
        from bridge.torch_dynamic import LengthSymbol

        self.gm = gm
        self.name = name
        self.static = frozenset(static)
        # the module's parameters and buffers among the inputs, frozen or not (those not
        # frozen are left where an optimizer's updates favour torch: importers.fx)
        self.weights = frozenset(weights) | self.static
        self.opts = opts
        self.dynamic = _is_dynamic(gm)
        self._specs = SpecializationCache()
        # None: no frozen weights, or a caller that checks them (SteadyWeightsRunner)
        self._frozen = FrozenWeights(self.static) if self.static and check_weights else None
        self._dynamic_order: dict[int, tuple] = {}  # argument count -> non-static indices
        # the symbolic length of a dynamic inference graph, run in power-of-two buckets
        # (bridge/torch_dynamic.py); None: every shape compiles exactly
        self.length = (LengthSymbol.of(gm) if buckets and self.dynamic
                       and opts.dynamic != "off" else None)
        self.compiles = 0  # specializations built (exact and buckets)

    def __call__(self, *args):
        key, why = self._signature(args)
        spec, n, used = (None, None, key) if why else self._padded(key, args)
        if spec is None and not why:
            spec = self._specialization(key, args)
        if spec is None:
            return self.gm(*args)
        try:
            return spec.run(args) if n is None else spec.run(args, n)
        except Exception as e:
            if self.opts.strict:
                raise
            log.warning("braze: graph %s failed at run time (%s: %s); running it eagerly "
                        "from now on", self.name, type(e).__name__, e)
            with self._specs.lock:
                self._specs.put(used, None)
            return self.gm(*args)

    def _signature(self, args) -> tuple[tuple, str | None]:
        """The specialization key: each non-frozen input's shape and dtype (or value);
        frozen weights (a model's hundreds) are left to bridge/frozen.py, and not visited
        here (per call, on cold caches, visiting them cost ~0.2 ms on ResNet-50)."""
        n = len(args)
        order = self._dynamic_order.get(n)
        if order is None:
            order = self._dynamic_order[n] = tuple(i for i in range(n) if i not in self.static)
        key = [n]
        for i in order:
            a = args[i]
            if isinstance(a, torch.Tensor):
                # is_cpu, not device.type: building a torch.device cost ~25 us per call
                # on cold caches
                if not a.is_cpu:
                    return (), f"input {i} is on {a.device}"
                key.append((a.shape, a.dtype))
            else:
                key.append(a)
        return tuple(key), None

    def _padded(self, key: tuple, args) -> tuple:
        """(a bucket's PaddedRun, n, its key) when this call runs padded, else (None,
        None, key)."""
        from bridge.dynamic import bucket_of

        n = None if self.length is None else self.length.length(args)
        if n is None:
            return None, None, key
        length = bucket_of(n)
        bkey = self.length.signature(args, length, self._dynamic_order[len(args)])
        with self._specs.lock:
            if self._specs.get(bkey) is None:  # refused before (or failed at run time)
                return None, None, key  # (_specialization checks the frozen weights)
            self._check_frozen(args)
            try:
                return self._specs.get_or_build(bkey, lambda: self._bucket(args, length)), \
                    n, bkey
            except Exception as e:  # PaddingRefused, or the bucket failed to compile
                if self.opts.strict and not isinstance(e, PaddingRefused):
                    raise
                log.info("braze: graph %s: length %d compiles exactly: padding to %d "
                         "refused: %s", self.name, n, length, e)
                self._specs.put(bkey, None)
                return None, None, key

    def _bucket(self, args, length: int):
        from bridge.torch_dynamic import PaddedRun

        log.info("braze: compiling graph %s for lengths up to %d", self.name, length)
        run = PaddedRun(self, self.length, args, length)
        self.compiles += 1
        return run

    def _specialization(self, key: tuple, args):
        with self._specs.lock:
            self._check_frozen(args)
            return self._specs.get_or_build(key, lambda: self._compile(args))

    def _check_frozen(self, args) -> None:
        """Frozen weights changed since they were compiled in (bridge/frozen.py: storage,
        version counters, a sampled fingerprint): drop every specialization."""
        if self._frozen is not None and self._frozen.changed(args):
            log.info("braze: frozen weights of graph %s changed; compiling it again", self.name)
            self.drop()

    def drop(self) -> None:
        """Forget every specialization (its frozen weights are stale)."""
        with self._specs.lock:
            self._specs.clear()

    def _compile(self, args):
        from compiler import gc_paused
        from importers.fx import UnrepresentableGraph

        try:
            with gc_paused():
                spec = _Specialization(self, args)
                self.compiles += 1
                return spec
        except UnrepresentableGraph as e:
            if self.opts.allow_fallback:  # a limit of braze's IR, not a failure: INFO
                log.info("braze: graph %s runs on torch: %s", self.name, e)
                return None
            error = driver.refused(str(e))
            if self.opts.strict:
                raise error from None
            log.warning("braze: could not compile graph %s (%s); running it eagerly",
                        self.name, error)
            return None
        except Exception as e:
            if self.opts.strict:
                raise
            log.warning("braze: could not compile graph %s (%s: %s); running it eagerly",
                        self.name, type(e).__name__, e)
            return None


# A forward graph (gradients on) freezes its weights once they held still for
# STEADY_CALLS calls in a row: an eval-mode model called without no_grad then runs the
# inference code (host convolutions and unfolded batch norms otherwise: 2-3x slower).
# A training loop changes them at every step and never freezes; after MAX_THAWS thaws
# (weights changed while frozen: a compile wasted each time) the graph stops trying.
STEADY_CALLS = 2
MAX_THAWS = 2


class SteadyWeightsRunner:
    """AOTAutograd's forward graph of a model called with gradients on: its parameters
    and buffers (`static`) are inputs an optimizer may change at every step. Runs with
    the weights as inputs (`unfrozen`) until they hold still, then frozen as
    constants (`frozen`, compiled then). Each call checks them (bridge/frozen.py); a
    change while frozen drops the frozen code. The frozen graph computes the same
    outputs, the tensors saved for backward included, so gradients are unchanged."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, static: tuple, opts: TorchOptions):
        self.name = name
        self.weights = FrozenWeights(static)
        self.unfrozen = GraphRunner(gm, name, (), opts, weights=static)
        self.frozen = GraphRunner(gm, f"{name}_frozen", static, opts, check_weights=False)
        self.calls = self.steady = self.thaws = 0
        self._lock = threading.Lock()

    def __call__(self, *args):
        with self._lock:  # once given up (MAX_THAWS), the weights are not even looked at
            use_frozen = self.thaws < MAX_THAWS and self._steady_now(args)
        return (self.frozen if use_frozen else self.unfrozen)(*args)

    def _steady_now(self, args) -> bool:
        """Whether the weights held still for STEADY_CALLS calls, this one included; a
        change while frozen is a thaw (the frozen code is dropped)."""
        changed = self.weights.changed(args)
        if changed and self.steady >= STEADY_CALLS:
            self.thaws += 1
            log.info("braze: weights of graph %s changed while frozen (%d of %d); "
                     "running it with weights as inputs", self.name, self.thaws, MAX_THAWS)
            self.frozen.drop()
        self.steady = 0 if changed or self.calls == 0 else self.steady + 1
        self.calls += 1
        return self.steady >= STEADY_CALLS and self.thaws < MAX_THAWS


def _is_dynamic(gm: torch.fx.GraphModule) -> bool:
    """Whether any placeholder has symbolic sizes (dynamic=True, or dynamo's automatic
    dynamic shapes): such graphs get concrete fake values per call."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
                not isinstance(d, int) for d in v.shape)):
            return True
    return False


def concrete_vals(gm: torch.fx.GraphModule, args) -> dict:
    """Fake values of every node for these concrete inputs (metadata only, no data)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fake = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a
            for a in args]
    vals: dict = {}

    class _Prop(torch.fx.Interpreter):
        def run_node(self, n):
            vals[n] = out = super().run_node(n)
            return out

    with mode:
        _Prop(gm).run(*fake)
    return vals


class _Specialization:
    """One input signature of a graph: its IR, clusters and executable."""

    def __init__(self, runner: GraphRunner, args):
        from importers.fx import import_fx
        from runtime.executable import build_executable

        opts = runner.opts
        frozen = _frozen_arrays(runner.static, args)
        vals = concrete_vals(runner.gm, args) if runner.dynamic else None
        self.imported = imported = import_fx(runner.gm, args, frozen, vals, runner.name,
                                             trainable=runner.weights)
        self.input_indices = imported.input_indices
        dump(opts, runner.name, "import.ir", str(imported.graph))
        plan = driver.plan(imported.graph, opts.target, opts.allow_fallback)
        self.clusters = plan.clusters
        dump(opts, runner.name, "opt.ir", str(plan.graph))
        dump(opts, runner.name, "clusters.txt", plan.describe())
        if opts.dump_dir:  # what `braze explain --kernels` prints for an ONNX model
            from compiler.passes.fuse import describe_kernels

            dump(opts, runner.name, "kernels.txt",
                 describe_kernels(plan.graph, plan.clusters, opts.target))
        plan.check()
        _log_host_nodes(runner.name, self.clusters)
        self.parts = _TorchSteps(runner, imported.host_ops).parts(plan)
        self.executable = build_executable(plan.graph, self.clusters,
                                           [p.step for p in self.parts])
        self._direct = _DirectTensors.of(self.executable, self.parts, self.input_indices)

    def run(self, args) -> list:
        from runtime.fallback_torch import to_torch

        direct = self._direct
        outs = direct.run(args) if direct is not None else None
        # the direct step's outputs are its own fresh writable arrays: no checks to_torch
        # makes (~6 us of ~13 on cold caches)
        wrap = torch.from_numpy if outs is not None else to_torch
        if outs is None:
            outs = self.executable.run([args[i] for i in self.input_indices])
        result = []
        for spec in self.imported.outputs:
            if spec[0] == "literal":
                result.append(spec[1])
                continue
            t = wrap(outs[spec[1]])
            result.append(t.clone() if spec[2] else t)
        return result


class _DirectTensors:
    """A graph compiled whole into one CPU step, run on the call's tensors in place: each
    input's data pointer goes into the step's table, with no numpy array made (a model
    compiled whole, mobilenet_v2's graph say, pays no conversion per call; on cold caches
    each torch binding a call goes through costs microseconds: one input's numpy view and
    its checks measured 39-65 us after a 32 MB sweep, these checks 10-13). `run` answers
    None, and the executable runs as usual, where a tensor is not a dense C-order block
    of the dtype compiled for (a channels-last input, a negated view, a Parameter)."""

    def __init__(self, step, indices: tuple, dtypes: tuple):
        self.step = step
        self.pick = operator.itemgetter(*indices) if len(indices) > 1 else (
            lambda args: (args[indices[0]],))
        self.specs = tuple(zip(dtypes, (shape for shape, _ in step.input_specs)))

    @classmethod
    def of(cls, executable, parts, input_indices) -> _DirectTensors | None:
        from runtime.cpu import CpuStep

        if executable.direct is None or len(parts) != 1 or not input_indices:
            return None
        step = parts[0].compiled
        if not isinstance(step, CpuStep) or not step.computes_outputs:
            return None
        dtypes = []
        for _, dt in step.input_specs:
            try:
                dtypes.append(torch.from_numpy(np.empty(0, dt)).dtype)
            except TypeError:
                return None
        return cls(step, tuple(input_indices), tuple(dtypes))

    def run(self, args) -> list | None:
        tensors = self.pick(args)
        addresses = []
        for t, (dt, shape) in zip(tensors, self.specs):
            if t.__class__ is not torch.Tensor or t.dtype is not dt or t.shape != shape \
                    or t.is_neg() or not t.is_contiguous():
                return None
            addresses.append(t.data_ptr())
        return self.step.run_at(addresses, tensors)


def _frozen_arrays(static: frozenset, args) -> dict:
    """Placeholder index -> a numpy copy of each static input (read now: first call)."""
    from runtime.fallback_torch import to_numpy

    frozen = {}
    for i in sorted(static):
        a = args[i]
        if isinstance(a, torch.Tensor) and a.dtype != torch.bfloat16 and not a.is_complex():
            frozen[i] = to_numpy(a)
    return frozen


class _TorchSteps(Steps):
    """The torch front end's steps: eager torch for host clusters, braze's kernels fed
    numpy views of the tensors; a cluster braze fails to compile runs on torch too
    (logged), unless `strict`. Compiled code is not kept on disk (it never has been on
    this front end)."""

    def __init__(self, runner: GraphRunner, host_ops: dict):
        from runtime.fallback_torch import TorchHostStep

        super().__init__(runner.opts, lambda sub: TorchHostStep(sub, host_ops),
                         adapt=_numpy_args)
        self.name = runner.name

    def part(self, sub: Graph, compiled: bool) -> Part:
        if not compiled:
            return super().part(sub, False)
        try:
            part = super().part(sub, True)
        except Exception as e:
            if self.opts.strict:
                raise
            log.warning("braze: codegen failed for %s of graph %s (%s: %s); torch runs it",
                        sub.name, self.name, type(e).__name__, e)
            return super().part(sub, False)
        dump(self.opts, self.name, f"{sub.name}.ll", str(getattr(part.compiled, "llvm_ir", "")))
        return part


def _numpy_args(run):
    """A compiled cluster's step taking torch tensors (numpy views of them, no copies)."""
    from runtime.fallback_torch import to_numpy

    return lambda args: run([to_numpy(a) for a in args])


def _log_host_nodes(name: str, clusters) -> None:
    """INFO: each kind of node left to torch, with its reason (once per op and reason)."""
    seen: collections.Counter = collections.Counter()
    for c in clusters:
        if c.compiled:
            continue
        for n in c.nodes:
            seen[(n.label, c.reasons[n])] += 1
    for (label, reason), count in seen.items():
        times = f" ({count} nodes)" if count > 1 else ""
        log.info("braze: graph %s: %s runs on torch%s: %s", name, label, times, reason)


def dump(opts: TorchOptions, name: str, suffix: str, text: str) -> None:
    """Write one dump file (option dump_dir): IR text, clusters, LLVM IR."""
    if not opts.dump_dir:
        return
    os.makedirs(opts.dump_dir, exist_ok=True)
    with open(os.path.join(opts.dump_dir, f"{name}.{suffix}"), "w") as f:
        f.write(text)
