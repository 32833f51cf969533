"""``prompt_completion``: ``prompt`` + ``completion`` (or ``chosen``), optional ``system``.

TRL's preference columns: ``prompt``/``chosen``/``rejected``, each a string (the standard
shape) or, in the conversational shape, a list of turns (the prompt's turns; the
responses as one assistant turn). The rejected response goes to ``meta["rejected"]``.
"""

from __future__ import annotations

from typing import Any

from dataguard.formats.base import Mapped, Reject, Template, label_str, rest, system_turns
from dataguard.formats.conversation import map_turns, response_text
from dataguard.io.raw import SourceOptions


def detect(rec: dict[str, Any], options: SourceOptions) -> bool:
    return "prompt" in rec


def _prompt_turns(rec: dict[str, Any], meta: dict[str, Any]) -> list[tuple[str, str]]:
    prompt = rec.get("prompt")
    if prompt is None:
        raise Reject("missing_field", "field 'prompt' is missing")
    if isinstance(prompt, list):  # TRL's conversational shape
        turns, _ = map_turns(prompt, "prompt", meta)
        return turns
    if not isinstance(prompt, str):
        raise Reject("wrong_type", f"field 'prompt' must be a string or a list of turns, got {type(prompt).__name__}")
    return [("user", prompt)]


def map_record(rec: dict[str, Any], options: SourceOptions) -> Mapped:
    meta: dict[str, Any] = {}
    prompt = _prompt_turns(rec, meta)
    key = "completion" if rec.get("completion") is not None else "chosen"
    completion = rec.get(key)
    if completion is None:
        present = [k for k in ("completion", "chosen") if k in rec]
        raise Reject("missing_assistant", f"field {present[-1]!r} is null" if present
                     else "field 'completion' (or 'chosen') is missing")
    if key == "chosen":
        completion = response_text(completion, key)
    elif not isinstance(completion, str):
        raise Reject("wrong_type", f"field {key!r} must be a string, got {type(completion).__name__}")
    turns = system_turns(rec) + prompt + [("assistant", completion)]
    used = {"prompt", "completion", "chosen", "system", "label"}
    if key == "chosen" and "rejected" in rec:
        meta["rejected"] = response_text(rec["rejected"], "rejected")
        used.add("rejected")
    return Mapped("prompt_completion", turns, label_str(rec.get("label"), "label"), {**meta, **rest(rec, used)})


TEMPLATE = Template("prompt_completion", "prompt", detect, map_record)
