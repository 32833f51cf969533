"""Template normalization: every raw input record becomes one canonical conversation or a reject.

The pipeline calls `Normalizer.normalize` first on every `RawBatch`. Per record it applies
the source's field aliases, detects the template (or uses the forced one), maps it to
``messages`` [{role, content}] with roles ``system``/``user``/``assistant``/``tool``, and
checks the result. Anything that does not fit becomes a rejected row with a reason code.

The templates (one module each: detect, map, optional batch map) and the record checks
(one list, run by both paths) are in ``dataguard/formats``; their docstrings list the
fields and reason codes. This module is the stage around them: aliases, ids, the batch and
per-record paths, tables (``normalize_tables``) and statistics (``normalize_stats``).

Aliases (``SourceOptions.aliases`` per input, ``aliases`` of the normalizer for every input;
source path -> destination, e.g. ``question -> instruction``, ``conversations[].speaker ->
from``, ``entities.uid -> user_id``) rename or move fields before detection; a renamed field
wins over one already there, whose value is kept as ``"<name>:shadowed"``. The path syntax
and rules are in ``dataguard/stages/normalize_aliases.py``. An alias that matched no record
of its input is an error when the run's statistics are absorbed (``absorb``).

Fields that have no column go into ``meta`` as deterministic JSON; null-valued fields carry
nothing: they are dropped, and count as absent when the template is detected (a dataset
concatenated from several formats has every format's columns, null where a row is of
another format). The id is always ``RawBatch.row_id`` (``"<source>:<position>"``), unique
across the whole run by construction (source names are unique, positions are file order)
even when a file repeats its own ids; a record's own ``id`` is kept in ``meta["source_id"]``.

Reason codes of the stage itself: ``invalid_unicode`` (a text holds a lone surrogate, which
cannot be written as UTF-8; readers reject these first, this covers records built in
Python), ``too_deep`` (a record built in Python that nests too deeply to encode). Reader
errors (``invalid_json``, ``invalid_utf8``, ``too_deep``, ``record_too_large``, ...) pass
through with the raw text in ``record``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from dataguard import formats
from dataguard.formats import FORMATS, Context, Mapped, Reject, TwoTurnRows
from dataguard.formats.placeholders import STYLES, find_placeholders
from dataguard.formats.placeholders import placeholder_styles as _styles
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.io.reasons import READER_REASONS
from dataguard.params import FLAG, ListOf, MapOf, Options, Text
from dataguard.records import CANONICAL_SCHEMA, ROLES, has_surrogates, json_dumps, json_text, safe_text
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.stages.normalize_aliases import (
    AliasPlan,
    alias_counts,
    alias_plan,
    apply_aliases,
    unmatched_alias,
)
from dataguard.stages.normalize_stats import add_alias_counts, batch_stats, describe, totals
from dataguard.stages.normalize_tables import MappedRow, kept_table, rejected_table, unwritable
from dataguard.stages.pair_balance import describe_balance, tally_pairs

STAGE_NAME = "normalize"

__all__ = ["FORMATS", "Normalizer", "find_placeholders"]


def _without_nulls(rec: dict[str, Any]) -> dict[str, Any]:
    """A null field counts as absent (a concatenated dataset has every format's columns,
    null where the row is of another format)."""
    if None not in rec.values():
        return rec
    return {k: v for k, v in rec.items() if v is not None}


def _unicode_problem(mapped: Mapped) -> str | None:
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


class Normalizer(Stage):
    """Maps raw records of any supported template to canonical rows (see module docstring)."""

    name = STAGE_NAME
    constraints = {
        "check_placeholders": FLAG,
        "allowed_roles": [ListOf(Options(*ROLES), min_len=1)],
        "placeholder_styles": [ListOf(Options(*STYLES), min_len=1), None],
        "aliases": [MapOf(Text(), Text()), None],
    }
    # Rows that never became a record (the readers' codes) are rejected here too.
    reasons = {**formats.REASONS, **READER_REASONS,
               "invalid_unicode": "a text holds a lone surrogate (from a JSON escape), which UTF-8 cannot hold"}

    def __init__(self, *, check_placeholders: bool = True, allowed_roles: Iterable[str] = ROLES,
                 placeholder_styles: Iterable[str] | None = None, aliases: Mapping[str, str] | None = None) -> None:
        self.aliases: dict[str, str] = dict(aliases or {})
        alias_plan(self.aliases, {}, "(every input)")  # a bad path is a config error now, not in a worker
        roles = list(allowed_roles)
        self.check_placeholders = check_placeholders
        self.placeholder_styles = _styles(placeholder_styles)
        self.allowed_roles = frozenset(roles)

    def output_columns(self) -> dict[str, pa.DataType]:
        return {"format": pa.string()}

    @property
    def schema(self) -> pa.Schema:
        return CANONICAL_SCHEMA.append(pa.field("format", pa.string()))

    @property
    def _context(self) -> Context:
        return Context(self.allowed_roles, self.placeholder_styles if self.check_placeholders else None)

    def normalize(self, batch: RawBatch, options: SourceOptions) -> Outcome:
        """Canonical rows (+ ``format``) and rejected rows for one raw batch."""
        if options.format != "auto" and options.format not in FORMATS:
            raise StageConfigError(f"format for input {options.name!r} must be auto or one of {', '.join(FORMATS)}, "
                                   f"got {options.format!r}")
        aliases_applied: Counter[str] = Counter()
        mapped_rows: list[MappedRow] = []
        rejects: list[dict[str, Any]] = []
        plan = alias_plan(self.aliases, options.aliases, options.name)
        ctx = self._context
        # Aliases change what a record holds, so aliased inputs take the per-record path.
        groups = [] if plan else formats.map_batch(batch.records, batch.errors, options, ctx)
        for i in _rest_of(len(batch), groups):
            self._one_record(batch, i, options, plan, ctx, aliases_applied, mapped_rows, rejects)
        try:
            kept = kept_table(batch, mapped_rows, groups, self.schema)
        except UnicodeEncodeError:
            # A batch-path text holds a lone surrogate: only records built in Python get here
            # (readers reject these rows first), so this costs the hot path nothing. Such
            # rows take the per-record path, which says why they are rejected.
            for g, rows in enumerate(groups):
                bad = set(unwritable(rows))
                groups[g] = rows.keep([j for j, i in enumerate(rows.index) if i not in bad])
                for i in sorted(bad):
                    self._one_record(batch, i, options, plan, ctx, aliases_applied, mapped_rows, rejects)
            groups = [rows for rows in groups if rows.index]
            rejects.sort(key=lambda r: r["row"])
            mapped_rows.sort(key=lambda m: m[0])
            kept = kept_table(batch, mapped_rows, groups, self.schema)
        formats_seen = Counter(m.fmt for _, m, _ in mapped_rows)
        for rows in groups:
            formats_seen[rows.fmt] += len(rows.index)
        stats = batch_stats(len(batch), kept.num_rows, formats_seen, rejects, aliases_applied)
        tally_pairs(kept, stats)
        if plan:
            add_alias_counts(stats, options.name, alias_counts(batch, options, self.aliases, aliases_applied))
        return Outcome(kept=kept, rejected=rejected_table(batch.source, STAGE_NAME, rejects), stats=stats)

    def _one_record(self, batch: RawBatch, i: int, options: SourceOptions, plan: AliasPlan, ctx: Context,
                    aliases_applied: Counter[str], mapped_rows: list[MappedRow],
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
            mapped = formats.map_record(rec, options)
            formats.check_record(mapped, ctx)
            if own_id is not None:
                mapped.meta["source_id"] = own_id
            if mapped.call_turns:
                mapped.meta["call_turns"] = mapped.call_turns
            problem = _unicode_problem(mapped)
            if problem is not None:
                raise Reject("invalid_unicode", problem)
        except Reject as r:
            rejects.append({"row": i, "id": batch.row_id(i), "reason": r.reason, "detail": safe_text(r.detail),
                            "record": _record_json(batch.records[i])})
            return
        except RecursionError:  # a record built in Python, nested past any reader's limit
            rejects.append({"row": i, "id": batch.row_id(i), "reason": "too_deep",
                            "detail": "the record nests too deeply to normalize",
                            "record": _record_json(batch.records[i])})
            return
        mapped_rows.append((i, mapped, own_id))

    def absorb(self, stats: Sequence[Any]) -> None:
        """Merge the batches' statistics; then an alias that matched no record of its input
        (or, given to the normalizer for every input, of any input) is an ``InputError``."""
        super().absorb(stats)
        problem = unmatched_alias(totals(self.tally).get("alias_inputs", {}))
        if problem is not None:
            from dataguard.io.bounded import InputError

            raise InputError(problem)

    def describe(self) -> dict[str, Any]:
        styles = self.placeholder_styles if self.check_placeholders else None
        out = describe(totals(self.tally), self.check_placeholders, styles)
        pairs = describe_balance(self.tally)
        if pairs is not None:  # preference runs only: other reports stay the same
            out["pairs"] = pairs
        return out


def _rest_of(n: int, groups: list[TwoTurnRows]) -> Sequence[int]:
    """Batch indices the batch path did not take, in order."""
    taken = sum(len(rows.index) for rows in groups)
    if taken == n:
        return ()
    if not taken:
        return range(n)
    done = {i for rows in groups for i in rows.index}
    return [i for i in range(n) if i not in done]
