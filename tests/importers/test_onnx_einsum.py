"""ONNX Einsum (importers/onnx_ops/einsum.py): transposes, sums and batched matmuls,
against onnxruntime, and what the IR holds."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import bridge
from importers.onnx import import_onnx
from importers.onnx_ops.einsum import parse


def _model(equation: str, shapes: list[tuple]):
    ins = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, s)
           for i, s in enumerate(shapes)]
    node = helper.make_node("Einsum", [f"x{i}" for i in range(len(shapes))], ["y"],
                            equation=equation)
    graph = helper.make_graph([node], "g", ins,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


CASES = [
    ("bhid,bhjd->bhij", [(2, 3, 5, 8), (2, 3, 7, 8)]),  # attention's Q K^T
    ("ij,jk", [(4, 5), (5, 6)]),  # implicit output
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]),
    ("...ij,jk->...ik", [(2, 3, 4, 5), (5, 6)]),  # ellipses of different ranks
    ("i,j->ij", [(3,), (4,)]),  # no contracted letter: an outer product
    ("ijk,ikl,lm->jm", [(2, 3, 4), (2, 4, 5), (5, 6)]),  # three operands
    ("bhwc,hkc->bhwk", [(1, 7, 7, 8), (7, 7, 8)]),  # MaxViT's relative attention
    ("abc,abd->", [(2, 3, 4), (2, 3, 5)]),  # letters summed before the product
    ("Ab,bC->CA", [(3, 4), (4, 5)]),  # capitals are letters too
]


@pytest.mark.parametrize("equation,shapes", CASES)
def test_einsum_matches_onnxruntime_compiled_by_braze(equation, shapes):
    model = _model(equation, shapes)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want, = ort.InferenceSession(model.SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(
        None, {f"x{i}": x for i, x in enumerate(xs)})
    got, = bridge.compile_onnx(model.SerializeToString(), allow_fallback=False)(*xs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_two_operands_are_one_matmul_between_movement_ops():
    g = import_onnx(_model("bhid,bhjd->bhij", [(2, 3, 5, 8), (2, 3, 7, 8)])).graph
    ops = [n.op for n in g.nodes if n.op != "const"]
    assert ops.count("matmul") == 1 and "host" not in ops
    assert set(ops) <= {"matmul", "transpose", "reshape"}, ops


def test_ellipsis_is_spelled_in_unused_letters_and_broadcasting_is_refused():
    terms, out = parse("...ij,...jk->...ik", [4, 3])
    assert terms[0][:2] != "ij" and terms[1][0] == terms[0][1] and out == terms[0][:2] + "ik"
    g = import_onnx(_model("...ij,...jk->...ik", [(2, 3, 4), (1, 4, 5)])).graph
    (host,) = [n for n in g.nodes if n.op == "host"]
    assert host.attrs["op_type"] == "Einsum" and "(broadcasting)" in host.attrs["reason"]
    # a diagonal (a letter repeated in one operand) converts: tests/importers/test_onnx_misc_ops.py
    assert not [n for n in import_onnx(_model("ii->i", [(3, 3)])).graph.nodes if n.op == "host"]
