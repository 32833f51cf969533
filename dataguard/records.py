"""The canonical record and rejected-row schemas, defined once.

Every stage reads and writes `pyarrow.Table`s whose first five columns follow
`CANONICAL_SCHEMA`; stages append score columns after them. Rejected rows always
follow `REJECTED_SCHEMA` so that they can be concatenated across stages.

Preference pairs (DPO rows) have one canonical form: the prompt turns, then the chosen
response as the final assistant turn, and the rejected response, as a plain string, in
``meta["rejected"]``. Why there and not in a ``rejected`` column: a new column would change
the schema, and so the bytes, of every run's shards, preference data or not, and a column
added only to preference runs would give two shard schemas that every reader (the
trainer, the report, a user's code) must tell apart. The meta field costs a JSON parse per
pair, which the accessors below do only for rows whose meta names ``"rejected"``. Stages
never parse meta themselves for it: they ask `rejected_texts` (the rejected response of
each row, None for other rows) or `pair_responses` (both responses), and write a changed
rejected response back with `with_rejected`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROLES = ("system", "user", "assistant", "tool")
# The two sides of a conversation, defined here once for every stage, feature and trainer:
# the prompt side is everything the model is conditioned on, the response side everything
# it is trained to produce.
PROMPT_ROLES = ("system", "user", "tool")
RESPONSE_ROLES = ("assistant",)
SIDE_ROLES = {"prompt": PROMPT_ROLES, "response": RESPONSE_ROLES, "full": ROLES}

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
MESSAGES_TYPE = pa.list_(MESSAGE_TYPE)

CANONICAL_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("messages", MESSAGES_TYPE),
        ("label", pa.string()),
        ("meta", pa.string()),
    ]
)
CANONICAL_COLUMNS = tuple(CANONICAL_SCHEMA.names)

REJECTED_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("stage", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        # JSON of the canonical row (with its score columns) or, when the input could
        # not be parsed, the raw input text itself.
        ("record", pa.string()),
    ]
)


def _json_default(value: Any) -> Any:
    """numpy scalars/arrays, sets and other odd values as plain JSON."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def json_dumps(value: Any) -> str:
    """Deterministic compact JSON (sorted keys) so identical input gives identical bytes.

    Text holding a lone surrogate (``"\\ud800"`` from a JSON escape) cannot be stored as
    UTF-8; such a value is written with ``\\uXXXX`` escapes instead (still the same JSON).
    """
    return json_text(value)[0]


def json_text(value: Any) -> tuple[str, bool]:
    """(``json_dumps(value)``, whether a lone surrogate had to be escaped to write it)."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=_json_default)
    if not has_surrogates(text):
        return text, False
    return json.dumps(value, ensure_ascii=True, sort_keys=True, separators=(",", ":"), default=_json_default), True


def has_surrogates(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate, which no UTF-8 writer (Arrow) accepts."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def safe_text(text: Any) -> Any:
    """``text`` with any lone surrogate written as ``\\udXXX`` (a no-op for valid text and non-text)."""
    if not isinstance(text, str) or not has_surrogates(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def canonical_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Build a canonical table from python dicts with keys id/source/messages/label/meta."""
    return pa.Table.from_pylist(
        [
            {
                "id": r["id"],
                "source": r["source"],
                "messages": [{"role": m["role"], "content": m["content"]} for m in r["messages"]],
                "label": r.get("label"),
                "meta": r.get("meta"),
            }
            for r in rows
        ],
        schema=CANONICAL_SCHEMA,
    )


def empty_canonical() -> pa.Table:
    return CANONICAL_SCHEMA.empty_table()


def empty_rejected() -> pa.Table:
    return REJECTED_SCHEMA.empty_table()


def rejected_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows with keys id, source, stage, reason, detail, record (all strings; a lone
    surrogate is escaped so that a bad byte in a detail can never fail the write)."""
    rows = list(rows)
    if not rows:
        return empty_rejected()
    return pa.Table.from_pylist(
        [{name: safe_text(row.get(name)) for name in REJECTED_SCHEMA.names} for row in rows],
        schema=REJECTED_SCHEMA,
    )


def reject_rows(table: pa.Table, mask: Sequence[bool] | pa.Array, stage: str,
                reasons: Sequence[str] | str, details: Sequence[str] | str | None = None) -> pa.Table:
    """Turn the rows of `table` selected by `mask` into rejected rows.

    `reasons`/`details` are either one value for all selected rows or one value per
    selected row (in order). The full row, score columns included, is kept as JSON so a
    user can see exactly what the stage saw.
    """
    mask_arr = pa.array(mask, type=pa.bool_()) if not isinstance(mask, pa.Array) else mask
    picked = table.filter(mask_arr)
    n = picked.num_rows
    if n == 0:
        return empty_rejected()
    reason_list = [reasons] * n if isinstance(reasons, str) else list(reasons)
    if details is None:
        detail_list: list[str | None] = [None] * n
    elif isinstance(details, str):
        detail_list = [details] * n
    else:
        detail_list = list(details)
    if len(reason_list) != n or len(detail_list) != n:
        raise ValueError(f"reject_rows: {n} rows selected but {len(reason_list)} reasons / {len(detail_list)} details")
    records = [json_dumps(row) for row in picked.to_pylist()]
    return pa.Table.from_arrays(
        [
            picked.column("id").combine_chunks() if "id" in picked.column_names else pa.nulls(n, pa.string()),
            picked.column("source").combine_chunks() if "source" in picked.column_names else pa.nulls(n, pa.string()),
            pa.array([stage] * n, pa.string()),
            pa.array(reason_list, pa.string()),
            pa.array([safe_text(d) for d in detail_list], pa.string()),
            pa.array(records, pa.string()),
        ],
        schema=REJECTED_SCHEMA,
    )


def set_column(table: pa.Table, field: str | pa.Field, values: pa.Array) -> pa.Table:
    """Replace a column in place (keeping its position) or append it: how stages add scores."""
    name = field.name if isinstance(field, pa.Field) else field
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), field, values)
    return table.append_column(field, values)


def flat_messages(table: pa.Table) -> tuple[np.ndarray, pa.StructArray]:
    """(number of messages of each row, every message of the table as one struct array):
    the columnar view stages use to score messages without a Python loop per row."""
    msgs = table.column("messages").combine_chunks()
    counts = pc.fill_null(pc.list_value_length(msgs), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return counts, msgs.flatten()


def message_texts(table: pa.Table, roles: Iterable[str]) -> list[str]:
    """Join the contents of the messages with the given roles, one string per row.

    Used for a side of a conversation (``SIDE_ROLES``: the prompt side, the response side).
    """
    wanted = set(roles)
    out = []
    for msgs in table.column("messages").to_pylist():
        out.append("\n".join(m["content"] for m in (msgs or []) if m["role"] in wanted and m["content"]))
    return out


def prompt_texts(table: pa.Table) -> list[str]:
    """The prompt side of each row (``PROMPT_ROLES``: system, user and tool turns)."""
    return message_texts(table, PROMPT_ROLES)


def response_texts(table: pa.Table) -> list[str]:
    """The response side of each row (``RESPONSE_ROLES``: assistant turns)."""
    return message_texts(table, RESPONSE_ROLES)


def full_texts(table: pa.Table) -> list[str]:
    return message_texts(table, ROLES)


REJECTED_KEY = "rejected"
_REJECTED_MARK = f'"{REJECTED_KEY}":'  # how json_dumps writes the key: rows without it are no pairs


def rejected_of(meta: Any) -> str | None:
    """The rejected response a row's meta (JSON text, or the parsed object) holds, or None."""
    if meta is None:
        return None
    try:
        value = json.loads(meta) if isinstance(meta, str) else meta
    except ValueError:
        return None
    rejected = value.get(REJECTED_KEY) if isinstance(value, dict) else None
    return rejected if isinstance(rejected, str) else None


def _pair_rows(table: pa.Table) -> np.ndarray:
    """Positions of the rows whose meta may hold a rejected response (a cheap substring test)."""
    if table.num_rows == 0 or "meta" not in table.column_names:
        return np.zeros(0, np.int64)
    hits = pc.fill_null(pc.match_substring(table.column("meta"), _REJECTED_MARK), False)
    return np.flatnonzero(hits.to_numpy(zero_copy_only=False))


def rejected_texts(table: pa.Table) -> list[str | None]:
    """The rejected response of each row: a string for a preference pair, None otherwise."""
    out: list[str | None] = [None] * table.num_rows
    rows = _pair_rows(table)
    if len(rows):
        metas = table.column("meta").take(pa.array(rows)).to_pylist()
        for i, meta in zip(rows.tolist(), metas, strict=True):
            out[i] = rejected_of(meta)
    return out


def has_pairs(table: pa.Table) -> bool:
    """Whether any row of the table is a preference pair."""
    return any(r is not None for r in rejected_texts(table))


def pair_responses(table: pa.Table) -> list[tuple[str, str] | None]:
    """(chosen, rejected) of each preference pair (the final assistant turn and
    ``meta["rejected"]``), None for other rows: "the two responses of this row"."""
    rejected = rejected_texts(table)
    out: list[tuple[str, str] | None] = [None] * len(rejected)
    pairs = [i for i, r in enumerate(rejected) if r is not None]
    if not pairs:
        return out
    msgs = table.column("messages").take(pa.array(pairs)).to_pylist()
    for i, turns in zip(pairs, msgs, strict=True):
        if turns and turns[-1]["role"] == "assistant":
            out[i] = (turns[-1]["content"] or "", rejected[i] or "")
    return out


def with_rejected(table: pa.Table, texts: Mapping[int, str]) -> pa.Table:
    """The table with the rejected response of the rows in ``texts`` (position -> text)
    replaced, e.g. after truncation or masking; every other meta value stays byte-equal."""
    if not texts:
        return table
    metas = table.column("meta").to_pylist()
    for i, text in texts.items():
        value = json.loads(metas[i])
        value[REJECTED_KEY] = text
        metas[i] = json_dumps(value)
    return set_column(table, "meta", pa.array(metas, pa.string()))
