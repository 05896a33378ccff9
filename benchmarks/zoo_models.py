"""The models of `python -m benchmarks.zoo`: each a builder of (module, example inputs).

Every model has random weights from a fixed seed; nothing is downloaded. Convolutional
networks come from torchvision, transformers from torchvision, torch.nn and the
`transformers` library (random configs), recurrent nets from torch.nn. Each builder
returns the module in eval mode and its inputs as numpy arrays.

BatchNorm statistics are calibrated on random data before anything is timed: with
default initialization, eval-mode BN (running mean 0, variance 1) lets activations
grow layer by layer, and in mobilenet and efficientnet they decay into denormals,
where every runtime slows down by amounts that have nothing to do with its kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

SEED = 0
# Calibration: CALIB_BATCHES forward passes of CALIB_BATCH random images in train mode
# with a cumulative average (momentum None), enough for stable per-channel statistics.
CALIB_BATCHES = 2
CALIB_BATCH = 4
SEQ = 128  # sequence length of the transformer and recurrent models
VOCAB = 1000  # token ids drawn below this (every vocabulary here is larger)


@dataclass(frozen=True)
class ZooModel:
    """A named model: `build()` returns (module in eval mode, list of numpy inputs)."""

    name: str
    family: str  # "conv", "transformer" or "recurrent"
    build: Callable[[], tuple[object, list[np.ndarray]]]
    note: str = ""
    mha_fast_path: bool | None = None  # torch's MHA fast path, set while this model runs
    # dynamo traces nn.LSTM/GRU/RNN only with torch._dynamo.config.allow_rnn (else the
    # module graph-breaks and runs eagerly under every torch.compile backend)
    allow_rnn: bool = False


def image(size: int = 224, batch: int = 1) -> np.ndarray:
    """A fixed random NCHW image batch."""
    rng = np.random.default_rng(SEED)
    return rng.standard_normal((batch, 3, size, size), dtype=np.float32)


def calibrate_batchnorm(module, size: int) -> None:
    """Recompute every BatchNorm's running statistics on random images (see module doc)."""
    import torch

    bns = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average over the calibration batches
    module.train()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _ in range(CALIB_BATCHES):
            module(torch.randn(CALIB_BATCH, 3, size, size, generator=gen))
    module.eval()


def randomize_zero_weights(module) -> None:
    """Give weights that initialize to all zeros (ViT's classifier head) small random
    values: a zero head makes every output its bias, and every runtime's error 0."""
    import torch

    with torch.no_grad():
        for p in module.parameters():
            if p.dim() >= 2 and not torch.any(p):
                p.normal_(0.0, 0.02)


def torchvision_model(name: str, size: int = 224, **kwargs) -> ZooModel:
    """A torchvision classification model with random weights and calibrated BN."""
    def build():
        import torch
        import torchvision

        torch.manual_seed(SEED)
        module = getattr(torchvision.models, name)(weights=None, **kwargs)
        randomize_zero_weights(module)
        calibrate_batchnorm(module, size)
        return module.eval(), [image(size)]

    family = "transformer" if name.startswith(("vit", "swin")) else "conv"
    return ZooModel(name, family, build)


class FirstOutput:
    """Wraps a module whose forward returns a tuple or a model-output object: only the
    first tensor is kept (or, with `key`, the output dict's entry), so every runtime
    compares one output. With `names`, the positional inputs are passed to the module
    by those keywords."""

    def __new__(cls, module, names: tuple[str, ...] = (), key: str | None = None):
        import torch

        class _First(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                kwargs = dict(zip(names, args))
                out = self.inner(*args[len(kwargs):], **kwargs)
                if key is not None:
                    return out[key]
                return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state

        return _First(module).eval()


def encoder(fast_path: bool) -> ZooModel:
    """nn.TransformerEncoder, 2 layers, d 256, 8 heads, batch-first, seq SEQ. With the
    fast path on, eager torch (and dynamo's graph) use the fused MHA kernels."""
    def build():
        import torch

        torch.manual_seed(SEED)
        layer = torch.nn.TransformerEncoderLayer(256, 8, dim_feedforward=1024,
                                                 batch_first=True, dropout=0.0)
        module = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        rng = np.random.default_rng(SEED)
        return module.eval(), [rng.standard_normal((1, SEQ, 256), dtype=np.float32)]

    suffix = "on" if fast_path else "off"
    return ZooModel(f"transformer_encoder_fastpath_{suffix}", "transformer", build,
                    note=f"MHA fast path {suffix}", mha_fast_path=fast_path)


def hf_model(name: str) -> ZooModel:
    """A `transformers` model from its default config (random weights): BERT-base's
    encoder or GPT-2 small, on SEQ random token ids and an attention mask of ones (as a
    tokenizer gives; without a mask GPT-2 looks for packed sequences with aten::diff,
    which the ONNX exporter refuses); the last hidden state is compared."""
    def build():
        import torch
        import transformers

        torch.manual_seed(SEED)
        if name == "bert_base":
            config = transformers.BertConfig(attn_implementation="eager")
            module = transformers.BertModel(config, add_pooling_layer=False)
        else:
            config = transformers.GPT2Config(attn_implementation="eager")
            module = transformers.GPT2Model(config)
        config.use_cache = False
        rng = np.random.default_rng(SEED)
        ids = rng.integers(0, VOCAB, size=(1, SEQ), dtype=np.int64)
        return (FirstOutput(module, ("input_ids", "attention_mask")),
                [ids, np.ones((1, SEQ), dtype=np.int64)])

    return ZooModel(name, "transformer", build)


def segmentation_model(name: str, size: int = 224) -> ZooModel:
    """A torchvision segmentation model (random weights, calibrated BN): its "out" map."""
    def build():
        import torch
        import torchvision

        torch.manual_seed(SEED)
        module = getattr(torchvision.models.segmentation, name)(weights=None,
                                                                weights_backbone=None)
        calibrate_batchnorm(module, size)
        return FirstOutput(module, key="out"), [image(size)]

    return ZooModel(name, "conv", build, note="segmentation")


def video_model(name: str, frames: int = 8, size: int = 112) -> ZooModel:
    """A torchvision video model (3-d convolutions) on `frames` frames of size x size."""
    def build():
        import torch
        import torchvision

        torch.manual_seed(SEED)
        module = getattr(torchvision.models.video, name)(weights=None)
        rng = np.random.default_rng(SEED)
        clip = rng.standard_normal((1, 3, frames, size, size), dtype=np.float32)
        bns = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        module.train()
        with torch.no_grad():
            module(torch.from_numpy(rng.standard_normal((2, 3, frames, size, size),
                                                        dtype=np.float32)))
        return module.eval(), [clip]

    return ZooModel(name, "conv", build, note="video, 3-d convolutions")


def hf_encoder(name: str, model_class: str, config_class: str, seq: int = SEQ,
               **config) -> ZooModel:
    """Any `transformers` encoder from its default config updated by `config` (random
    weights) on `seq` random token ids and a mask of ones; the last hidden state is
    compared."""
    def build():
        import torch
        import transformers

        torch.manual_seed(SEED)
        cfg = getattr(transformers, config_class)(attn_implementation="eager", **config)
        cfg.use_cache = False
        module = getattr(transformers, model_class)(cfg)
        rng = np.random.default_rng(SEED)
        ids = rng.integers(0, VOCAB, size=(1, seq), dtype=np.int64)
        return (FirstOutput(module, ("input_ids", "attention_mask")),
                [ids, np.ones((1, seq), dtype=np.int64)])

    return ZooModel(name, "transformer", build)


def rnn(kind: str) -> ZooModel:
    """nn.LSTM or nn.GRU, 2 layers, hidden 256, input 256, batch-first, seq SEQ."""
    def build():
        import torch

        torch.manual_seed(SEED)
        module = getattr(torch.nn, kind)(256, 256, num_layers=2, batch_first=True)
        rng = np.random.default_rng(SEED)
        return FirstOutput(module.eval()), [rng.standard_normal((1, SEQ, 256),
                                                                dtype=np.float32)]

    return ZooModel(kind.lower(), "recurrent", build,
                    note="torch.compile with torch._dynamo.config.allow_rnn", allow_rnn=True)


def all_models() -> list[ZooModel]:
    """Every model, convolutional networks first."""
    convs = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small",
             "efficientnet_b0", "shufflenet_v2_x1_0", "regnet_y_400mf", "convnext_tiny",
             "densenet121", "squeezenet1_1"]
    models = [torchvision_model(n) for n in convs]
    models.append(torchvision_model("googlenet", aux_logits=False, init_weights=True))
    models.append(torchvision_model("inception_v3", size=299, aux_logits=False,
                                    init_weights=True))
    models += [torchvision_model("vit_b_16"), torchvision_model("swin_t"),
               encoder(fast_path=False), encoder(fast_path=True),
               hf_model("bert_base"), hf_model("gpt2"), rnn("LSTM"), rnn("GRU")]
    return models


def extra_models() -> list[ZooModel]:
    """Models no issue names (`python -m benchmarks.zoo --extra`): other torchvision
    classifiers (grouped, fused-MBConv, plain VGG/AlexNet, MaxViT, Swin V2), segmentation
    (dilated convs, ASPP, upsampling), video (3-d and (2+1)-d convs) and other `transformers`
    encoders. Not in the default run, for time; a check that braze's capabilities are
    general, not a table of the named models."""
    models = [torchvision_model(n) for n in (
        "resnext50_32x4d", "mnasnet1_0", "mobilenet_v3_large", "efficientnet_v2_s",
        "regnet_x_400mf", "alexnet", "vgg11_bn", "shufflenet_v2_x0_5", "maxvit_t",
        "vit_b_32")]
    models.append(torchvision_model("swin_v2_t", size=256))
    models += [segmentation_model("lraspp_mobilenet_v3_large"),
               segmentation_model("deeplabv3_mobilenet_v3_large"),
               segmentation_model("deeplabv3_resnet50"),
               video_model("r3d_18"), video_model("r2plus1d_18")]
    models += [hf_encoder("distilbert", "DistilBertModel", "DistilBertConfig"),
               hf_encoder("roberta", "RobertaModel", "RobertaConfig"),
               # ALBERT's default config is xxlarge (hidden 4096): base sizes instead
               hf_encoder("albert", "AlbertModel", "AlbertConfig", hidden_size=768,
                          num_attention_heads=12, intermediate_size=3072),
               hf_encoder("electra", "ElectraModel", "ElectraConfig"),
               hf_encoder("t5_encoder", "T5EncoderModel", "T5Config"),
               # a decoder-only LLM block stack: RMSNorm, rotary embeddings, grouped-query
               # causal attention, a SiLU-gated MLP (Llama's; Mistral's and Qwen2's alike)
               hf_encoder("llama", "LlamaModel", "LlamaConfig", hidden_size=768,
                          intermediate_size=2048, num_hidden_layers=4,
                          num_attention_heads=12, num_key_value_heads=4, vocab_size=VOCAB)]
    return models
