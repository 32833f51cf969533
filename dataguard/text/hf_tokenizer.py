"""Any Hugging Face tokenizer (a directory or a ``tokenizer.json``), run by the Rust
``tokenizers`` library. A directory's chat template (``tokenizer_config.json`` or
``chat_template.jinja``) is rendered, sandboxed, for record-level counts. Baked-in
padding/truncation is switched off: we count, we never pad."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dataguard.text.tokenizer_base import Tokenizer


class HFTokenizer(Tokenizer):
    """Any Hugging Face tokenizer (directory or tokenizer.json) via the Rust ``tokenizers``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"tokenizer: no such file or directory: {p}")
        self.path = str(p.resolve())
        self.name = f"hf:{self.path}"
        self._tok: Any = None
        self._template: str | None = None
        self._compiled: Any = None
        self._specials: int = 0
        self._overheads: dict[tuple[str, ...], int] = {}

    def _load(self) -> Any:
        if self._tok is not None:
            return self._tok
        from tokenizers import Tokenizer as RustTokenizer

        p = Path(self.path)
        directory = p if p.is_dir() else p.parent
        tok_file = p if p.is_file() else p / "tokenizer.json"
        if tok_file.is_file():
            tok = RustTokenizer.from_file(str(tok_file))
        else:
            # Only a slow tokenizer on disk: let transformers convert it (offline).
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True).backend_tokenizer
        tok.no_padding()
        tok.no_truncation()
        self._template = _read_chat_template(directory)
        self._specials = tok.post_processor.num_special_tokens_to_add(False) if tok.post_processor else 0
        self._tok = tok
        return tok

    def _encode_lists(self, texts: Sequence[str]) -> list[list[int]]:
        tok = self._load()
        return [e.ids for e in tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._load().decode([int(i) for i in ids], skip_special_tokens=False)

    @property
    def chat_template(self) -> str | None:
        self._load()
        return self._template

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        """The chat template applied to one conversation (as the trainer would see it)."""
        self._load()
        if not self._template:
            raise ValueError(f"tokenizer {self.name!r} has no chat template")
        if self._compiled is None:
            self._compiled = _jinja_env().from_string(self._template)
        return self._compiled.render(
            messages=list(messages), add_generation_prompt=False, **_special_token_strings(Path(self.path))
        )

    def template_overhead(self, roles: Sequence[str]) -> int:
        roles = tuple(roles)
        k = self._overheads.get(roles)
        if k is None:
            k = self._overheads[roles] = self._measure_overhead(roles)
        return k

    def _measure_overhead(self, roles: tuple[str, ...]) -> int:
        tok = self._load()
        if not self._template:
            return self._specials
        try:
            text = self.render([{"role": r, "content": ""} for r in roles])
        except Exception:  # noqa: BLE001 - a template may reject a role sequence
            # Fall back to the sum of single-message framings (templates that insist on
            # alternation or on a leading system turn still render one message).
            total = 0
            for r in roles:
                try:
                    total += len(tok.encode(self.render([{"role": r, "content": ""}]), add_special_tokens=False).ids)
                except Exception:  # noqa: BLE001
                    pass
            return total
        return len(tok.encode(text, add_special_tokens=False).ids)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]


def _read_chat_template(directory: Path) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    for name in ("tokenizer_config.json", "chat_template.json"):
        f = directory / name
        if f.is_file():
            try:
                tpl = json.loads(f.read_text(encoding="utf-8")).get("chat_template")
            except (ValueError, AttributeError):
                continue
            if isinstance(tpl, list):  # named templates: take "default"
                tpl = next((t.get("template") for t in tpl if t.get("name") == "default"), None)
            if isinstance(tpl, str) and tpl:
                return tpl
    return None


def _special_token_strings(directory: Path) -> dict[str, str]:
    """bos_token / eos_token strings that templates reference."""
    directory = directory if directory.is_dir() else directory.parent
    out: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = directory / name
        if not f.is_file():
            continue
        try:
            cfg = json.loads(f.read_text(encoding="utf-8"))
        except ValueError:
            continue
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            v = cfg.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str) and key not in out:
                out[key] = v
    return out


def _jinja_env() -> Any:
    """A sandboxed Jinja environment with the helpers HF chat templates expect."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        # Fixed date: counts must be deterministic.
        import datetime

        return datetime.datetime(2024, 1, 1).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env
