"""Batch fast path of normalization for plain Alpaca records.

Most instruction data is plain ``{instruction, input, output}`` rows. For those, the
per-record path (detect, map, check, one Python call chain per row) costs ~25 us/row, ten
times the work itself. Here the same decisions are made column-wise with list
comprehensions over the whole batch. Only rows that provably pass every check take this
path; anything unusual (other keys, wrong types, empty turns, a possible placeholder, a
forced non-Alpaca format, aliases, a role set without user/assistant) goes through the
per-record path, which gives the exact reason code. ``tests/test_normalize_flat.py`` checks
that both paths produce identical tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.io.raw import SourceOptions
from dataguard.stages.normalize_placeholders import DEFAULT_STYLES, may_hold_placeholder

__all__ = ["FlatRows", "may_hold_placeholder", "plain_alpaca_rows", "two_turn_messages"]

PLAIN_KEYS = frozenset({"instruction", "input", "output"})


@dataclass
class FlatRows:
    """Rows (indices into the batch) mapped by the fast path, with their two turns."""

    index: list[int]
    user: list[str]
    assistant: list[str]


def plain_alpaca_rows(records: Sequence[Any], errors: Sequence[str | None], options: SourceOptions,
                      allowed_roles: frozenset[str], check_placeholders: bool,
                      styles: tuple[str, ...] | None = DEFAULT_STYLES) -> FlatRows:
    """The rows of a batch that are plain Alpaca records passing every normalization check
    (``styles``: the placeholder shapes checked, see normalize_placeholders.py)."""
    empty = FlatRows([], [], [])
    if options.format not in ("auto", "alpaca") or options.aliases or not {"user", "assistant"} <= allowed_roles:
        return empty
    # Shape: a dict with only Alpaca keys, string instruction and output, string-or-absent
    # input. One pass over the (cache-cold) dicts pulls the three fields out together.
    rows = [(i, r.get("instruction"), r.get("input", ""), r.get("output"))
            for i, r in enumerate(records) if type(r) is dict and r.keys() <= PLAIN_KEYS and errors[i] is None]
    rows = [t for t in rows if type(t[1]) is str and type(t[3]) is str and type(t[2]) is str]
    if not rows:
        return empty
    idx = [t[0] for t in rows]
    # The user turn: instruction and input joined by "\n", empty parts skipped (as _join does).
    users = [(a + "\n" + b if b else a) if a else b for _, a, b, _ in rows]
    outs = [t[3] for t in rows]
    # Checks: both turns have text; nothing that could be an unfilled slot (for the default
    # styles: no "{{" / "<<"; those rows take the per-record path, which knows about code
    # blocks, identifiers and GSM8K annotations).
    if check_placeholders and styles is not None:
        may = may_hold_placeholder if styles == DEFAULT_STYLES else partial(may_hold_placeholder, styles=styles)
        ok = [bool(u.strip()) and bool(o.strip()) and not may(u) and not may(o)
              for u, o in zip(users, outs, strict=True)]
    else:
        ok = [bool(u.strip()) and bool(o.strip()) for u, o in zip(users, outs, strict=True)]
    if not all(ok):
        keep = [j for j, good in enumerate(ok) if good]
        idx, users, outs = [idx[j] for j in keep], [users[j] for j in keep], [outs[j] for j in keep]
    return FlatRows(idx, users, outs)


def two_turn_messages(users: list[str], assistants: list[str], messages_type: pa.DataType,
                      message_type: pa.DataType) -> pa.Array:
    """The messages column [{user}, {assistant}] per row, built from flat buffers (the text is
    copied into Arrow once, already interleaved)."""
    n = len(users)
    contents: list[str | None] = [None] * (2 * n)
    contents[0::2] = users
    contents[1::2] = assistants
    roles = pa.array(["user", "assistant"], pa.string()).take(pa.array(np.tile(np.array([0, 1]), n)))
    values = pa.StructArray.from_arrays([roles, pa.array(contents, pa.string())], fields=list(message_type))
    offsets = pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, values).cast(messages_type)


def rows_with_surrogates(flat: FlatRows) -> list[int]:
    """Batch indices of fast-path rows whose text holds a lone surrogate (no UTF-8 writer
    accepts it). Called only after Arrow refused the batch, so it may look row by row."""
    return [i for i, u, a in zip(flat.index, flat.user, flat.assistant, strict=True)
            if not _encodable(u) or not _encodable(a)]


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def without_rows(flat: FlatRows, rows: list[int]) -> FlatRows:
    """``flat`` without the given batch indices."""
    drop = set(rows)
    keep = [j for j, i in enumerate(flat.index) if i not in drop]
    return FlatRows([flat.index[j] for j in keep], [flat.user[j] for j in keep], [flat.assistant[j] for j in keep])
