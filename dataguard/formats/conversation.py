"""Turn lists, shared by the ``messages`` and ``sharegpt`` templates.

Both turn spellings ({role, content} and {from, value}) are accepted in both templates.
Role names map to ``system``/``user``/``assistant``/``tool`` (``ROLE_MAP``); a
``function_call`` turn, or an assistant turn with ``tool_calls``/``function_call`` and no
text, keeps the call as JSON content and is listed in ``meta["call_turns"]``. Content is a
string or a list of parts [{type: "text", text|value}] joined with "\\n". Preference data
(``chosen``/``rejected``): the chosen response becomes the final assistant turn, the
rejected one is kept in ``meta["rejected"]`` as plain text (the canonical pair,
``dataguard/records.py``); each response may be a string, a turn object or a list of turns
ending with the assistant's (``response_text``).
"""

from __future__ import annotations

from typing import Any

from dataguard.formats.base import Mapped, Reject, label_str, opt_str
from dataguard.records import json_dumps

ROLE_MAP = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "bot": "assistant", "model": "assistant",
    "chatgpt": "assistant", "function_call": "assistant",
    "system": "system", "developer": "system",
    "observation": "tool", "tool": "tool", "function": "tool", "ipython": "tool",
}
CALL_ROLES = frozenset({"function_call"})


def content_text(value: Any, where: str) -> str:
    """A message content: a string, or a list of text parts (OpenAI / LLaMA-Factory style)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict):
                raise Reject("wrong_type", f"{where}: content part {j} is a {type(part).__name__}, not an object")
            kind = part.get("type", "text")
            if kind != "text":
                raise Reject("non_text_content", f"{where}: content part {j} has type {kind!r}")
            text = part.get("text", part.get("value"))
            if not isinstance(text, str):
                raise Reject("wrong_type", f"{where}: content part {j} has no text string")
            texts.append(text)
        return "\n".join(texts)
    raise Reject("wrong_type", f"{where}: content must be a string or a list of parts, got {type(value).__name__}")


def map_turns(turns: Any, field_name: str, meta: dict[str, Any]) -> tuple[list[tuple[str, str]], list[int]]:
    """Map a list of {role, content} / {from, value} turns; extra turn keys go to meta."""
    if not isinstance(turns, list):
        raise Reject("wrong_type", f"field {field_name!r} must be a list of turns, got {type(turns).__name__}")
    out: list[tuple[str, str]] = []
    calls: list[int] = []
    extras: dict[str, dict[str, Any]] = {}
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise Reject("wrong_type", f"{field_name}[{i}] is a {type(turn).__name__}, not an object")
        role_key = "role" if "role" in turn else "from"
        raw_role = turn.get(role_key)
        if raw_role is None:
            raise Reject("unknown_role", f"{field_name}[{i}] has no 'role' or 'from'")
        if not isinstance(raw_role, str):
            raise Reject("wrong_type", f"{field_name}[{i}]: role must be a string, got {type(raw_role).__name__}")
        name = raw_role.strip().lower()
        role = ROLE_MAP.get(name)
        if role is None:
            raise Reject("unknown_role", f"{field_name}[{i}] has role {raw_role!r}")
        content_key = "content" if "content" in turn else "value"
        content = turn.get(content_key)
        call = turn.get("tool_calls") or turn.get("function_call")
        is_call = name in CALL_ROLES
        if call is not None and role == "assistant" and (content is None or content == ""):
            content, is_call = json_dumps(call), True
        elif content is None:
            raise Reject("wrong_type", f"{field_name}[{i}] has no content")
        text = content if isinstance(content, str) else content_text(content, f"{field_name}[{i}]")
        if len(turn) > 2:  # with two keys, both are the role and the content (or the call)
            used = {role_key, content_key} | ({"tool_calls", "function_call"} if is_call and call is not None else set())
            rest = {k: v for k, v in turn.items() if k not in used and v is not None}
            if rest:
                extras[str(len(out))] = rest
        if is_call:
            calls.append(len(out))
        out.append((role, text))
    if extras:
        meta["turn_fields"] = extras
    return out, calls


def response_text(value: Any, name: str) -> str | None:
    """One response of a preference pair as text: a string, a turn ({from, value} /
    {role, content}), a list of turns whose last one is the assistant's (TRL's
    conversational shape), or a list of content parts. None stays None (no response)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list) and value and all(isinstance(t, dict) and ("role" in t or "from" in t) for t in value):
        turns, _ = map_turns(value, name, {})
        if turns[-1][0] != "assistant":
            raise Reject("missing_assistant", f"field {name!r} ends with a {turns[-1][0]} turn, not the response")
        return turns[-1][1]
    return content_text(value, name)


def map_conversation(rec: dict[str, Any], key: str, fmt: str) -> Mapped:
    """A record whose ``key`` holds the turn list (plus optional system, chosen/rejected, label)."""
    meta: dict[str, Any] = {}
    turns, calls = map_turns(rec[key], key, meta)
    system = opt_str(rec, "system")
    if system:
        turns.insert(0, ("system", system))
        calls = [c + 1 for c in calls]
    used = {key, "system", "label"}
    if "chosen" in rec and rec["chosen"] is not None:
        turns.append(("assistant", response_text(rec["chosen"], "chosen") or ""))
        meta["rejected"] = response_text(rec.get("rejected"), "rejected")
        used |= {"chosen", "rejected"}
    label = label_str(rec.get("label"), "label")
    for k, v in rec.items():
        if k not in used and v is not None:
            meta[k] = v
    return Mapped(fmt, turns, label, meta, calls)
