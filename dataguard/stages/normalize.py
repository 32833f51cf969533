"""Template normalization: every raw input record becomes one canonical conversation or a reject.

The pipeline calls `Normalizer.normalize` first on every `RawBatch`. Per record it applies
the source's field aliases, detects the template (or uses the forced one), maps it to
``messages`` [{role, content}] with roles ``system``/``user``/``assistant``/``tool``, and
checks the result. Anything that does not fit becomes a rejected row with a reason code.

Templates (auto-detected in this order, by their anchor fields):

* ``messages`` (OpenAI): ``messages`` = [{role, content}]; ``content`` is a string or a list
  of parts [{type: "text", text|value}] (text parts are joined with "\\n"); an assistant
  turn with ``tool_calls``/``function_call`` and no text keeps the calls as JSON content.
* ``sharegpt``: ``conversations`` = [{from, value}]; ``human``/``user`` -> user,
  ``gpt``/``assistant`` -> assistant, ``system`` -> system, ``function_call`` -> an assistant
  turn holding the call, ``observation`` -> tool. Optional ``system`` (prepended as a system
  turn) and ``tools`` (kept in meta). Both turn spellings ({from, value} and {role,
  content}) are accepted in both templates.
  *Preference data* (``chosen``/``rejected``, e.g. LLaMA-Factory's dpo_en_demo): the
  chosen response becomes the final assistant turn; the rejected response is kept in
  ``meta["rejected"]`` (never trained on, but not lost).
* ``dolly``: ``instruction``, ``context``, ``response``, ``category`` (category -> label).
* ``alpaca``: ``instruction``, ``input``, ``output``, optional ``system`` and ``history``
  [[query, answer], ...]. The user turn is instruction and input joined by "\\n"
  (LLaMA-Factory's convention).
* ``prompt_completion``: ``prompt`` + ``completion`` (or ``chosen``), optional ``system``.
* ``labelled_text``: a text column (``text_field`` or ``text``) and a label column
  (``label_field`` or the first of ``label``/``intent``/``category``) -> one user turn plus
  ``label``. When this format is forced, a 2-element list row ``[text, label]`` (CLINC150)
  is accepted too. Labelled text has no assistant turn and is not checked for one.

Aliases (``SourceOptions.aliases``, source field -> canonical field, e.g. ``question ->
instruction``, ``intent -> label``) rename top-level fields before detection; a renamed
field wins over one already there, whose value is kept in meta as ``"<name>:shadowed"``.

A record's ``label`` (string, integer or boolean, e.g. KTO's desirable flag) becomes the
``label`` column as a string (booleans as ``"true"``/``"false"``); an empty or blank string
is no label, not a class of its own. Fields that have no column go into ``meta`` as
deterministic JSON; null-valued fields carry nothing: they are dropped, and count as absent
when the template is detected (a dataset concatenated from several formats has every
format's columns, null where a row is of another format). The id is always ``RawBatch.row_id`` (``"<source>:<position>"``), unique across
the whole run by construction (source names are unique, positions are file order) even
when a file repeats its own ids; a record's own ``id`` is kept in ``meta["source_id"]``.

Checks on conversational formats, with their reason codes:

* ``missing_assistant``: no assistant turn, or the conversation ends with a user/tool
  turn that has no answer (nothing to train on for that turn).
* ``empty_assistant``: an assistant turn that is empty or whitespace.
* ``empty_prompt``: no user turn has any text (also an empty labelled text).
* ``bad_role_order``: a system turn after the conversation started, a first non-system
  turn that is not from the user, or a tool turn that does not follow an assistant (call)
  or tool turn. Two user turns in a row are allowed (people send two messages), and so
  are two assistant turns (a reply, then a call): chat templates that need strict
  alternation can merge them, and rejecting them would lose real data.
* ``unfilled_placeholder``: a template slot left in the text, ``{{name}}`` /
  ``{{ user.name }}`` or ``<<name>>`` (identifier-like contents only). Single braces
  ``{name}`` are NOT flagged (code and JSON in answers are full of them), text inside
  Markdown code (fenced blocks and inline backticks) is skipped (a Jinja/Vue answer may
  legitimately contain ``{{ x }}``), a ``{{`` directly after a letter, digit, ``}``,
  backslash (LaTeX ``\\frac{{a}}``) or ``$`` (GitHub Actions ``${{ github.repository }}``,
  seen in kto_en_demo prompts) is ignored, and ``<<48/2=24>>`` (GSM8K calculator
  annotations) does not look like an identifier.
* ``unknown_role`` (a role name we cannot map), ``disallowed_role`` (mapped role not in
  ``allowed_roles``), ``wrong_type`` (a field or content of the wrong JSON type),
  ``non_text_content`` (an image/audio content part), ``missing_field`` (a forced format's
  anchor field is absent, or a labelled text's label is empty), ``unknown_format`` (no
  template fits), ``not_an_object`` (the record is not a JSON object), ``invalid_unicode``
  (a text holds a lone surrogate, which cannot be written as UTF-8; readers reject these
  first, this covers records built in Python), ``too_deep`` (a record built in Python that
  nests too deeply to encode). Reader errors (``invalid_json``, ``invalid_utf8``,
  ``too_deep``, ``record_too_large``, ...) pass through with the raw text in ``record``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.records import (
    CANONICAL_SCHEMA,
    MESSAGE_TYPE,
    MESSAGES_TYPE,
    REJECTED_SCHEMA,
    ROLES,
    has_surrogates,
    json_dumps,
    json_text,
    safe_text,
)
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.stages.normalize_flat import (
    FlatRows,
    may_hold_placeholder,
    plain_alpaca_rows,
    rows_with_surrogates,
    two_turn_messages,
    without_rows,
)

FORMATS = ("alpaca", "sharegpt", "messages", "dolly", "prompt_completion", "labelled_text")
STAGE_NAME = "normalize"

ROLE_MAP = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "bot": "assistant", "model": "assistant",
    "chatgpt": "assistant", "function_call": "assistant",
    "system": "system", "developer": "system",
    "observation": "tool", "tool": "tool", "function": "tool", "ipython": "tool",
}
CALL_ROLES = frozenset({"function_call"})
LABEL_CANDIDATES = ("label", "intent", "category")
MAX_EXAMPLES_PER_REASON = 3
MAX_EXAMPLES = 20
SNIPPET_CHARS = 300

_CODE_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_PLACEHOLDER = re.compile(
    r"(?<![\\\w}$])\{\{\s*[A-Za-z_][\w.\-]*(?:\s*\|\s*[\w.\-]+)*\s*\}\}"
    r"|(?<!<)<<\s*[A-Za-z_][\w.\-]*\s*>>(?!>)"
)


class _Reject(Exception):
    """Raised inside the per-record mappers; carries the reason code and detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass
class _Mapped:
    fmt: str
    turns: list[tuple[str, str]]
    label: str | None
    meta: dict[str, Any]
    call_turns: list[int] = field(default_factory=list)
    meta_json: str | None = None  # set once the row passed every check


def find_placeholders(text: str) -> list[str]:
    """Unfilled template slots in `text`, ignoring Markdown code (see module docstring)."""
    if not may_hold_placeholder(text):
        return []
    if "`" in text:
        text = _INLINE_CODE.sub(" ", _CODE_FENCE.sub(" ", text))
    return _PLACEHOLDER.findall(text)


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
    raise _Reject("wrong_type", f"field {name!r} must be a string, integer or boolean, got {type(value).__name__}")


def _opt_str(rec: dict[str, Any], name: str) -> str | None:
    value = rec.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Reject("wrong_type", f"field {name!r} must be a string, got {type(value).__name__}")
    return value


def _req_str(rec: dict[str, Any], name: str, missing: str) -> str:
    value = _opt_str(rec, name)
    if value is None:
        raise _Reject(missing, f"field {name!r} is missing")
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
                raise _Reject("wrong_type", f"{where}: content part {j} is a {type(part).__name__}, not an object")
            kind = part.get("type", "text")
            if kind != "text":
                raise _Reject("non_text_content", f"{where}: content part {j} has type {kind!r}")
            text = part.get("text", part.get("value"))
            if not isinstance(text, str):
                raise _Reject("wrong_type", f"{where}: content part {j} has no text string")
            texts.append(text)
        return "\n".join(texts)
    raise _Reject("wrong_type", f"{where}: content must be a string or a list of parts, got {type(value).__name__}")


def _map_turns(turns: Any, field_name: str, meta: dict[str, Any]) -> tuple[list[tuple[str, str]], list[int]]:
    """Map a list of {role, content} / {from, value} turns; extra turn keys go to meta."""
    if not isinstance(turns, list):
        raise _Reject("wrong_type", f"field {field_name!r} must be a list of turns, got {type(turns).__name__}")
    out: list[tuple[str, str]] = []
    calls: list[int] = []
    extras: dict[str, dict[str, Any]] = {}
    for i, turn in enumerate(turns):
        where = f"{field_name}[{i}]"
        if not isinstance(turn, dict):
            raise _Reject("wrong_type", f"{where} is a {type(turn).__name__}, not an object")
        role_key = "role" if "role" in turn else "from"
        raw_role = turn.get(role_key)
        if raw_role is None:
            raise _Reject("unknown_role", f"{where} has no 'role' or 'from'")
        if not isinstance(raw_role, str):
            raise _Reject("wrong_type", f"{where}: role must be a string, got {type(raw_role).__name__}")
        role = ROLE_MAP.get(raw_role.strip().lower())
        if role is None:
            raise _Reject("unknown_role", f"{where} has role {raw_role!r}")
        content_key = "content" if "content" in turn else "value"
        content = turn.get(content_key)
        call = turn.get("tool_calls") or turn.get("function_call")
        is_call = raw_role.strip().lower() in CALL_ROLES
        if call is not None and role == "assistant" and (content is None or content == ""):
            content, is_call = json_dumps(call), True
        elif content is None:
            raise _Reject("wrong_type", f"{where} has no content")
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


def _map_conversation(rec: dict[str, Any], key: str, fmt: str) -> _Mapped:
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
    return _Mapped(fmt, turns, label, meta, calls)


def _map_alpaca(rec: dict[str, Any]) -> _Mapped:
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
            raise _Reject("wrong_type", f"field 'history' must be a list of [query, answer], got {type(history).__name__}")
        for i, pair in enumerate(history):
            if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise _Reject("wrong_type", f"history[{i}] must be a [query, answer] pair of strings")
            turns += [("user", pair[0]), ("assistant", pair[1])]
    turns += [("user", _join(instruction, query)), ("assistant", output)]
    used = {"instruction", "input", "output", "system", "history", "label"}
    return _Mapped("alpaca", turns, _label_str(rec.get("label"), "label"), _rest(rec, used))


def _map_dolly(rec: dict[str, Any]) -> _Mapped:
    instruction = _req_str(rec, "instruction", "missing_field")
    context = _opt_str(rec, "context")
    response = _req_str(rec, "response", "missing_assistant")
    label = _label_str(rec.get("category"), "category")
    if label is None:
        label = _label_str(rec.get("label"), "label")
    turns = [("user", _join(instruction, context)), ("assistant", response)]
    return _Mapped("dolly", turns, label, _rest(rec, {"instruction", "context", "response", "category", "label"}))


def _map_prompt_completion(rec: dict[str, Any]) -> _Mapped:
    prompt = _req_str(rec, "prompt", "missing_field")
    key = "completion" if rec.get("completion") is not None else "chosen"
    completion = rec.get(key)
    if completion is None:
        raise _Reject("missing_assistant", "field 'completion' is missing")
    if not isinstance(completion, str):
        raise _Reject("wrong_type", f"field {key!r} must be a string, got {type(completion).__name__}")
    turns: list[tuple[str, str]] = []
    system = _opt_str(rec, "system")
    if system:
        turns.append(("system", system))
    turns += [("user", prompt), ("assistant", completion)]
    return _Mapped("prompt_completion", turns, _label_str(rec.get("label"), "label"),
                   _rest(rec, {"prompt", "completion", "chosen", "system", "label"}))


def _label_field(rec: dict[str, Any], options: SourceOptions) -> str | None:
    if options.label_field:
        return options.label_field
    return next((k for k in LABEL_CANDIDATES if k in rec), None)


def _map_labelled(rec: Any, options: SourceOptions) -> _Mapped:
    if isinstance(rec, list | tuple):
        if len(rec) != 2:
            raise _Reject("not_an_object", f"a list row must be [text, label], got {len(rec)} items")
        text, label = rec
        if not isinstance(text, str):
            raise _Reject("wrong_type", f"text must be a string, got {type(text).__name__}")
        return _Mapped("labelled_text", [("user", text)], _required_label(label, "label"), {})
    text_field = options.text_field or "text"
    label_field = _label_field(rec, options)
    text = _req_str(rec, text_field, "missing_field")
    if label_field is None or rec.get(label_field) is None:
        raise _Reject("missing_field", f"no label field ({options.label_field or ' / '.join(LABEL_CANDIDATES)})")
    label = _required_label(rec[label_field], label_field)
    return _Mapped("labelled_text", [("user", text)], label, _rest(rec, {text_field, label_field}))


def _required_label(value: Any, name: str) -> str:
    label = _label_str(value, name)
    if label is None:
        raise _Reject("missing_field", f"label field {name!r} is empty")
    return label


def _rest(rec: dict[str, Any], used: set[str]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k not in used and v is not None}


def _detect(rec: dict[str, Any], options: SourceOptions) -> str:
    if "messages" in rec:
        return "messages"
    if "conversations" in rec:
        return "sharegpt"
    if "instruction" in rec and "instances" in rec and "output" not in rec:
        raise _Reject("unknown_format", "nested Self-Instruct record (instruction + instances): "
                      "flatten the instances into Alpaca rows first")
    if "instruction" in rec:
        return "dolly" if ("response" in rec or "context" in rec) and "output" not in rec else "alpaca"
    if "prompt" in rec:
        return "prompt_completion"
    if (options.text_field or "text") in rec and _label_field(rec, options) is not None:
        return "labelled_text"
    keys = ", ".join(sorted(rec)[:8]) or "none"
    raise _Reject("unknown_format", f"no template fits the fields ({keys})")


_ANCHORS = {
    "messages": "messages", "sharegpt": "conversations", "alpaca": "instruction",
    "dolly": "instruction", "prompt_completion": "prompt",
}


def _map_record(rec: Any, options: SourceOptions) -> _Mapped:
    forced = options.format
    if not isinstance(rec, dict):
        if forced == "labelled_text" and isinstance(rec, list | tuple):
            return _map_labelled(rec, options)
        raise _Reject("not_an_object", f"record is a {type(rec).__name__}, not a JSON object")
    fmt = _detect(rec, options) if forced == "auto" else forced
    if fmt in _ANCHORS and _ANCHORS[fmt] not in rec:
        raise _Reject("missing_field", f"format {fmt} needs field {_ANCHORS[fmt]!r}")
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


def _check(mapped: _Mapped, allowed: frozenset[str], check_placeholders: bool) -> None:
    """Structural checks on the mapped conversation; raises _Reject on the first failure."""
    turns = mapped.turns
    for i, (role, _) in enumerate(turns):
        if role not in allowed:
            raise _Reject("disallowed_role", f"turn {i} has role {role!r} (allowed: {', '.join(sorted(allowed))})")
    if mapped.fmt == "labelled_text":
        if not turns[0][1].strip():
            raise _Reject("empty_prompt", "the text is empty")
    else:
        roles = [r for r, _ in turns]
        if "assistant" not in roles:
            raise _Reject("missing_assistant", f"no assistant turn among {len(turns)} turns")
        started = False
        for i, role in enumerate(roles):
            if role == "system":
                if started:
                    raise _Reject("bad_role_order", f"system turn at position {i} after the conversation started")
                continue
            if not started and role != "user":
                raise _Reject("bad_role_order", f"first non-system turn (position {i}) is {role}, not user")
            started = True
            if role == "tool" and roles[i - 1] not in ("assistant", "tool"):
                raise _Reject("bad_role_order", f"tool turn at position {i} follows {roles[i - 1]}, not a call")
        if roles[-1] != "assistant":
            raise _Reject("missing_assistant", f"conversation ends with a {roles[-1]} turn that has no answer")
        for i, (role, text) in enumerate(turns):
            if role == "assistant" and not text.strip():
                raise _Reject("empty_assistant", f"assistant turn at position {i} is empty")
        if not any(text.strip() for role, text in turns if role == "user"):
            raise _Reject("empty_prompt", "no user turn has any text")
    if check_placeholders:
        for i, (role, text) in enumerate(turns):
            slots = find_placeholders(text)
            if slots:
                shown = ", ".join(sorted(set(slots))[:5])
                raise _Reject("unfilled_placeholder", f"{role} turn {i} has unfilled template slots: {shown}")


def _apply_aliases(rec: dict[str, Any], aliases: dict[str, str], applied: Counter[str]) -> dict[str, Any]:
    """Rename source fields to canonical ones; a renamed field wins over one already there."""
    if not aliases or not any(k in rec for k in aliases):
        return rec
    out = {k: v for k, v in rec.items() if k not in aliases}
    for src, dst in aliases.items():
        if src in rec:
            if dst in out and dst not in aliases:
                out[f"{dst}:shadowed"] = out[dst]
            out[dst] = rec[src]
            applied[f"{src}->{dst}"] += 1
    return out


def _without_nulls(rec: dict[str, Any]) -> dict[str, Any]:
    """A null field counts as absent (a concatenated dataset has every format's columns,
    null where the row is of another format)."""
    if None not in rec.values():
        return rec
    return {k: v for k, v in rec.items() if v is not None}


def _unicode_problem(mapped: _Mapped) -> str | None:
    """Why the mapped row cannot be written as UTF-8 (a lone surrogate), or None."""
    for i, (role, text) in enumerate(mapped.turns):
        if has_surrogates(text):
            return f"{role} turn {i} holds a lone surrogate (\\udXXX), which is not a character"
    if mapped.label is not None and has_surrogates(mapped.label):
        return "the label holds a lone surrogate (\\udXXX), which is not a character"
    if mapped.meta:
        mapped.meta_json, escaped = json_text(mapped.meta)
        if escaped:
            return "a field holds a lone surrogate (\\udXXX), which is not a character"
    return None


def _record_json(record: Any) -> str:
    """The record as JSON for the rejected row (even when it nests too deeply to encode)."""
    try:
        return json_dumps(record)
    except RecursionError:
        return f"[a {type(record).__name__} nested too deeply to write as JSON]"


def _snippet(text: str) -> str:
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."


def _messages_array(turns_per_row: Sequence[list[tuple[str, str]]]) -> pa.Array:
    """Build the list<struct<role, content>> column from flat buffers (no per-row dicts)."""
    offsets = [0]
    roles: list[str] = []
    contents: list[str] = []
    for turns in turns_per_row:
        for role, content in turns:
            roles.append(role)
            contents.append(content)
        offsets.append(len(roles))
    values = pa.StructArray.from_arrays(
        [pa.array(roles, pa.string()), pa.array(contents, pa.string())], fields=list(MESSAGE_TYPE)
    )
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values).cast(MESSAGES_TYPE)


class Normalizer(Stage):
    """Maps raw records of any supported template to canonical rows (see module docstring)."""

    name = STAGE_NAME

    def __init__(self, *, check_placeholders: bool = True, allowed_roles: Iterable[str] = ROLES) -> None:
        if not isinstance(check_placeholders, bool):
            raise StageConfigError(f"check_placeholders must be true or false, got {check_placeholders!r}")
        if isinstance(allowed_roles, str) or not isinstance(allowed_roles, Iterable):
            raise StageConfigError(f"allowed_roles must be a list of roles, got {allowed_roles!r}")
        roles = list(allowed_roles)
        bad = [r for r in roles if r not in ROLES]
        if bad or not roles:
            raise StageConfigError(f"allowed_roles must be a non-empty subset of {list(ROLES)}, got {roles!r}")
        self.check_placeholders = check_placeholders
        self.allowed_roles = frozenset(roles)
        self._totals: dict[str, Any] = _empty_stats()

    def output_columns(self) -> dict[str, pa.DataType]:
        return {"format": pa.string()}

    @property
    def schema(self) -> pa.Schema:
        return CANONICAL_SCHEMA.append(pa.field("format", pa.string()))

    def normalize(self, batch: RawBatch, options: SourceOptions) -> Outcome:
        """Canonical rows (+ ``format``) and rejected rows for one raw batch."""
        if options.format != "auto" and options.format not in FORMATS:
            raise StageConfigError(f"format for input {options.name!r} must be auto or one of {', '.join(FORMATS)}, "
                                   f"got {options.format!r}")
        source = batch.source
        stats = _empty_stats()
        stats["rows_in"] = len(batch)
        aliases_applied: Counter[str] = Counter()
        mapped_rows: list[tuple[int, _Mapped, str | None]] = []
        rejects: list[dict[str, Any]] = []
        flat = plain_alpaca_rows(batch.records, batch.errors, options, self.allowed_roles, self.check_placeholders)
        if len(flat.index) == len(batch):
            slow_rows: list[int] | range = []
        elif not flat.index:
            slow_rows = range(len(batch))
        else:
            taken = set(flat.index)
            slow_rows = [i for i in range(len(batch)) if i not in taken]
        for i in slow_rows:
            self._one_record(batch, i, options, aliases_applied, mapped_rows, rejects)
        try:
            kept = self._kept_table(batch, mapped_rows, flat)
        except UnicodeEncodeError:
            # A fast-path text holds a lone surrogate: only records built in Python get here
            # (readers reject these rows first), so this costs the hot path nothing. Such
            # rows take the per-record path, which says why they are rejected.
            bad = rows_with_surrogates(flat)
            flat = without_rows(flat, bad)
            for i in bad:
                self._one_record(batch, i, options, aliases_applied, mapped_rows, rejects)
            rejects.sort(key=lambda r: r["row"])
            mapped_rows.sort(key=lambda m: m[0])
            kept = self._kept_table(batch, mapped_rows, flat)
        rejected = REJECTED_SCHEMA.empty_table() if not rejects else pa.Table.from_arrays(
            [
                pa.array([r["id"] for r in rejects], pa.string()),
                pa.array([source] * len(rejects), pa.string()),
                pa.array([STAGE_NAME] * len(rejects), pa.string()),
                pa.array([r["reason"] for r in rejects], pa.string()),
                pa.array([r["detail"] for r in rejects], pa.string()),
                pa.array([r["record"] for r in rejects], pa.string()),
            ],
            schema=REJECTED_SCHEMA,
        )
        stats["kept"] = kept.num_rows
        formats = Counter(m.fmt for _, m, _ in mapped_rows)
        if flat.index:
            formats["alpaca"] += len(flat.index)
        stats["formats"] = dict(sorted(formats.items()))
        stats["reasons"] = dict(Counter(r["reason"] for r in rejects))
        stats["aliases"] = dict(aliases_applied)
        per_reason: Counter[str] = Counter()
        for r in rejects:
            if per_reason[r["reason"]] < MAX_EXAMPLES_PER_REASON:
                per_reason[r["reason"]] += 1
                stats["examples"].append({"id": r["id"], "reason": r["reason"], "detail": r["detail"],
                                          "text": _snippet(r["record"])})
        return Outcome(kept=kept, rejected=rejected, stats=stats)

    def _one_record(self, batch: RawBatch, i: int, options: SourceOptions, aliases_applied: Counter[str],
                    mapped_rows: list[tuple[int, _Mapped, str | None]], rejects: list[dict[str, Any]]) -> None:
        """The per-record path for row i: appends to ``mapped_rows`` or to ``rejects``."""
        error = batch.errors[i]
        if error is not None:
            raw = batch.raw[i]
            rejects.append({"row": i, "id": batch.row_id(i), "reason": error,
                            "detail": safe_text(batch.details[i] or error),
                            "record": safe_text(raw) if raw is not None else ""})
            return
        rec = batch.records[i]
        own_id: str | None = None
        try:
            if isinstance(rec, dict):
                rec = _apply_aliases(_without_nulls(rec), options.aliases, aliases_applied)
                own = rec.get("id")
                if isinstance(own, str | int) and not isinstance(own, bool) and str(own) != "":
                    own_id = str(own)
                    rec = {k: v for k, v in rec.items() if k != "id"}
            mapped = _map_record(rec, options)
            _check(mapped, self.allowed_roles, self.check_placeholders)
            if own_id is not None:
                mapped.meta["source_id"] = own_id
            if mapped.call_turns:
                mapped.meta["call_turns"] = mapped.call_turns
            problem = _unicode_problem(mapped)
            if problem is not None:
                raise _Reject("invalid_unicode", problem)
        except _Reject as r:
            rejects.append({"row": i, "id": batch.row_id(i), "reason": r.reason, "detail": safe_text(r.detail),
                            "record": _record_json(batch.records[i])})
            return
        except RecursionError:  # a record built in Python, nested past any reader's limit
            rejects.append({"row": i, "id": batch.row_id(i), "reason": "too_deep",
                            "detail": "the record nests too deeply to normalize",
                            "record": _record_json(batch.records[i])})
            return
        mapped_rows.append((i, mapped, own_id))

    def _kept_table(self, batch: RawBatch, mapped_rows: list[tuple[int, _Mapped, str | None]],
                    flat: FlatRows) -> pa.Table:
        """Kept rows of both paths, in input order."""
        source = batch.source
        n = len(mapped_rows)
        if not n and flat.index:
            return self._fast_table(batch, flat)
        slow = pa.Table.from_arrays(
            [
                pa.array([batch.row_id(i) for i, _, _ in mapped_rows], pa.string()),
                pa.array([source] * n, pa.string()),
                _messages_array([m.turns for _, m, _ in mapped_rows]),
                pa.array([m.label for _, m, _ in mapped_rows], pa.string()),
                pa.array([(m.meta_json or json_dumps(m.meta)) if m.meta else None for _, m, _ in mapped_rows],
                         pa.string()),
                pa.array([m.fmt for _, m, _ in mapped_rows], pa.string()),
            ],
            schema=self.schema,
        )
        if not flat.index:
            return slow
        fast = self._fast_table(batch, flat)
        order = sorted(range(n + len(flat.index)), key=([i for i, _, _ in mapped_rows] + flat.index).__getitem__)
        return pa.concat_tables([slow, fast]).take(order).combine_chunks()

    def _fast_table(self, batch: RawBatch, flat: FlatRows) -> pa.Table:
        source = batch.source
        k = len(flat.index)
        positions = pa.array(batch.positions if k == len(batch.positions) else
                             [batch.positions[i] for i in flat.index], pa.int64())
        return pa.Table.from_arrays(
            [
                pc.binary_join_element_wise(pa.scalar(f"{source}:"), positions.cast(pa.string()), ""),
                pa.repeat(source, k),
                two_turn_messages(flat.user, flat.assistant, MESSAGES_TYPE, MESSAGE_TYPE),
                pa.nulls(k, pa.string()),
                pa.nulls(k, pa.string()),
                pa.repeat("alpaca", k),
            ],
            schema=self.schema,
        )

    def absorb(self, stats: Sequence[Any]) -> None:
        for s in stats:
            if s is not None:
                _merge_stats(self._totals, s)

    def describe(self) -> dict[str, Any]:
        t = self._totals
        formats = sorted(t["formats"].items(), key=lambda kv: (-kv[1], kv[0]))
        reasons = sorted(t["reasons"].items(), key=lambda kv: (-kv[1], kv[0]))
        blocks: list[dict[str, Any]] = [
            {"type": "bar", "title": "Detected templates (kept rows)", "labels": [k for k, _ in formats],
             "series": {"rows": [v for _, v in formats]}},
        ]
        if reasons:
            blocks.append({"type": "bar", "title": "Rejected rows by reason", "labels": [k for k, _ in reasons],
                           "series": {"rows": [v for _, v in reasons]}})
        if t["aliases"]:
            blocks.append({"type": "table", "title": "Field aliases applied", "columns": ["alias", "rows"],
                           "rows": [[k, v] for k, v in sorted(t["aliases"].items())]})
        if t["examples"]:
            blocks.append({"type": "examples", "title": "Rejected examples",
                           "items": [{"id": e["id"], "label": e["reason"], "text": e["text"], "note": e["detail"]}
                                     for e in t["examples"]]})
        return {
            "title": "Template normalization",
            "summary": {"rows_in": t["rows_in"], "kept": t["kept"], "rejected": t["rows_in"] - t["kept"],
                        "check_placeholders": self.check_placeholders},
            "blocks": blocks,
        }


def _empty_stats() -> dict[str, Any]:
    return {"rows_in": 0, "kept": 0, "formats": {}, "reasons": {}, "aliases": {}, "examples": []}


def _merge_stats(total: dict[str, Any], s: dict[str, Any]) -> None:
    total["rows_in"] += s["rows_in"]
    total["kept"] += s["kept"]
    for key in ("formats", "reasons", "aliases"):
        for k, v in s[key].items():
            total[key][k] = total[key].get(k, 0) + v
    per_reason = Counter(e["reason"] for e in total["examples"])
    for e in s["examples"]:
        if len(total["examples"]) >= MAX_EXAMPLES:
            break
        if per_reason[e["reason"]] < MAX_EXAMPLES_PER_REASON:
            per_reason[e["reason"]] += 1
            total["examples"].append(e)
