"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, as the ONNX function
bodies onnxruntime runs them by.

    NLL  loss[n, d] = -input[n, t, d] * weight[t]     t = target[n, d], weight 1 if absent
    SCE  log_prob = log_softmax(scores) over the class axis 1 (max-subtracted), then NLL
An entry whose target is ignore_index (compared as int64) has loss 0 and weight 0; it
reads class 0 instead, so that an ignore_index outside [-C, C) (-100, say) leaves the
gathers in range. reduction "none" keeps the shape (N, d1..dk), "sum" sums, "mean"
divides the sum by the summed weights (their count without weight) of the entries not
ignored. Otherwise a target is a GatherElements index: a negative one counts from the
end, and one out of [-C, C) makes the gather raise IndexError (onnxruntime fails too).
"""

from __future__ import annotations

from compiler.errors import InvalidModelError
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext
from importers.scans import take_along_axis_ir

_REDUCTIONS = ("none", "sum", "mean")


def _check(cx: NodeContext, x, target, weight) -> None:
    """Fallback for what the IR does not compile; InvalidModelError for what ONNX's shape
    inference refuses (onnxruntime loads no such model)."""
    if x.dtype not in ("f32", "f64"):
        raise Fallback(f"{cx.node.op_type} over {x.type}")
    if not x.type.static or not target.type.static:
        raise Fallback(f"{cx.node.op_type} needs static shapes")
    if x.type.rank < 2 or target.shape != x.shape[:1] + x.shape[2:]:
        raise InvalidModelError(f"{cx.describe}: target of shape {target.shape} for input "
                                f"of shape {x.shape}")
    if weight is not None and weight.shape != x.shape[1:2]:
        raise InvalidModelError(f"{cx.describe}: weight of shape {weight.shape} for "
                                f"{x.shape[1]} classes")
    reduction = cx.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise InvalidModelError(f"{cx.describe}: unknown reduction {reduction!r}")
    if (reduction == "mean" and weight is None and cx.attr("ignore_index") is None
            and target.type.size == 0):  # onnxruntime's ReduceMean of nothing is 0, not 0 / 0
        raise Fallback(f"{cx.node.op_type}: a mean over an empty target")


def _nll(cx: NodeContext, logp, target, weight):
    """The loss of log-probabilities `logp` (N, C, d..) at `target` (N, d..)."""
    ignore = cx.attr("ignore_index")
    idx = cx.reshape(target, target.shape[:1] + (1,) + target.shape[1:])
    kept = None
    if ignore is not None:
        idx = cx.cast(idx, "i64")
        kept = cx.op("ne", idx, cx.scalar(ignore, "i64"))
        idx = cx.op("select", kept, idx, cx.scalar(0, "i64"))
    picked = take_along_axis_ir(cx, logp, idx, 1)
    w = None if weight is None else cx.op("gather", weight, idx, axis=0)
    if kept is not None:  # 0 where ignored, even where class 0's log-probability is -inf
        zero = cx.scalar(0, logp.dtype)
        picked = cx.op("select", kept, picked, zero)
        w = cx.op("select", kept, cx.scalar(1, logp.dtype) if w is None else w, zero)
    loss = cx.op("neg", picked)
    if w is not None:
        loss = cx.op("mul", loss, w)
    reduction, axes = cx.attr("reduction", "mean"), range(idx.type.rank)
    if reduction == "none":
        return cx.reshape(loss, target.shape)
    if reduction == "sum":
        return cx.reduce("sum", loss, axes, keepdims=False)
    if w is None:
        return cx.mean(loss, axes, keepdims=False)
    return cx.op("div", cx.reduce("sum", loss, axes, keepdims=False),
                 cx.reduce("sum", w, axes, keepdims=False))


@converter("NegativeLogLikelihoodLoss", 12)
def convert_negative_log_likelihood_loss(cx: NodeContext):
    x, target, weight = cx.x, cx.input(1), cx.input(2)
    _check(cx, x, target, weight)
    return [_nll(cx, x, target, weight)]


@converter("SoftmaxCrossEntropyLoss", 12)
def convert_softmax_cross_entropy_loss(cx: NodeContext):
    """The loss, and log_prob (output 1)."""
    x, target, weight = cx.x, cx.input(1), cx.input(2)
    _check(cx, x, target, weight)
    if x.shape[1] == 0:
        raise Fallback("SoftmaxCrossEntropyLoss over no classes")
    shifted = cx.op("sub", x, cx.reduce("max", x, [1]))
    logp = cx.op("sub", shifted, cx.op("log", cx.reduce("sum", cx.op("exp", shifted), [1])))
    loss = _nll(cx, logp, target, weight)
    return [loss, logp]
