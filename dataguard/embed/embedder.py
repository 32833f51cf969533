"""`Embedder`: one interface over the backends, models loaded lazily, never pickled."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from dataguard.embed.cache import model_label
from dataguard.embed.settings import (
    DEFAULT_BACKEND,
    STATIC_DIMS,
    check_backend,
    check_device,
    check_model_path,
    check_settings,
    configured_dimension,
    shipped_model_path,
    trained_seq_length,
)


class Embedder:
    """Batched, offline sentence embeddings (L2-normalised float32) from one backend.

    ``backend``: ``torch`` (sentence-transformers; fp16 and batches of at least 256 on CUDA),
    ``torch-bf16`` (the same in bfloat16, CPU), ``onnx`` / ``onnx-int8`` (ONNX Runtime, CPU) or
    ``static`` (model2vec lookup, CPU); see `dataguard.embed`. ``max_seq_length``: tokens read per text (None: what the model was trained with, 128 for
    all-MiniLM-L6-v2). Nothing is loaded or built here.
    """

    def __init__(self, model: str | Path | None = None, *, batch_size: int = 64, threads: int | None = None,
                 device: str = "cpu", backend: str = DEFAULT_BACKEND, max_seq_length: int | None = None) -> None:
        check_settings(model=model, device=device, backend=backend, batch_size=batch_size, threads=threads,
                       max_seq_length=max_seq_length)
        check_model_path(model)
        check_device(device)
        self.backend = check_backend(backend, device)
        self.model_path = str(Path(model).expanduser()) if model is not None else shipped_model_path()
        self.batch_size = batch_size
        self.threads = threads
        self.device = device
        self.trained_length = trained_seq_length(Path(self.model_path))
        self.max_seq_length = max_seq_length if max_seq_length is not None else self.trained_length
        self._runner: Any = None

    @property
    def model_id(self) -> str:
        """The model's folder name, plus the backend (other than torch) and a non-default
        length: stored with kept embeddings, so only vectors from the same setup are reused."""
        name = model_label(Path(self.model_path))
        if self.backend != "torch":
            name += f"+{self.backend}"
        if self.max_seq_length != self.trained_length:
            name += f"@{self.max_seq_length}"
        return name

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_runner"] = None
        return state

    @property
    def runner(self) -> Any:
        """The loaded backend (built into the dataguard cache first if it has to be)."""
        if self._runner is None:
            if self.backend in ("torch", "torch-bf16"):
                from dataguard.embed.torch_backend import TorchRunner

                self._runner = TorchRunner(self.model_path, device=self.device, max_seq_length=self.max_seq_length,
                                           batch_size=self.batch_size, threads=self.threads,
                                           bf16=self.backend == "torch-bf16")
            elif self.backend == "static":
                from dataguard.embed.static_backend import StaticRunner

                self._runner = StaticRunner(self.model_path, max_seq_length=self.max_seq_length, threads=self.threads)
            else:
                from dataguard.embed.onnx_backend import OnnxRunner

                self._runner = OnnxRunner(self.model_path, quantize=self.backend == "onnx-int8",
                                          max_seq_length=self.max_seq_length, threads=self.threads)
        return self._runner

    @property
    def model(self) -> Any:
        """The sentence-transformers model (torch backend only; kept for callers that use it)."""
        return self.runner.model

    @property
    def _model(self) -> Any:  # tests check that pickling drops the loaded model
        return self._runner

    @cached_property
    def dimension(self) -> int:
        """Embedding size, read from the model's config files when possible (no load); read
        once (it is asked per batch, and a model without config files would be run for it)."""
        dim = configured_dimension(Path(self.model_path))
        if dim is None:
            dim = int(self.encode(["dimension"]).shape[1])
        return min(dim, STATIC_DIMS) if self.backend == "static" else dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised; identical texts are embedded once."""
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        uniq: dict[str, int] = {}
        index = np.fromiter((uniq.setdefault(t, len(uniq)) for t in texts), dtype=np.int64, count=len(texts))
        vecs = self.runner.encode(list(uniq))
        return np.ascontiguousarray(np.asarray(vecs, dtype=np.float32)[index])


def stage_embedder(model: Any, *, batch_size: Any, threads: Any, device: Any, backend: Any,
                   max_seq_length: Any = None) -> Embedder:
    """An Embedder for a stage's parameters; a bad one raises StageConfigError naming it."""
    from dataguard.stage import StageConfigError

    try:
        return Embedder(model, batch_size=batch_size, threads=threads, device=device, backend=backend,
                        max_seq_length=max_seq_length)
    except ValueError as exc:  # its messages start with the parameter's name
        raise StageConfigError(str(exc), param=getattr(exc, "param", None)) from None


__all__ = ["DEFAULT_BACKEND", "Embedder", "stage_embedder"]
