"""``sharegpt``: ``conversations`` = [{from, value}]; ``human``/``user`` -> user,
``gpt``/``assistant`` -> assistant, ``system`` -> system, ``function_call`` -> an assistant
turn holding the call, ``observation`` -> tool. Optional ``system`` (prepended as a system
turn) and ``tools`` (kept in meta); preference data (``chosen``/``rejected``, e.g.
LLaMA-Factory's dpo_en_demo). Turn rules: ``dataguard/formats/conversation.py``."""

from __future__ import annotations

from typing import Any

from dataguard.formats.base import Mapped, Template
from dataguard.formats.conversation import map_conversation
from dataguard.io.raw import SourceOptions


def detect(rec: dict[str, Any], options: SourceOptions) -> bool:
    return "conversations" in rec


def map_record(rec: dict[str, Any], options: SourceOptions) -> Mapped:
    return map_conversation(rec, "conversations", "sharegpt")


TEMPLATE = Template("sharegpt", "conversations", detect, map_record)
