"""ONNX Runtime backend: the model folder exported once to ONNX (eager attention, so ONNX
Runtime's BERT fusions apply; pooling and L2 normalisation inside the graph), optionally
with dynamic int8 quantization of the weights, cached by `dataguard.embed.cache`.

Each text runs on its own (a (1, tokens) input): no padding is computed, and the result
does not depend on which texts share a batch. That matters for int8: dynamic quantization
takes its activation scale from the whole input tensor, so batched texts would change
each other's vectors. Measured on 2 cores, one text at a time was as fast as batches of
16 and faster than batches of 64 (padding).

Three of ONNX Runtime's fusions are left out, in the export and in the session, because
their CPU kernels are slower than the ops they replace (onnxruntime 1.32, one thread, a
(1, 51, 384) input): `SkipLayerNormalization` took 90 us where `Add` plus
`LayerNormalization` take 16 us, at 12 per text a quarter of the int8 model's time;
`BiasGelu` took 66 us where `Add` plus `Gelu` take 49 us, with identical output. And since
no text is ever padded, attention gets no mask: it only told the kernel that every token is
valid. Together: 128 -> about 190 rows/s per thread for `onnx-int8` on Alpaca rows.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dataguard.embed.cache import cached_artifact, quiet
from dataguard.embed.settings import pooling_mode

FORMAT = 2  # bump when the export changes: a new cache key (2: the slow fusions out, no mask)
OPSET = 17
SLOW_FUSIONS = ["SkipLayerNormFusion", "BiasGeluFusion"]  # session fusions slower on the CPU, see above
_SESSIONS: dict[tuple[str, int], Any] = {}


def _export(model_path: Path, dest: Path, quantize: bool) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from dataguard.embed.torch_backend import quiet_transformers

    quiet_transformers()
    pooling = pooling_mode(model_path)
    model = AutoModel.from_pretrained(str(model_path), attn_implementation="eager").eval()
    AutoTokenizer.from_pretrained(str(model_path)).backend_tokenizer.save(str(dest / "tokenizer.json"))

    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in inspect.signature(model.forward).parameters:  # BERT has them, RoBERTa/MPNet not
        names.append("token_type_ids")

    class Pooled(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            attention_mask = inputs[1]
            hidden = self.inner(**dict(zip(names, inputs, strict=True))).last_hidden_state
            if pooling == "cls":
                vec = hidden[:, 0]
            else:
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                vec = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(vec, p=2.0, dim=1)

    ids = torch.ones(1, 8, dtype=torch.int64)
    raw = dest / "raw.onnx"
    dynamic: dict[str, dict[int, str]] = {name: {0: "batch", 1: "tokens"} for name in names}
    dynamic["embedding"] = {0: "batch"}
    example = (ids, torch.ones_like(ids), torch.zeros_like(ids))[:len(names)]
    with torch.inference_mode(False), torch.no_grad(), quiet():
        torch.onnx.export(Pooled(model), example, str(raw), input_names=names, output_names=["embedding"],
                          dynamic_axes=dynamic, opset_version=OPSET, dynamo=False)
    fused = _fuse(raw, dest / "fused.onnx", model.config)
    out = dest / "model.onnx"
    if quantize:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with quiet():
            quantize_dynamic(str(fused), str(out), weight_type=QuantType.QInt8, per_channel=True,
                             extra_options={"DefaultTensorType": 1})  # 1 = FLOAT: the fused ops' outputs
    else:
        os.replace(fused, out)
    for p in (raw, dest / "fused.onnx"):
        p.unlink(missing_ok=True)


def _fuse(src: Path, dst: Path, config: Any) -> Path:
    """ONNX Runtime's transformer fusions (attention, layer norm, GELU) when the model is
    BERT-like; the plain export otherwise."""
    heads, hidden = getattr(config, "num_attention_heads", 0), getattr(config, "hidden_size", 0)
    if getattr(config, "model_type", "") not in ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet"):
        return src
    try:
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        options = FusionOptions("bert")
        options.enable_skip_layer_norm = options.enable_bias_skip_layer_norm = options.enable_bias_gelu = False
        options.disable_attention_mask()  # the runner never pads: a mask would be all ones
        with quiet():
            optimize_model(str(src), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0,
                           optimization_options=options).save_model_to_file(str(dst))
        return dst
    except Exception:  # noqa: BLE001 - fusion is an optimisation; the plain graph is correct
        return src


def artifact(model_path: Path, quantize: bool) -> Path:
    import onnxruntime
    import torch

    settings = {"format": FORMAT, "opset": OPSET, "int8": quantize, "torch": torch.__version__.split("+")[0],
                "onnxruntime": onnxruntime.__version__}
    return cached_artifact("onnx-int8" if quantize else "onnx", model_path,
                           settings, lambda dest: _export(model_path, dest, quantize))


def _math_threads() -> int:
    """ONNX Runtime ignores OMP_NUM_THREADS; follow it anyway, so a pipeline unit (run with
    one math thread, see dataguard/executors/process.py) gets one intra-op thread. 0 (all
    cores) when it is unset."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() else 0


class OnnxRunner:
    def __init__(self, model_path: str, *, quantize: bool, max_seq_length: int, threads: int | None) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = artifact(Path(model_path), quantize)
        threads = threads or _math_threads()
        key = (str(folder), threads)
        if key not in _SESSIONS:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            opts.log_severity_level = 3
            _SESSIONS[key] = ort.InferenceSession(str(folder / "model.onnx"), opts, providers=["CPUExecutionProvider"],
                                                  disabled_optimizers=SLOW_FUSIONS)
        self.session = _SESSIONS[key]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_seq_length)
        self.inputs = {i.name for i in self.session.get_inputs()}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        dim = self.session.get_outputs()[0].shape[-1]
        out = np.zeros((len(texts), dim if isinstance(dim, int) else 0), dtype=np.float32)
        for i, enc in enumerate(self.tokenizer.encode_batch(list(texts))):
            ids = np.asarray(enc.ids, dtype=np.int64)[None, :]
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                    "token_type_ids": np.asarray(enc.type_ids, dtype=np.int64)[None, :]}
            vec = self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0]
            if out.shape[1] == 0:
                out = np.zeros((len(texts), vec.shape[1]), dtype=np.float32)
            out[i] = vec[0]
        return out
