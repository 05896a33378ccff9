"""float16 graphs computed as float32 (compiler/passes/widen.py): where the casts go, and
f16 models against onnxruntime and eager torch with no host node."""

import numpy as np
import pytest

from compiler.codegen import supports
from compiler.interp import evaluate
from compiler.ir import verify
from compiler.passes.pipeline import run_passes
from compiler.passes.widen import widen_half
from compiler.text import parse_graph, print_graph

GRAPH = """
graph g(%x: f16[8], %y: f16[8]) -> (%s, %h, %r) {
  %a = add(%x, %y) : f16[8]
  %e = exp(%a) : f16[8]
  %s = mul(%e, %x) : f16[8]
  %h = host(%a) {framework="onnx", op_type="CumSum", reason="no converter"} : f16[8]
  %t = cast(%s) {to="f16"} : f16[8]
  %r = neg(%t) : f16[8]
}"""


def test_f16_is_computed_as_f32_with_casts_at_the_edges():
    g = parse_graph(GRAPH)
    assert widen_half(g)
    verify(g, after="widen_half")
    text = print_graph(g)
    by_out = {n.outputs[0].name: n for n in g.nodes}
    # arithmetic reads and writes f32
    for name in ("a", "e", "s", "r"):
        node = by_out[name]
        assert node.outputs[0].dtype == "f32", text
        assert all(v.dtype == "f32" for v in node.inputs), text
    # the host node is handed f16 and writes f16
    host = by_out["h"]
    assert host.inputs[0].dtype == "f16" and host.inputs[0].producer.op == "cast", text
    # graph outputs keep their dtype, through a cast where computed in f32
    assert [v.dtype for v in g.outputs] == ["f16", "f16", "f16"], text
    assert g.outputs[0].producer.op == "cast" and g.outputs[1] is host.outputs[0], text
    # only casts, constants and host nodes touch f16; codegen takes every other node
    for n in g.nodes:
        if n.op not in ("cast", "const", "host"):
            assert all(v.dtype != "f16" for v in n.inputs + n.outputs), text
            assert supports(n) is None, (n, supports(n))
    assert not widen_half(g)  # idempotent


def test_an_explicit_cast_to_f16_keeps_its_rounding():
    g = parse_graph("""
graph g(%x: f32[4]) -> (%y) {
  %h = cast(%x) {to="f16"} : f16[4]
  %y = cast(%h) {to="f32"} : f32[4]
}""")
    x = np.array([1.0001, 3.14159, 1e-6, 60000.0], np.float32)
    run_passes(g, verify_each=True)
    got, = evaluate(g, [x])
    np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32))


def test_f16_values_match_f32_math_rounded_once():
    g = parse_graph(GRAPH)
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-2, 2, 8).astype(np.float16) for _ in range(2)]
    run_passes(g, verify_each=True)
    got = evaluate(g, xs, host_eval=lambda node, args: [np.cumsum(args[0], dtype=np.float16)])
    x, y = (v.astype(np.float32) for v in xs)
    a = x + y
    s = np.exp(a) * x
    np.testing.assert_array_equal(got[0], s.astype(np.float16))
    np.testing.assert_array_equal(got[2], (-s).astype(np.float16))


def _f16_model():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float16)
    b = (rng.standard_normal((8,)) * 0.1).astype(np.float16)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Mul", ["r", "s"], ["m"]),
             helper.make_node("ReduceMean", ["m"], ["y"], axes=[2, 3], keepdims=0)]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [vi("x", TensorProto.FLOAT16, [1, 3, 16, 16])],
        [vi("y", TensorProto.FLOAT16, [1, 8]), vi("m", TensorProto.FLOAT16, [1, 8, 16, 16])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_an_f16_onnx_model_compiles_whole_and_matches_onnxruntime():
    import onnxruntime as ort

    import bridge

    model = _f16_model()
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float16)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = bridge.compile_onnx(model, allow_fallback=False)(x)
    for g, w in zip(got, want):
        assert g.dtype == np.float16 and g.shape == w.shape
        # one f16 rounding apart at most (onnxruntime rounds after each op)
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32),
                                   rtol=2e-3, atol=1e-3)


def test_a_half_torch_module_compiles_whole_and_matches_eager():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.GELU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        exact = m(x)
        m.half()
        eager = m(x.half())
        got = torch.compile(m, backend="braze",
                            options={"allow_fallback": False, "strict": True})(x.half())
    assert got.dtype == torch.float16
    # as close to the f32 result as eager's own f16 arithmetic is, give or take an ulp
    err, eager_err = ((t.float() - exact).abs().max().item() for t in (got, eager))
    assert err <= eager_err + 2e-3, (err, eager_err)


@pytest.mark.parametrize("src", ["f64", "f32", "i64", "u8", "i32"])
def test_casts_to_and_from_f16_round_as_numpy_does(src):
    """Compiled casts (vector and scalar tails): f64 -> f16 is rounded once (through f32
    rounded to odd), including values just off an f16 midpoint that rounding to f32
    first would put on it; the JIT has no compiler-rt, so no helper call may be left."""
    from compiler.ir import Graph, TensorType
    from compiler.codegen import compile_graph
    from runtime.cpu import CpuStep

    rng = np.random.default_rng(0)
    halves = rng.uniform(-60000, 60000, 1000).astype(np.float16).astype(np.float64)
    ulp = np.spacing(np.abs(halves).astype(np.float16)).astype(np.float64)
    mid = halves + ulp / 2
    values = np.concatenate([mid * (1 + 2.0 ** -40), mid * (1 - 2.0 ** -40), mid,
                             rng.standard_normal(997) * 1e3,
                             [np.inf, -np.inf, np.nan, 1e300, -1e-300, 0.0, 65520.0, 65519.0]])
    with np.errstate(over="ignore"):
        x = values.astype({"f64": np.float64, "f32": np.float32}.get(src, np.float64))
    if src not in ("f64", "f32"):
        x = np.nan_to_num(values, posinf=0, neginf=0).clip(-1e6, 1e6).astype(
            {"i64": np.int64, "u8": np.uint8, "i32": np.int32}[src])
    g = Graph()
    v = g.add_input("x", TensorType(src, x.shape))
    h = g.op("cast", v, to="f16")
    g.outputs = [h, g.op("cast", h, to=src)]
    half, back = CpuStep(compile_graph(g)).run([x])
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16)
        np.testing.assert_array_equal(half, want)
        if src in ("f64", "f32"):
            np.testing.assert_array_equal(back, want.astype(x.dtype))


def test_an_f16_conv_with_a_run_time_weight_compiles_whole():
    """A Conv whose weight is a graph input, in f16: the im2col and batched matmul
    (importers/runtime_conv.py) are widened like any other op; against torch's f32 conv of
    the same f16 values, rounded once."""
    torch = pytest.importorskip("torch")
    from onnx import TensorProto, helper

    import bridge

    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=2)], "g",
        [vi("x", TensorProto.FLOAT16, [1, 4, 9, 9]), vi("w", TensorProto.FLOAT16, [6, 2, 3, 3])],
        [vi("y", TensorProto.FLOAT16, [1, 6, 9, 9])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float16)
    w = (rng.standard_normal((6, 2, 3, 3)) * 0.3).astype(np.float16)
    got, = bridge.compile_onnx(model, allow_fallback=False)(x, w)
    want = torch.nn.functional.conv2d(torch.from_numpy(x).float(), torch.from_numpy(w).float(),
                                      padding=1, groups=2).half().numpy()
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=2e-3, atol=2e-3)


def test_moving_f16_values_settles_with_the_other_rules():
    """Movement of f16 values stays f16 (widening a reshape between casts would undo
    the rules that move reshapes past casts, round after round); movement mixing f16
    with widened values is widened; a bitcast gets its f16 bits back."""
    g = parse_graph("""
graph g(%x: f16[4,6], %y: f16[24]) -> (%r, %c, %b) {
  %m = reshape(%x) {shape=[24]} : f16[24]
  %e = exp(%m) : f16[24]
  %r = reshape(%e) {shape=[6,4]} : f16[6,4]
  %c = concat(%y, %e) {axis=0} : f16[48]
  %b = bitcast(%e) {to="i16"} : i16[24]
}""")
    run_passes(g, verify_each=True)
    assert not run_passes(g)  # settled: a second run changes nothing
    by_op = {}
    for n in g.nodes:
        by_op.setdefault(n.op, []).append(n)
    assert by_op["exp"][0].outputs[0].dtype == "f32"
    assert by_op["concat"][0].outputs[0].dtype == "f32"
    assert by_op["bitcast"][0].inputs[0].dtype == "f16"
    x = np.random.default_rng(3).uniform(-2, 2, (4, 6)).astype(np.float16)
    y = np.random.default_rng(4).uniform(-2, 2, 24).astype(np.float16)
    r, c, b = evaluate(g, [x, y])
    e = np.exp(x.reshape(24).astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(r, e.reshape(6, 4))
    np.testing.assert_array_equal(c, np.concatenate([y, e]))
    np.testing.assert_array_equal(b, e.view(np.int16))
