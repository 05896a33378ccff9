"""ONNX's own node tests through the importer and the reference interpreter.

For each case of `onnx.backend.test.case.node` (the generators behind
onnx/backend/test/data/node/<case>/: the model plus input/output data, built in
memory here because the installed wheel ships no data files), import the model
with the input shapes of its data, run `compiler.interp.evaluate` with a
host_eval that runs each host node's FunctionProto payload as a one-node
onnxruntime model, and compare with the expected outputs (the case's rtol/atol
for floats, as ONNX's backend runner does; exact for ints, bools, strings).
A case counts only if onnxruntime itself reproduces the expected outputs.

Run as a script for the full sweep: python -m tests.importers.onnx_node_cases
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from onnx import FunctionProto, TypeProto, helper

from compiler.interp import evaluate
from importers.onnx import import_onnx

# Float comparison floor: the backend runner's atol (1e-7) is below float32
# rounding noise for values near 1, where decompositions legitimately differ
# from onnxruntime's fused kernels in the last bits.
ATOL_FLOOR = 1e-6


@functools.cache
def all_cases() -> dict:
    """name -> onnx TestCase, for every node test onnx ships."""
    from onnx.backend.test.case import node

    return {c.name: c for c in node.collect_testcases(None)}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _value_info(name: str, fn_types: dict, array) -> onnx.ValueInfoProto:
    """The exact type of a tensor argument, else the payload's recorded type."""
    if isinstance(array, np.ndarray) and array.dtype != object:
        elem = helper.np_dtype_to_tensor_dtype(array.dtype)
        return helper.make_tensor_value_info(name, elem, list(array.shape))
    if name in fn_types:
        return helper.make_value_info(name, fn_types[name])
    return helper.make_value_info(name, TypeProto())


def _arg_signature(a):
    return (a.dtype.str, a.shape) if isinstance(a, np.ndarray) else type(a).__name__


@functools.lru_cache(maxsize=256)
def _host_session(payload: bytes, signature: tuple, probe: tuple) -> tuple:
    """(FunctionProto, session) for a payload; `signature` keys untyped inputs."""
    fn = FunctionProto.FromString(payload)
    types = {vi.name: vi.type for vi in fn.value_info}
    inputs = [_value_info(n, types, p.a) for n, p in zip(fn.input, probe)]
    outputs = [_value_info(n, types, None) for n in fn.output]
    graph = helper.make_graph(list(fn.node), "host", inputs, outputs)
    opsets = list(fn.opset_import)
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=max(helper.find_min_ir_version_for(opsets, True), 10))
    return fn, _session(model)


class _Probe:
    """Hashable stand-in carrying an argument's dtype and shape (for the session cache)."""

    def __init__(self, a):
        self.a = a

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return True


def host_eval(node, args: list) -> list:
    """Run a host node's payload as a one-node onnxruntime model."""
    sig = tuple(_arg_signature(a) for a in args)
    fn, sess = _host_session(node.attrs["payload"], sig, tuple(_Probe(a) for a in args))
    return sess.run(list(fn.output), dict(zip(fn.input, args)))


def _same(expected, got, rtol: float, atol: float) -> str:
    """"" if equal within tolerance, else what differs."""
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return "sequence length differs"
        return next((d for e, g in zip(expected, got) if (d := _same(e, g, rtol, atol))), "")
    if expected is None:
        return "" if got is None else "expected None"
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape:
        return f"shape {got.shape} != expected {expected.shape}"
    if expected.dtype.kind in "fc":
        if not np.allclose(got, expected, rtol=rtol, atol=max(atol, ATOL_FLOOR), equal_nan=True):
            return f"max abs diff {np.nanmax(np.abs(got.astype(float) - expected)):.3g}"
        return ""
    if expected.dtype.kind in "OSU":
        return "" if [str(x) for x in expected.flat] == [str(x) for x in got.flat] else "strings"
    return "" if np.array_equal(expected, got) else "values differ"


def _compare(case, outs) -> str:
    expected = case.data_sets[0][1]
    if len(outs) != len(expected):
        return f"{len(outs)} outputs, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, outs)):
        diff = _same(e, g, case.rtol, case.atol)
        if diff:
            return f"output {i}: {diff}"
    return ""


def ort_reference_ok(case) -> bool:
    """Whether onnxruntime itself reproduces the case's expected outputs."""
    inputs = case.data_sets[0][0]
    try:
        sess = _session(case.model)
        names = [i.name for i in sess.get_inputs()]
        outs = sess.run(None, dict(zip(names, inputs)))
    except Exception:
        return False
    return _compare(case, outs) == ""


def run_case(case) -> tuple[str, str, int]:
    """(status, detail, number of host nodes): status is pass, fail or error."""
    inputs = case.data_sets[0][0]
    real = [vi.name for vi in case.model.graph.input
            if vi.name not in {t.name for t in case.model.graph.initializer}]
    shapes = {n: a.shape for n, a in zip(real, inputs) if isinstance(a, np.ndarray)}
    try:
        imp = import_onnx(case.model, shapes)
    except Exception as e:
        return "error", f"import: {type(e).__name__}: {e}", 0
    hosts = sum(1 for n in imp.graph.nodes if n.op == "host")
    try:
        outs = evaluate(imp.graph, dict(zip(real, inputs)), host_eval)
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return "error", f"run: {type(e).__name__}: {e} ({tb.name}:{tb.lineno})", hosts
    diff = _compare(case, outs)
    return ("fail", diff, hosts) if diff else ("pass", "", hosts)


def sweep(names=None) -> dict:
    """Run cases; name -> (status, detail, hosts), status 'ort_fail' where ORT fails."""
    cases = all_cases()
    results = {}
    for name in names or sorted(cases):
        case = cases[name]
        if not ort_reference_ok(case):
            results[name] = ("ort_fail", "", 0)
            continue
        results[name] = run_case(case)
    return results


def main(argv) -> int:
    results = sweep(argv or None)
    counted = {k: v for k, v in results.items() if v[0] != "ort_fail"}
    passed = [k for k, v in counted.items() if v[0] == "pass"]
    no_host = [k for k in passed if counted[k][2] == 0]
    for name, (status, detail, hosts) in sorted(counted.items()):
        if status != "pass":
            print(f"{status:5} {name}: {detail[:300]}")
    print(f"cases: {len(results)}, onnxruntime passes {len(counted)}; through braze "
          f"{len(passed)} ({100 * len(passed) / max(len(counted), 1):.1f}%), "
          f"of which with no host node {len(no_host)}")
    print(Counter(v[0] for v in results.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
