"""The runtimes the benchmarks compare, each as a `Runtime` whose setup builds it.

Every setup pins the runtime to common.THREADS threads and returns a zero-argument
callable running the model on fixed inputs. Torch runtimes take torch tensors that
share memory with the numpy inputs the ONNX runtimes take, so no runtime pays for a
conversion the others skip. Optional runtimes (OpenVINO, braze's front ends) fail in
setup with a reason when absent, which the harness shows as "n/a (reason)".
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from benchmarks.common import THREADS, Runtime


def as_tensors(arrays: list[np.ndarray]) -> list:
    """torch tensors sharing memory with `arrays`."""
    import torch

    return [torch.from_numpy(a) for a in arrays]


def torch_eager(module, arrays: list[np.ndarray], name: str = "torch eager") -> Runtime:
    """The module called as is."""
    def setup():
        tensors = as_tensors(arrays)
        return lambda: module(*tensors)

    return Runtime(name, setup)


def torch_compiled(module, arrays: list[np.ndarray], name: str, stock: bool = True,
                   **compile_kwargs) -> Runtime:
    """The module under torch.compile(**compile_kwargs); it compiles on the first call,
    which the harness counts as compile time."""
    def setup():
        import torch

        compiled = torch.compile(module, **compile_kwargs)
        tensors = as_tensors(arrays)
        return lambda: compiled(*tensors)

    return Runtime(name, setup, stock=stock)


def inductor(module, arrays) -> Runtime:
    """torch.compile's default backend, default options."""
    return torch_compiled(module, arrays, "torch.compile (inductor)")


def braze_torch(module, arrays) -> Runtime:
    """braze's torch.compile backend."""
    return torch_compiled(module, arrays, "braze (torch.compile)", stock=False,
                          backend="braze")


def ort_session(model: Path | str | bytes, threads: int = THREADS):
    """An onnxruntime CPU session with all graph optimizations and `threads` threads,
    on an ONNX file or a serialized model."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def onnxruntime(model_path: Path | str, arrays: list[np.ndarray]) -> Runtime:
    """onnxruntime, ORT_ENABLE_ALL, on the ONNX file."""
    def setup():
        sess = ort_session(model_path)
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
        return lambda: sess.run(None, feeds)

    return Runtime("onnxruntime", setup)


def openvino_missing() -> str | None:
    """Why OpenVINO cannot run here, or None when it can."""
    try:
        import openvino  # noqa: F401
    except ImportError as exc:
        return f"openvino not installed ({exc.name or exc})"
    return None


def openvino(model_path: Path | str, arrays: list[np.ndarray]) -> Runtime:
    """OpenVINO's CPU plugin on the ONNX file, fp32 inference precision (it would pick
    bf16 on CPUs that have it), latency mode, one stream of `THREADS` threads."""
    def setup():
        if (why := openvino_missing()) is not None:
            raise RuntimeError(why)
        import openvino as ov

        config = {"INFERENCE_NUM_THREADS": THREADS, "INFERENCE_PRECISION_HINT": "f32",
                  "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        compiled = ov.Core().compile_model(str(model_path), "CPU", config)
        request = compiled.create_infer_request()
        return lambda: request.infer(arrays, share_inputs=True).to_tuple()

    return Runtime("openvino", setup)


def braze_onnx(model_path: Path | str, arrays: list[np.ndarray], target: str = "cpu") -> Runtime:
    """braze's ONNX front end, bridge.compile_onnx, on the ONNX file, for `target` (this
    machine's CPU, or e.g. "cpu:znver3": kernels built for another CPU that runs here);
    it compiles for the inputs' shapes on the first call."""
    def setup():
        import bridge

        compiled = bridge.compile_onnx(str(model_path), target=target, threads=THREADS)
        return lambda: compiled(*arrays)

    return Runtime(braze_name(target), setup, stock=False)


def braze_name(target: str = "cpu") -> str:
    """braze_onnx's runtime name for a target."""
    return "braze (compile_onnx)" if target == "cpu" else f"braze (compile_onnx, {target})"


def cpu_targets(cpus) -> list[str]:
    """The --cpu names of a benchmark's command line as target specs."""
    return [f"cpu:{c}" for c in cpus or []]


def chosen(rts: list[Runtime], only) -> list[Runtime]:
    """The first runtime (the reference) and those whose name contains one of `only`
    (all of them when `only` is empty)."""
    return rts[:1] + [r for r in rts[1:] if not only or any(o in r.name for o in only)]


def export_onnx(module, arrays: list[np.ndarray], path: Path, opset: int = 17) -> Path:
    """The module exported to ONNX by the TorchScript exporter (dynamo=False) with
    static shapes, inputs named in0, in1, ... and its one output out0."""
    import torch

    names = [f"in{i}" for i in range(len(arrays))]
    with torch.no_grad(), warnings.catch_warnings():
        # dynamo=False is on purpose (the exporter braze's importer is tested against);
        # its deprecation notice is noise here.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, tuple(as_tensors(arrays)), str(path), input_names=names,
                          output_names=["out0"], opset_version=opset, dynamo=False)
    return path
