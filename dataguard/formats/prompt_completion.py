"""``prompt_completion``: ``prompt`` + ``completion`` (or ``chosen``), optional ``system``."""

from __future__ import annotations

from typing import Any

from dataguard.formats.base import Mapped, Reject, Template, label_str, req_str, rest, system_turns
from dataguard.io.raw import SourceOptions


def detect(rec: dict[str, Any], options: SourceOptions) -> bool:
    return "prompt" in rec


def map_record(rec: dict[str, Any], options: SourceOptions) -> Mapped:
    prompt = req_str(rec, "prompt", "missing_field")
    key = "completion" if rec.get("completion") is not None else "chosen"
    completion = rec.get(key)
    if completion is None:
        raise Reject("missing_assistant", "field 'completion' is missing")
    if not isinstance(completion, str):
        raise Reject("wrong_type", f"field {key!r} must be a string, got {type(completion).__name__}")
    turns = system_turns(rec) + [("user", prompt), ("assistant", completion)]
    return Mapped("prompt_completion", turns, label_str(rec.get("label"), "label"),
                  rest(rec, {"prompt", "completion", "chosen", "system", "label"}))


TEMPLATE = Template("prompt_completion", "prompt", detect, map_record)
