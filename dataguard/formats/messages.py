"""``messages`` (OpenAI): ``messages`` = [{role, content}], optional ``system``, ``label``,
``chosen``/``rejected``. Turn rules: ``dataguard/formats/conversation.py``."""

from __future__ import annotations

from typing import Any

from dataguard.formats.base import Mapped, Template
from dataguard.formats.conversation import map_conversation
from dataguard.io.raw import SourceOptions


def detect(rec: dict[str, Any], options: SourceOptions) -> bool:
    return "messages" in rec


def map_record(rec: dict[str, Any], options: SourceOptions) -> Mapped:
    return map_conversation(rec, "messages", "messages")


TEMPLATE = Template("messages", "messages", detect, map_record)
