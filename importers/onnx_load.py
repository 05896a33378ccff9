"""Loading ONNX models: files, bytes or protos; external data; opset checks.

Large models (over 2 GB) keep their weights in external data files; they are
loaded tensor by tensor into the in-memory proto and the whole model is never
serialized into one protobuf (which protobuf refuses beyond 2 GB), so nothing
here calls SerializeToString or onnx.checker on a loaded model.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx.defs
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from compiler.errors import ModelLoadError, UnsupportedModelError

DEFAULT_DOMAINS = ("", "ai.onnx")


def load_model(model_or_path) -> onnx.ModelProto:
    """A ModelProto from a path, raw bytes or a ModelProto, with external data loaded and
    every name as text (`text_strings`)."""
    if isinstance(model_or_path, onnx.ModelProto):
        return text_strings(model_or_path)
    if isinstance(model_or_path, (bytes, bytearray)):
        return text_strings(_check_parsed(_parse(bytes(model_or_path), "<bytes>"), "<bytes>"))
    if not isinstance(model_or_path, (str, os.PathLike)):
        raise ModelLoadError(f"expected a path, bytes or onnx.ModelProto, "
                             f"got {type(model_or_path).__name__}")
    path = Path(model_or_path)
    if not path.exists():
        raise ModelLoadError(f"no such file: {path}")
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory, not an ONNX model file")
    data = _read(path)
    if not data:
        raise ModelLoadError(f"{path} is empty: not an ONNX model")
    model = _check_parsed(_parse(data, str(path)), str(path))
    _load_external(model, path)
    return text_strings(model)


def text_strings(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, or a copy of it whose string fields (node and value names, domains...) are
    all text. Protobuf hands back a string field that is not valid UTF-8 as bytes, which
    braze's IR text, cache key and messages cannot hold, while onnxruntime runs such a
    model; the copy decodes them with backslash escapes (b"\\xff" -> "\\\\xff"), the same
    everywhere a name occurs, so values still meet their readers. The caller's model is
    never changed."""
    if not any(True for _ in _byte_strings(model)):
        return model
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for msg, field, index in list(_byte_strings(fixed)):
        text = _decoded(msg, field, index)
        if index is None:
            setattr(msg, field.name, text)
        else:
            getattr(msg, field.name)[index] = text
    return fixed


def _decoded(msg, field, index) -> str:
    value = getattr(msg, field.name)
    return (value if index is None else value[index]).decode("utf-8", "backslashreplace")


def _byte_strings(root):
    """(message, string field, index or None) for each string field of `root` and of the
    messages inside it that protobuf returned as bytes (an explicit stack: subgraphs
    nest)."""
    stack = [root]
    while stack:
        msg = stack.pop()
        for field, value in msg.ListFields():
            if field.type == field.TYPE_MESSAGE:
                stack.extend(value if field.is_repeated else [value])
            elif field.type == field.TYPE_STRING:
                values = enumerate(value) if field.is_repeated else [(None, value)]
                yield from ((msg, field, i) for i, x in values if isinstance(x, bytes))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{where} is not an ONNX model, or is truncated or corrupt "
                             f"(protobuf: {e})") from None
    return model


def _check_parsed(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """Reject bytes that happened to parse as a protobuf but hold no ONNX model."""
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelLoadError(f"{where} is not an ONNX model (no IR version or graph; "
                             f"truncated or not an .onnx file)")
    return model


def _load_external(model: onnx.ModelProto, path: Path) -> None:
    """Read every external-data tensor (initializers and Constant attributes) in place."""
    base = str(path.parent)
    for tensor in _all_tensors(model.graph):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        file = path.parent / info.location
        if not file.is_file():
            raise ModelLoadError(f"{path}: external data file {info.location!r} of tensor "
                                 f"{tensor.name!r} not found in {base}")
        try:
            external_data_helper.load_external_data_for_tensor(tensor, base)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: cannot read external data of tensor "
                                 f"{tensor.name!r}: {e}") from None
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def _all_tensors(graph: onnx.GraphProto):
    """Every TensorProto in a graph: initializers and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for g in attr.graphs:
                yield from _all_tensors(g)


def node_name(node) -> str:
    """A node's name as text: protobuf hands a name that is not valid UTF-8 over as bytes
    (onnxruntime accepts those), shown here with its bad bytes escaped."""
    name = node.name
    return name.decode("utf-8", "backslashreplace") if isinstance(name, bytes) else name


def opset_imports(model: onnx.ModelProto) -> dict[str, int]:
    """domain -> version, with the default domain under "" (ai.onnx folded into it)."""
    out: dict[str, int] = {}
    for op in model.opset_import:
        out["" if op.domain in DEFAULT_DOMAINS else op.domain] = int(op.version)
    return out


def check_versions(model: onnx.ModelProto) -> dict[str, int]:
    """The model's opsets; UnsupportedModelError for one newer than the installed onnx knows."""
    known = onnx.defs.C.schema_version_map()
    opsets = opset_imports(model)
    for domain, version in opsets.items():
        if domain in known and version > known[domain][1]:
            name = domain or "ai.onnx"
            raise UnsupportedModelError(
                f"model uses opset {version} of domain {name!r}, but the installed onnx "
                f"{onnx.__version__} knows opsets up to {known[domain][1]}")
    if model.ir_version > onnx.IR_VERSION:
        raise UnsupportedModelError(f"model has IR version {model.ir_version}, but the "
                                    f"installed onnx knows up to {onnx.IR_VERSION}")
    return opsets
