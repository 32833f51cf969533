"""Numeric features a drift check can compute itself from the canonical ``messages``.

A reference file (a validation split, a sample of production prompts) usually has no
score columns; these features need nothing but the conversation, so they exist on both
sides of a comparison. Score columns added by other stages (``n_tokens``, ...) are used
as they are when both tables carry them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import PROMPT_ROLES, RESPONSE_ROLES, message_texts


def _chars(roles: tuple[str, ...]) -> Callable[[pa.Table], np.ndarray]:
    def f(table: pa.Table) -> np.ndarray:
        arr = pa.array(message_texts(table, roles), pa.string())
        return pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.float64)
    return f


def _words(roles: tuple[str, ...]) -> Callable[[pa.Table], np.ndarray]:
    def f(table: pa.Table) -> np.ndarray:
        arr = pa.array(message_texts(table, roles), pa.string())
        return pc.count_substring_regex(arr, r"\S+").to_numpy(zero_copy_only=False).astype(np.float64)
    return f


def _n_messages(table: pa.Table) -> np.ndarray:
    return pc.list_value_length(table.column("messages")).fill_null(0).to_numpy().astype(np.float64)


DERIVED_FEATURES: dict[str, Callable[[pa.Table], np.ndarray]] = {
    "prompt_chars": _chars(PROMPT_ROLES),
    "prompt_words": _words(PROMPT_ROLES),
    "response_chars": _chars(RESPONSE_ROLES),
    "response_words": _words(RESPONSE_ROLES),
    "n_messages": _n_messages,
}


def has_feature(table_columns: list[str], name: str) -> bool:
    return name in table_columns or (name in DERIVED_FEATURES and "messages" in table_columns)


def numeric_feature(table: pa.Table, name: str) -> np.ndarray:
    """The column ``name`` as float64 (nulls -> NaN), or the derived feature of that name."""
    if name in table.column_names:
        col = table.column(name)
        if table.num_rows == 0:
            return np.empty(0, dtype=np.float64)
        return np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    if name in DERIVED_FEATURES and "messages" in table.column_names:
        if table.num_rows == 0:
            return np.empty(0, dtype=np.float64)
        return DERIVED_FEATURES[name](table)
    raise KeyError(name)
