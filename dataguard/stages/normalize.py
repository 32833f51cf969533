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

Aliases (``SourceOptions.aliases`` per input, ``aliases`` of the normalizer for every input;
source path -> destination, e.g. ``question -> instruction``, ``conversations[].speaker ->
from``, ``entities.uid -> user_id``) rename or move fields before detection; a renamed field
wins over one already there, whose value is kept as ``"<name>:shadowed"``. The path syntax
and rules are in ``dataguard/stages/normalize_aliases.py``. An alias that matched no record
of its input is an error when the run's statistics are absorbed (``absorb``).

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
* ``unfilled_placeholder``: a template slot left in the text: ``{{name}}`` / ``{{ user.name }}``
  or ``<<name>>`` by default, with an identifier inside (so ``<< impossible>>``, ``a < b > c``
  and GSM8K's ``<<48/2=24>>`` are text); ``{name}``, ``<name>`` and ``[name]`` when
  ``placeholder_styles`` asks for them. Markdown code, HTML tags, special tokens and
  ``${{ ... }}`` / LaTeX braces are never slots. The rule and why the single-bracket shapes
  are opt-in: ``dataguard/stages/normalize_placeholders.py``.
* ``unknown_role`` (a role name we cannot map), ``disallowed_role`` (mapped role not in
  ``allowed_roles``), ``wrong_type`` (a field or content of the wrong JSON type),
  ``non_text_content`` (an image/audio content part), ``missing_field`` (a forced format's
  anchor field is absent, or a labelled text's label is empty), ``unknown_format`` (no
  template fits), ``not_an_object`` (the record is not a JSON object), ``invalid_unicode``
  (a text holds a lone surrogate, which cannot be written as UTF-8; readers reject these
  first, this covers records built in Python), ``too_deep`` (a record built in Python that
  nests too deeply to encode). Reader errors (``invalid_json``, ``invalid_utf8``,
  ``too_deep``, ``record_too_large``, ...) pass through with the raw text in ``record``.

Modules: ``normalize_templates`` (detect, map and check one record), ``normalize_flat`` (the
column-wise fast path for plain Alpaca rows), ``normalize_aliases`` (alias paths),
``normalize_placeholders`` (the slot rule); this one builds the tables and statistics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
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
from dataguard.stages.normalize_aliases import (
    AliasPlan,
    alias_counts,
    alias_plan,
    apply_aliases,
    unmatched_alias,
)
from dataguard.stages.normalize_flat import (
    FlatRows,
    plain_alpaca_rows,
    rows_with_surrogates,
    two_turn_messages,
    without_rows,
)
from dataguard.stages.normalize_placeholders import DEFAULT_STYLES, find_placeholders
from dataguard.stages.normalize_placeholders import placeholder_styles as _styles
from dataguard.stages.normalize_templates import Mapped as _Mapped
from dataguard.stages.normalize_templates import Reject as _Reject
from dataguard.stages.normalize_templates import check_mapped as _check
from dataguard.stages.normalize_templates import map_record as _map_record

FORMATS = ("alpaca", "sharegpt", "messages", "dolly", "prompt_completion", "labelled_text")
STAGE_NAME = "normalize"

MAX_EXAMPLES_PER_REASON = 3
MAX_EXAMPLES = 20
SNIPPET_CHARS = 300

__all__ = ["FORMATS", "Normalizer", "find_placeholders"]


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

    def __init__(self, *, check_placeholders: bool = True, allowed_roles: Iterable[str] = ROLES,
                 placeholder_styles: Iterable[str] | None = None, aliases: Mapping[str, str] | None = None) -> None:
        if not isinstance(check_placeholders, bool):
            raise StageConfigError(f"check_placeholders must be true or false, got {check_placeholders!r}")
        if aliases is not None and not (isinstance(aliases, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in aliases.items())):
            raise StageConfigError(f"aliases must be a mapping of source field -> canonical field, got {aliases!r}",
                                   param="aliases")
        self.aliases: dict[str, str] = dict(aliases or {})
        alias_plan(self.aliases, {}, "(every input)")  # a bad path is a config error now, not in a worker
        if isinstance(allowed_roles, str) or not isinstance(allowed_roles, Iterable):
            raise StageConfigError(f"allowed_roles must be a list of roles, got {allowed_roles!r}")
        roles = list(allowed_roles)
        bad = [r for r in roles if r not in ROLES]
        if bad or not roles:
            raise StageConfigError(f"allowed_roles must be a non-empty subset of {list(ROLES)}, got {roles!r}")
        self.check_placeholders = check_placeholders
        self.placeholder_styles = _styles(placeholder_styles)
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
        plan = alias_plan(self.aliases, options.aliases, options.name)
        styles = self.placeholder_styles if self.check_placeholders else None
        flat = FlatRows([], [], []) if plan else plain_alpaca_rows(
            batch.records, batch.errors, options, self.allowed_roles, self.check_placeholders, styles=styles)
        if len(flat.index) == len(batch):
            slow_rows: list[int] | range = []
        elif not flat.index:
            slow_rows = range(len(batch))
        else:
            taken = set(flat.index)
            slow_rows = [i for i in range(len(batch)) if i not in taken]
        for i in slow_rows:
            self._one_record(batch, i, options, plan, aliases_applied, mapped_rows, rejects)
        try:
            kept = self._kept_table(batch, mapped_rows, flat)
        except UnicodeEncodeError:
            # A fast-path text holds a lone surrogate: only records built in Python get here
            # (readers reject these rows first), so this costs the hot path nothing. Such
            # rows take the per-record path, which says why they are rejected.
            bad = rows_with_surrogates(flat)
            flat = without_rows(flat, bad)
            for i in bad:
                self._one_record(batch, i, options, plan, aliases_applied, mapped_rows, rejects)
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
        if plan:
            stats["alias_inputs"] = {options.name: alias_counts(batch, options, self.aliases, aliases_applied)}
        per_reason: Counter[str] = Counter()
        for r in rejects:
            if per_reason[r["reason"]] < MAX_EXAMPLES_PER_REASON:
                per_reason[r["reason"]] += 1
                stats["examples"].append({"id": r["id"], "reason": r["reason"], "detail": r["detail"],
                                          "text": _snippet(r["record"])})
        return Outcome(kept=kept, rejected=rejected, stats=stats)

    def _one_record(self, batch: RawBatch, i: int, options: SourceOptions, plan: AliasPlan,
                    aliases_applied: Counter[str], mapped_rows: list[tuple[int, _Mapped, str | None]],
                    rejects: list[dict[str, Any]]) -> None:
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
                rec = _without_nulls(rec)
                if plan:
                    rec = apply_aliases(rec, plan, aliases_applied)
                own = rec.get("id")
                if isinstance(own, str | int) and not isinstance(own, bool) and str(own) != "":
                    own_id = str(own)
                    rec = {k: v for k, v in rec.items() if k != "id"}
            mapped = _map_record(rec, options)
            _check(mapped, self.allowed_roles, self.placeholder_styles if self.check_placeholders else None)
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
        """Merge the batches' statistics; then an alias that matched no record of its input
        (or, given to the normalizer for every input, of any input) is an ``InputError``."""
        for s in stats:
            if s is not None:
                _merge_stats(self._totals, s)
        problem = unmatched_alias(self._totals.get("alias_inputs", {}))
        if problem is not None:
            from dataguard.io.bounded import InputError

            raise InputError(problem)

    def describe(self) -> dict[str, Any]:
        styles = self.placeholder_styles if self.check_placeholders else None
        return _describe(self._totals, self.check_placeholders, styles)

def _empty_stats() -> dict[str, Any]:
    return {"rows_in": 0, "kept": 0, "formats": {}, "reasons": {}, "aliases": {}, "examples": []}


def _merge_stats(total: dict[str, Any], s: dict[str, Any]) -> None:
    total["rows_in"] += s["rows_in"]
    total["kept"] += s["kept"]
    for key in ("formats", "reasons", "aliases"):
        for k, v in s[key].items():
            total[key][k] = total[key].get(k, 0) + v
    for source, counts in s.get("alias_inputs", {}).items():
        into = total.setdefault("alias_inputs", {}).setdefault(
            source, {"path": counts["path"], "records": 0, "input": {}, "global": {}})
        into["records"] += counts["records"]
        for scope in ("input", "global"):
            for k, v in counts[scope].items():
                into[scope][k] = into[scope].get(k, 0) + v
    per_reason = Counter(e["reason"] for e in total["examples"])
    for e in s["examples"]:
        if len(total["examples"]) >= MAX_EXAMPLES:
            break
        if per_reason[e["reason"]] < MAX_EXAMPLES_PER_REASON:
            per_reason[e["reason"]] += 1
            total["examples"].append(e)


def _describe(t: dict[str, Any], check_placeholders: bool, styles: tuple[str, ...] | None) -> dict[str, Any]:
    """The report blocks of the merged statistics (styles are shown only when not the default)."""
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
    summary = {"rows_in": t["rows_in"], "kept": t["kept"], "rejected": t["rows_in"] - t["kept"],
               "check_placeholders": check_placeholders}
    if styles is not None and styles != DEFAULT_STYLES:
        summary["placeholder_styles"] = list(styles)
    return {"title": "Template normalization", "summary": summary, "blocks": blocks}
