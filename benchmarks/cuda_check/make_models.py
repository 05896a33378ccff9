"""Exports the models the GPU check runs (on the GPU machine, with its torch): ONNX files
and their inputs, in benchmarks/cuda_check/models."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import fusion, runtimes, zoo, zoo_models  # noqa: E402

out = Path(__file__).with_name("models")
out.mkdir(exist_ok=True)


def save(name, model, arrays):
    path = out / f"{name}.onnx"
    if hasattr(model, "forward"):
        zoo.export(model.eval(), arrays, path)
    else:
        import onnx
        onnx.save(model, path)
    np.savez(out / f"{name}.npz", **{f"in{i}": a for i, a in enumerate(arrays)})


modules = fusion.torch_modules()
for case in fusion.cases():
    if case.name == "mlp":
        save("mlp", modules["mlp"], case.inputs)
    else:
        save(case.name, getattr(fusion, f"{case.name}_onnx")(), case.inputs)

for zm in (zoo_models.encoder(False), zoo_models.torchvision_model("mobilenet_v2"),
           zoo_models.rnn("LSTM")):
    module, arrays = zm.build()
    save(zm.name, module, arrays)
