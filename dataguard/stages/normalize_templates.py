"""Template mapping and checks of normalization: one raw record -> turns, label and meta.

Which templates exist, how each is detected and mapped, and every reason code raised here
are described in ``dataguard/stages/normalize.py`` (the stage that calls ``map_record`` and
``check_mapped`` on the per-record path). Split out so each module stays one job: this one
knows the templates, ``normalize.py`` builds tables and statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dataguard.io.raw import SourceOptions
from dataguard.records import json_dumps
from dataguard.stages.normalize_placeholders import find_placeholders

ROLE_MAP = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "bot": "assistant", "model": "assistant",
    "chatgpt": "assistant", "function_call": "assistant",
    "system": "system", "developer": "system",
    "observation": "tool", "tool": "tool", "function": "tool", "ipython": "tool",
}
CALL_ROLES = frozenset({"function_call"})
LABEL_CANDIDATES = ("label", "intent", "category")


class Reject(Exception):
    """Raised inside the per-record mappers; carries the reason code and detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass
class Mapped:
    """One record mapped to the canonical shape (turns, label, meta), before the checks."""

    fmt: str
    turns: list[tuple[str, str]]
    label: str | None
    meta: dict[str, Any]
    call_turns: list[int] = field(default_factory=list)
    meta_json: str | None = None  # set once the row passed every check


def _label_str(value: Any, name: str) -> str | None:
    """A label as text; an empty or blank string is no label (not a class of its own)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, int):
        return str(value)
    raise Reject("wrong_type", f"field {name!r} must be a string, integer or boolean, got {type(value).__name__}")


def _opt_str(rec: dict[str, Any], name: str) -> str | None:
    value = rec.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Reject("wrong_type", f"field {name!r} must be a string, got {type(value).__name__}")
    return value


def _req_str(rec: dict[str, Any], name: str, missing: str) -> str:
    value = _opt_str(rec, name)
    if value is None:
        raise Reject(missing, f"field {name!r} is missing")
    return value


def _join(*parts: str | None) -> str:
    return "\n".join(p for p in parts if p)


def _content_text(value: Any, where: str) -> str:
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


def _map_turns(turns: Any, field_name: str, meta: dict[str, Any]) -> tuple[list[tuple[str, str]], list[int]]:
    """Map a list of {role, content} / {from, value} turns; extra turn keys go to meta."""
    if not isinstance(turns, list):
        raise Reject("wrong_type", f"field {field_name!r} must be a list of turns, got {type(turns).__name__}")
    out: list[tuple[str, str]] = []
    calls: list[int] = []
    extras: dict[str, dict[str, Any]] = {}
    for i, turn in enumerate(turns):
        where = f"{field_name}[{i}]"
        if not isinstance(turn, dict):
            raise Reject("wrong_type", f"{where} is a {type(turn).__name__}, not an object")
        role_key = "role" if "role" in turn else "from"
        raw_role = turn.get(role_key)
        if raw_role is None:
            raise Reject("unknown_role", f"{where} has no 'role' or 'from'")
        if not isinstance(raw_role, str):
            raise Reject("wrong_type", f"{where}: role must be a string, got {type(raw_role).__name__}")
        role = ROLE_MAP.get(raw_role.strip().lower())
        if role is None:
            raise Reject("unknown_role", f"{where} has role {raw_role!r}")
        content_key = "content" if "content" in turn else "value"
        content = turn.get(content_key)
        call = turn.get("tool_calls") or turn.get("function_call")
        is_call = raw_role.strip().lower() in CALL_ROLES
        if call is not None and role == "assistant" and (content is None or content == ""):
            content, is_call = json_dumps(call), True
        elif content is None:
            raise Reject("wrong_type", f"{where} has no content")
        text = _content_text(content, where)
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


def _map_conversation(rec: dict[str, Any], key: str, fmt: str) -> Mapped:
    meta: dict[str, Any] = {}
    turns, calls = _map_turns(rec[key], key, meta)
    system = _opt_str(rec, "system")
    if system:
        turns.insert(0, ("system", system))
        calls = [c + 1 for c in calls]
    used = {key, "system", "label"}
    if "chosen" in rec and rec["chosen"] is not None:
        chosen = rec["chosen"]
        if isinstance(chosen, dict):
            chosen_turns, _ = _map_turns([chosen], "chosen", {})
            chosen_text = chosen_turns[0][1]
        else:
            chosen_text = _content_text(chosen, "chosen")
        turns.append(("assistant", chosen_text))
        rejected = rec.get("rejected")
        if isinstance(rejected, dict):
            rejected = rejected.get("value", rejected.get("content"))
        meta["rejected"] = rejected
        used |= {"chosen", "rejected"}
    label = _label_str(rec.get("label"), "label")
    for k, v in rec.items():
        if k not in used and v is not None:
            meta[k] = v
    return Mapped(fmt, turns, label, meta, calls)


def _map_alpaca(rec: dict[str, Any]) -> Mapped:
    instruction = _req_str(rec, "instruction", "missing_field")
    query = _opt_str(rec, "input")
    output = _req_str(rec, "output", "missing_assistant")
    turns: list[tuple[str, str]] = []
    system = _opt_str(rec, "system")
    if system:
        turns.append(("system", system))
    history = rec.get("history")
    if history is not None:
        if not isinstance(history, list):
            raise Reject("wrong_type", f"field 'history' must be a list of [query, answer], got {type(history).__name__}")
        for i, pair in enumerate(history):
            if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise Reject("wrong_type", f"history[{i}] must be a [query, answer] pair of strings")
            turns += [("user", pair[0]), ("assistant", pair[1])]
    turns += [("user", _join(instruction, query)), ("assistant", output)]
    used = {"instruction", "input", "output", "system", "history", "label"}
    return Mapped("alpaca", turns, _label_str(rec.get("label"), "label"), _rest(rec, used))


def _map_dolly(rec: dict[str, Any]) -> Mapped:
    instruction = _req_str(rec, "instruction", "missing_field")
    context = _opt_str(rec, "context")
    response = _req_str(rec, "response", "missing_assistant")
    label = _label_str(rec.get("category"), "category")
    if label is None:
        label = _label_str(rec.get("label"), "label")
    turns = [("user", _join(instruction, context)), ("assistant", response)]
    return Mapped("dolly", turns, label, _rest(rec, {"instruction", "context", "response", "category", "label"}))


def _map_prompt_completion(rec: dict[str, Any]) -> Mapped:
    prompt = _req_str(rec, "prompt", "missing_field")
    key = "completion" if rec.get("completion") is not None else "chosen"
    completion = rec.get(key)
    if completion is None:
        raise Reject("missing_assistant", "field 'completion' is missing")
    if not isinstance(completion, str):
        raise Reject("wrong_type", f"field {key!r} must be a string, got {type(completion).__name__}")
    turns: list[tuple[str, str]] = []
    system = _opt_str(rec, "system")
    if system:
        turns.append(("system", system))
    turns += [("user", prompt), ("assistant", completion)]
    return Mapped("prompt_completion", turns, _label_str(rec.get("label"), "label"),
                   _rest(rec, {"prompt", "completion", "chosen", "system", "label"}))


def _label_field(rec: dict[str, Any], options: SourceOptions) -> str | None:
    if options.label_field:
        return options.label_field
    return next((k for k in LABEL_CANDIDATES if k in rec), None)


def _map_labelled(rec: Any, options: SourceOptions) -> Mapped:
    if isinstance(rec, list | tuple):
        if len(rec) != 2:
            raise Reject("not_an_object", f"a list row must be [text, label], got {len(rec)} items")
        text, label = rec
        if not isinstance(text, str):
            raise Reject("wrong_type", f"text must be a string, got {type(text).__name__}")
        return Mapped("labelled_text", [("user", text)], _required_label(label, "label"), {})
    text_field = options.text_field or "text"
    label_field = _label_field(rec, options)
    text = _req_str(rec, text_field, "missing_field")
    if label_field is None or rec.get(label_field) is None:
        raise Reject("missing_field", f"no label field ({options.label_field or ' / '.join(LABEL_CANDIDATES)})")
    label = _required_label(rec[label_field], label_field)
    return Mapped("labelled_text", [("user", text)], label, _rest(rec, {text_field, label_field}))


def _required_label(value: Any, name: str) -> str:
    label = _label_str(value, name)
    if label is None:
        raise Reject("missing_field", f"label field {name!r} is empty")
    return label


def _rest(rec: dict[str, Any], used: set[str]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k not in used and v is not None}


def _detect(rec: dict[str, Any], options: SourceOptions) -> str:
    if "messages" in rec:
        return "messages"
    if "conversations" in rec:
        return "sharegpt"
    if "instruction" in rec and "instances" in rec and "output" not in rec:
        raise Reject("unknown_format", "nested Self-Instruct record (instruction + instances): "
                      "flatten the instances into Alpaca rows first")
    if "instruction" in rec:
        return "dolly" if ("response" in rec or "context" in rec) and "output" not in rec else "alpaca"
    if "prompt" in rec:
        return "prompt_completion"
    if (options.text_field or "text") in rec and _label_field(rec, options) is not None:
        return "labelled_text"
    keys = ", ".join(sorted(rec)[:8]) or "none"
    raise Reject("unknown_format", f"no template fits the fields ({keys})")


_ANCHORS = {
    "messages": "messages", "sharegpt": "conversations", "alpaca": "instruction",
    "dolly": "instruction", "prompt_completion": "prompt",
}


def map_record(rec: Any, options: SourceOptions) -> Mapped:
    forced = options.format
    if not isinstance(rec, dict):
        if forced == "labelled_text" and isinstance(rec, list | tuple):
            return _map_labelled(rec, options)
        raise Reject("not_an_object", f"record is a {type(rec).__name__}, not a JSON object")
    fmt = _detect(rec, options) if forced == "auto" else forced
    if fmt in _ANCHORS and _ANCHORS[fmt] not in rec:
        raise Reject("missing_field", f"format {fmt} needs field {_ANCHORS[fmt]!r}")
    if fmt == "messages":
        return _map_conversation(rec, "messages", "messages")
    if fmt == "sharegpt":
        return _map_conversation(rec, "conversations", "sharegpt")
    if fmt == "alpaca":
        return _map_alpaca(rec)
    if fmt == "dolly":
        return _map_dolly(rec)
    if fmt == "prompt_completion":
        return _map_prompt_completion(rec)
    return _map_labelled(rec, options)


def check_mapped(mapped: Mapped, allowed: frozenset[str], styles: tuple[str, ...] | None) -> None:
    """Structural checks on the mapped conversation; raises Reject on the first failure."""
    turns = mapped.turns
    for i, (role, _) in enumerate(turns):
        if role not in allowed:
            raise Reject("disallowed_role", f"turn {i} has role {role!r} (allowed: {', '.join(sorted(allowed))})")
    if mapped.fmt == "labelled_text":
        if not turns[0][1].strip():
            raise Reject("empty_prompt", "the text is empty")
    else:
        roles = [r for r, _ in turns]
        if "assistant" not in roles:
            raise Reject("missing_assistant", f"no assistant turn among {len(turns)} turns")
        started = False
        for i, role in enumerate(roles):
            if role == "system":
                if started:
                    raise Reject("bad_role_order", f"system turn at position {i} after the conversation started")
                continue
            if not started and role != "user":
                raise Reject("bad_role_order", f"first non-system turn (position {i}) is {role}, not user")
            started = True
            if role == "tool" and roles[i - 1] not in ("assistant", "tool"):
                raise Reject("bad_role_order", f"tool turn at position {i} follows {roles[i - 1]}, not a call")
        if roles[-1] != "assistant":
            raise Reject("missing_assistant", f"conversation ends with a {roles[-1]} turn that has no answer")
        for i, (role, text) in enumerate(turns):
            if role == "assistant" and not text.strip():
                raise Reject("empty_assistant", f"assistant turn at position {i} is empty")
        if not any(text.strip() for role, text in turns if role == "user"):
            raise Reject("empty_prompt", "no user turn has any text")
    if styles is not None:
        for i, (role, text) in enumerate(turns):
            slots = find_placeholders(text, styles)
            if slots:
                shown = ", ".join(sorted(set(slots))[:5])
                raise Reject("unfilled_placeholder", f"{role} turn {i} has unfilled template slots: {shown}")
