"""A side of each conversation (the non-empty contents of some roles, joined by newlines) as
pieces of the batch's message buffer: scored, measured or joined without a Python loop per
row and, for scoring, without building the joined strings at all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import flat_messages
from dataguard.text.repetition_kernel import join_segments


@dataclass
class MessagePieces:
    """The message contents of a batch, with each message's row and role."""

    content: pa.Array
    row_of: np.ndarray
    role_code: np.ndarray
    role_names: list[str]
    nonempty: np.ndarray
    n_rows: int

    def side(self, roles: Sequence[str]) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """(content, segments, groups) of one side: row t is ``content[segments[groups[t]:groups[t+1]]]``
        joined by newlines, the non-empty contents of these roles."""
        wanted = np.array([r in roles for r in self.role_names] + [False], dtype=bool)
        keep = wanted[self.role_code] & self.nonempty
        segments = np.flatnonzero(keep)
        counts = np.bincount(self.row_of[segments], minlength=self.n_rows)
        groups = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return self.content, segments, groups


def message_pieces(batch: pa.Table) -> MessagePieces | None:
    """The batch's messages as pieces (None for an empty batch)."""
    n = batch.num_rows
    if n == 0:
        return None
    lengths, flat = flat_messages(batch)
    content = flat.field("content")
    coded = pc.fill_null(flat.field("role"), "").dictionary_encode()
    names = coded.dictionary.to_pylist()
    role_code = coded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    nonempty = pc.fill_null(pc.greater(pc.binary_length(content), 0), False).to_numpy(zero_copy_only=False)
    return MessagePieces(content, np.repeat(np.arange(n, dtype=np.int64), lengths), role_code, names, nonempty, n)


def side_bytes(batch: pa.Table, roles: Sequence[str]) -> np.ndarray:
    """UTF-8 bytes of each row's side text, without building the text."""
    pieces = message_pieces(batch)
    if pieces is None:
        return np.zeros(0, dtype=np.int64)
    content, segments, groups = pieces.side(roles)
    lengths = pc.binary_length(content).to_numpy(zero_copy_only=False).astype(np.int64)
    cs = np.concatenate([[0], np.cumsum(lengths[segments])])
    return cs[groups[1:]] - cs[groups[:-1]] + np.maximum(np.diff(groups) - 1, 0)


def side_texts(batch: pa.Table, roles: Sequence[str]) -> pa.Array:
    """Contents of the given roles joined by newlines, one string per row (Arrow, no Python loop)."""
    pieces = message_pieces(batch)
    if pieces is None:
        return pa.array([], pa.string())
    return join_segments(*pieces.side(roles))
