"""``preference``: a pair given as two whole conversations, ``chosen`` and ``rejected``, with
no separate prompt field; their shared prefix is the prompt.

Two shapes:

* Anthropic HH-RLHF: two strings of ``"\\n\\nHuman: ...\\n\\nAssistant: ..."`` turns;
* TRL's implicit-prompt conversational shape: two lists of {role, content} turns.

Both conversations must end with an assistant turn and share every turn before it;
otherwise the record is ``pair_prompt_mismatch`` (the two responses answer different
prompts, so the pair states no preference). Optional ``system``; other fields go to meta.
The chosen response becomes the final assistant turn, the rejected one ``meta["rejected"]``.
"""

from __future__ import annotations

import re
from typing import Any

from dataguard.formats.base import Mapped, Reject, Template, label_str, rest, system_turns
from dataguard.formats.conversation import map_turns
from dataguard.io.raw import SourceOptions

_HH_TURN = re.compile(r"\n\n(Human|Assistant):[ ]?")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}
REASONS = {"pair_prompt_mismatch": "a preference pair whose two conversations differ before their final response"}


def _is_hh(value: Any) -> bool:
    return isinstance(value, str) and value.lstrip("\n").startswith("Human:")


def detect(rec: dict[str, Any], options: SourceOptions) -> bool:
    chosen, rejected = rec.get("chosen"), rec.get("rejected")
    return (_is_hh(chosen) and isinstance(rejected, str)) or (isinstance(chosen, list) and isinstance(rejected, list))


def hh_turns(text: str, name: str) -> list[tuple[str, str]]:
    """The turns of an HH-RLHF transcript ("\\n\\nHuman: ..." / "\\n\\nAssistant: ...")."""
    if not _is_hh(text):
        raise Reject("unknown_format", f"field {name!r} is not a Human:/Assistant: transcript")
    parts = _HH_TURN.split("\n\n" + text.lstrip("\n"))
    return [(_HH_ROLES[who], content) for who, content in zip(parts[1::2], parts[2::2], strict=True)]


def _conversation(value: Any, name: str) -> list[tuple[str, str]]:
    if isinstance(value, str):
        return hh_turns(value, name)
    if isinstance(value, list):
        turns, _ = map_turns(value, name, {})
        return turns
    raise Reject("wrong_type", f"field {name!r} must be a transcript string or a list of turns, "
                               f"got {type(value).__name__}")


def split_pair(chosen: list[tuple[str, str]], rejected: list[tuple[str, str]]
               ) -> tuple[list[tuple[str, str]], str, str]:
    """(shared prompt turns, chosen response, rejected response)."""
    if not chosen or not rejected:
        raise Reject("missing_assistant", "a conversation of the pair has no turns")
    k = 0
    limit = min(len(chosen), len(rejected)) - 1
    while k < limit and chosen[k] == rejected[k]:
        k += 1
    rest_c, rest_r = chosen[k:], rejected[k:]
    if len(rest_c) != 1 or len(rest_r) != 1:
        raise Reject("pair_prompt_mismatch", f"chosen and rejected differ from turn {k} on, before their final "
                                             f"responses ({len(rest_c)} and {len(rest_r)} turns left)")
    for side, (role, _) in (("chosen", rest_c[0]), ("rejected", rest_r[0])):
        if role != "assistant":
            raise Reject("missing_assistant", f"the {side} conversation ends with a {role} turn, not a response")
    return chosen[:k], rest_c[0][1], rest_r[0][1]


def map_record(rec: dict[str, Any], options: SourceOptions) -> Mapped:
    prompt, chosen, rejected = split_pair(_conversation(rec.get("chosen"), "chosen"),
                                          _conversation(rec.get("rejected"), "rejected"))
    turns = system_turns(rec) + prompt + [("assistant", chosen)]
    meta = {"rejected": rejected, **rest(rec, {"chosen", "rejected", "system", "label"})}
    return Mapped("preference", turns, label_str(rec.get("label"), "label"), meta)


TEMPLATE = Template("preference", "chosen", detect, map_record)
