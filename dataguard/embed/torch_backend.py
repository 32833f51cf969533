"""The sentence-transformers backend: the reference (fp32 on the CPU), fp16 on CUDA, and
bf16 on the CPU (``torch-bf16``: weights and activations in bfloat16, which CPUs with AMX
or AVX512-BF16 multiply in hardware; pooling and normalisation read back in fp32)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

CUDA_MIN_BATCH = 256  # a GPU is starved by CPU-sized batches
# One loaded model per (path, device, length, dtype) per process: unpickled stage copies in
# a worker (one per pipeline segment) share it instead of reloading the weights.
_LOADED: dict[tuple[str, str, int, bool], Any] = {}


def quiet_transformers() -> None:
    """No "Loading weights" progress bar per worker on the user's terminal (stderr is for
    problems); best effort, as the switch has moved between transformers versions."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except (ImportError, AttributeError):
        pass


def _bf16_transformer(model: Any) -> None:
    """The transformer module in bfloat16; its token vectors go back to fp32 before pooling,
    so the mean over up to 128 tokens and the L2 norm are not rounded to bf16's 8 bits."""
    import torch

    transformer = model[0]
    transformer.to(torch.bfloat16)

    def to_fp32(_module: Any, _inputs: Any, features: dict[str, Any]) -> dict[str, Any]:
        features["token_embeddings"] = features["token_embeddings"].float()
        return features

    transformer.register_forward_hook(to_fp32)


class TorchRunner:
    def __init__(self, model_path: str, *, device: str, max_seq_length: int, batch_size: int,
                 threads: int | None, bf16: bool = False) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch
        from sentence_transformers import SentenceTransformer

        quiet_transformers()
        if threads is not None:
            torch.set_num_threads(threads)
        key = (model_path, device, max_seq_length, bf16)
        if key not in _LOADED:
            torch.manual_seed(0)
            model = SentenceTransformer(model_path, device=device).eval()
            model.max_seq_length = max_seq_length
            if device.startswith("cuda"):
                model = model.half()
            elif bf16:
                _bf16_transformer(model)
            _LOADED[key] = model
        self.model = _LOADED[key]
        self.batch_size = max(batch_size, CUDA_MIN_BATCH) if device.startswith("cuda") else batch_size

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        # sentence-transformers sorts the texts by length and pads each batch to its longest
        with torch.inference_mode():
            vecs = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_tensor=True,
                                     normalize_embeddings=True, show_progress_bar=False)
        return vecs.float().cpu().numpy()
