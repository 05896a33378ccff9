"""Binding a call's inputs: positional or by name, checked against what the model declares.

Shared by CompiledOnnxModel and the models loaded from artifacts (bridge/artifact.py),
so both accept the same calls and refuse the same mistakes with the same InputError.
An InputSpec is plain data (it saves to JSON in an artifact).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.errors import InputError

ANY_RANK = "any rank"  # InputSpec.dims when the model declares no shape for the input


@dataclass(frozen=True)
class InputSpec:
    """One declared input: `dtype` (numpy; None when unknown), `dims` (a tuple with None
    for symbolic dims; ANY_RANK with no declared shape; None for non-tensors: sequences,
    optionals, which the host runtime checks), `text` for messages (`x: float32[N,8]`)."""

    name: str
    dtype: np.dtype | None
    dims: tuple | str | None
    text: str

    def to_json(self) -> dict:
        dims = list(self.dims) if isinstance(self.dims, tuple) else self.dims
        return {"name": self.name, "dtype": None if self.dtype is None else self.dtype.str,
                "dims": dims, "text": self.text}

    @classmethod
    def from_json(cls, d: dict) -> InputSpec:
        dims = tuple(d["dims"]) if isinstance(d["dims"], list) else d["dims"]
        if dims is not None and dims != ANY_RANK and not isinstance(dims, tuple):
            raise ValueError(f"bad dims {dims!r} for input {d['name']!r}")
        dtype = None if d["dtype"] is None else np.dtype(str(d["dtype"]))
        return cls(str(d["name"]), dtype, dims, str(d["text"]))


def input_spec(vi) -> InputSpec:
    """The InputSpec of an ONNX graph input (a ValueInfoProto)."""
    if vi.type.WhichOneof("value") != "tensor_type":
        return InputSpec(vi.name, None, None, f"{vi.name} (non-tensor)")
    tt = vi.type.tensor_type
    dtype = _np_dtype(tt.elem_type)
    shown = str(dtype) if dtype is not None else "?"
    if not tt.HasField("shape"):
        return InputSpec(vi.name, dtype, ANY_RANK, f"{vi.name}: {shown}[...]")
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    text = ",".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                    for d in tt.shape.dim)
    return InputSpec(vi.name, dtype, dims, f"{vi.name}: {shown}[{text}]")


def _np_dtype(elem_type: int):
    import onnx.helper

    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def bind_inputs(specs: list[InputSpec], args, kwargs) -> list:
    """The call's inputs in declared order, each checked (InputError otherwise)."""
    names = [s.name for s in specs]
    if len(args) > len(names):
        raise InputError(f"model takes {len(names)} input(s) "
                         f"({', '.join(names)}), got {len(args)} positional")
    given = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise InputError(f"unknown input {k!r}; the model's inputs are {', '.join(names)}")
        if k in given:
            raise InputError(f"input {k!r} given twice (positionally and by name)")
        given[k] = v
    missing = [n for n in names if n not in given]
    if missing:
        raise InputError(f"missing input(s) {', '.join(map(repr, missing))}; "
                         f"expected {', '.join(s.text for s in specs)}")
    return [check_input(spec, given[spec.name]) for spec in specs]


def _as_array(spec: InputSpec, value) -> np.ndarray:
    """A list, scalar or CPU tensor as an array of the declared dtype, converted only the
    way numpy casts within a kind (floats never silently become integers)."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, RuntimeError) as e:  # ragged lists, tensors needing grad
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise InputError(f"input {spec.name!r} ({spec.text}) is not an array: {why}") from None
    if spec.dtype is None or array.dtype == spec.dtype:
        return array
    if array.dtype == object or not np.can_cast(array.dtype, spec.dtype, "same_kind"):
        raise InputError(f"input {spec.name!r} must be {spec.dtype}, got {type(value).__name__} "
                         f"of {array.dtype}")
    return array.astype(spec.dtype)


def check_input(spec: InputSpec, value):
    """The input as an array of the declared dtype and rank (InputError otherwise)."""
    if isinstance(value, np.ndarray) and value.shape == spec.dims and value.dtype == spec.dtype:
        return value  # the common call, checked in one comparison: static dims, right dtype
    if spec.dims is None:
        return value  # sequences, optionals: onnxruntime checks them
    if not isinstance(value, np.ndarray):
        value = _as_array(spec, value)
    if spec.dtype is not None and value.dtype != spec.dtype:
        raise InputError(f"input {spec.name!r} must be {spec.dtype}, got {value.dtype}")
    if spec.dims == ANY_RANK:
        return value
    if len(spec.dims) != value.ndim:
        raise InputError(f"input {spec.name!r} must have rank {len(spec.dims)} "
                         f"({spec.text}), got shape {value.shape}")
    for i, (d, n) in enumerate(zip(spec.dims, value.shape)):
        if d is not None and d != n:
            raise InputError(f"input {spec.name!r} dim {i} must be {d} "
                             f"({spec.text}), got shape {value.shape}")
    return value
