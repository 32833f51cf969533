"""Static backend: a model2vec model distilled from the model folder (every vocabulary
token run through the transformer once, PCA to 256 dims, SIF weighting), cached by
`dataguard.embed.cache`. A text's vector is the mean of its tokens' rows, L2-normalised:
a table lookup, vectorised over a whole batch with ``np.add.reduceat``.

Distilling needs ``model2vec`` and ``skeletoken`` (``pip install dataguard[static]``); using
a cached model needs only numpy, safetensors and tokenizers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dataguard.embed.cache import cached_artifact, quiet
from dataguard.embed.settings import STATIC_DIMS, EmbedderConfigError

FORMAT = 1
CHUNK = 4096  # texts per lookup: bounds the (tokens, dim) gather at a few hundred MB
_TABLES: dict[str, Any] = {}


def _distill(model_path: Path, dest: Path, threads: int | None) -> None:
    try:
        from model2vec.distill import distill
    except ImportError as exc:
        raise EmbedderConfigError("backend", f"static needs model2vec's distiller to build its model once "
                                  f"(pip install 'dataguard[static]'): {exc}") from None
    import torch

    from dataguard.embed.torch_backend import quiet_transformers

    quiet_transformers()
    if threads is not None:
        torch.set_num_threads(threads)
    with quiet():  # no progress bar per worker on the user's terminal
        model = distill(str(model_path), device="cpu", pca_dims=STATIC_DIMS, quantize_to="float16")
    from safetensors.numpy import save_file

    save_file({"embeddings": np.ascontiguousarray(model.embedding)}, str(dest / "embeddings.safetensors"))
    model.tokenizer.save(str(dest / "tokenizer.json"))


def artifact(model_path: Path, threads: int | None) -> Path:
    settings = {"format": FORMAT, "pca_dims": STATIC_DIMS, "sif": 1e-4, "dtype": "float16"}
    return cached_artifact("static", model_path, settings, lambda dest: _distill(model_path, dest, threads))


class StaticRunner:
    def __init__(self, model_path: str, *, max_seq_length: int, threads: int | None) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        folder = artifact(Path(model_path), threads)
        if str(folder) not in _TABLES:
            _TABLES[str(folder)] = load_file(str(folder / "embeddings.safetensors"))["embeddings"].astype(np.float32)
        self.table = _TABLES[str(folder)]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_seq_length)
        unk = getattr(self.tokenizer.model, "unk_token", None)
        self.unk_id = self.tokenizer.token_to_id(unk) if unk else None

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        for start in range(0, len(texts), CHUNK):
            out[start:start + CHUNK] = self._chunk(texts[start:start + CHUNK])
        return out

    def _chunk(self, texts: Sequence[str]) -> np.ndarray:
        encs = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encs]
        if self.unk_id is not None:
            ids = [i[i != self.unk_id] for i in ids]
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        out = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        has = lengths > 0
        if has.any():
            flat = np.concatenate([i for i in ids if len(i)])
            starts = np.concatenate(([0], np.cumsum(lengths[has])[:-1]))
            sums = np.add.reduceat(self.table[flat], starts, axis=0)
            norms = np.linalg.norm(sums, axis=1, keepdims=True)  # the mean's direction is the sum's
            out[has] = sums / np.maximum(norms, 1e-12)
        return out
