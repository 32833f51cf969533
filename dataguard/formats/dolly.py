"""``dolly``: ``instruction``, ``context``, ``response``, ``category`` (category -> label).
The user turn is instruction and context joined by "\\n"."""

from __future__ import annotations

from typing import Any

from dataguard.formats.base import Mapped, Template, join, label_str, opt_str, req_str, rest
from dataguard.io.raw import SourceOptions


def detect(rec: dict[str, Any], options: SourceOptions) -> bool:
    return "instruction" in rec and ("response" in rec or "context" in rec) and "output" not in rec


def map_record(rec: dict[str, Any], options: SourceOptions) -> Mapped:
    instruction = req_str(rec, "instruction", "missing_field")
    context = opt_str(rec, "context")
    response = req_str(rec, "response", "missing_assistant")
    label = label_str(rec.get("category"), "category")
    if label is None:
        label = label_str(rec.get("label"), "label")
    turns = [("user", join(instruction, context)), ("assistant", response)]
    return Mapped("dolly", turns, label, rest(rec, {"instruction", "context", "response", "category", "label"}))


TEMPLATE = Template("dolly", "instruction", detect, map_record)
