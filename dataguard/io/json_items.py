"""Cutting an open JSON array into its items' bytes, in bounded memory.

This is the hot loop of reading a JSON array: depth is a cumulative sum over a chunk's
structural characters, and Python runs only at the array's own commas and brackets. An
item is judged before anything parses it: too large (hashed while it streams past, never
held whole), nested too deep, empty (a stray comma), or bytes for ``json.loads``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from dataguard.io.bounded import RAW_KEEP_BYTES, Oversize, oversize
from dataguard.io.json_problems import Item, empty_item, too_deep
from dataguard.io.json_structure import CLOSE_ARRAY, CLOSE_OBJECT, COMMA, OPEN_OBJECT, WHITESPACE
from dataguard.io.json_window import ByteWindow


class ItemCutter:
    """Items of the array opened at depth ``level`` whose first item starts at ``start``."""

    def __init__(self, level: int, start: int, max_bytes: int, max_depth: int, mark_every: int = 0) -> None:
        self.level = level
        self.depth = level
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.items = 0  # items emitted (records and problems alike)
        self.separators = 0  # commas seen at the array's level
        self.start = start  # where the array's first item starts
        self.item_start = start
        self.too_deep = False
        self.hasher: Any = None  # set once the open item is over max_bytes
        self.head = b""  # its first bytes, for the row that reports it
        self.hashed_to = 0
        # > 0: the input index's cutter. It notes where every mark_every-th item after a comma
        # starts, and only counts the items a comma ends (``counted``) instead of emitting them:
        # one row each, whatever they hold, so their bytes are never built.
        self.mark_every = mark_every
        self.marks: list[int] = []
        self.counted = 0

    def cut(self, pos: np.ndarray, kinds: np.ndarray, window: ByteWindow, out: list[Item]) -> tuple[int, int] | None:
        """Emit the items these events complete; returns (offset, code) of the bracket that
        closes the array (``]``, or a stray ``}``: then nothing is emitted for it), else None."""
        step = np.zeros(len(kinds), np.int64)
        step[kinds <= OPEN_OBJECT] = 1
        step[(kinds == CLOSE_ARRAY) | (kinds == CLOSE_OBJECT)] = -1
        after = self.depth + np.cumsum(step)
        level = self.level
        bounds = np.flatnonzero((after - step == level) & (kinds >= CLOSE_ARRAY) & (kinds <= COMMA))
        deep = np.flatnonzero((step == 1) & (after - level > self.max_depth))
        deep_before = np.searchsorted(deep, bounds).tolist()
        seen_deep = 0
        if self.mark_every and self.hasher is None:
            taken, seen_deep = self._count_commas(pos, kinds, bounds, deep_before)
            bounds, deep_before = bounds[taken:], deep_before[taken:]
        for b, n_deep in zip(bounds.tolist(), deep_before, strict=True):
            if n_deep > seen_deep:
                self.too_deep, seen_deep = True, n_deep
            p, k = int(pos[b]), int(kinds[b])
            if k == COMMA:
                self._end_item(p, window, out, closing=False)
                self.separators += 1
                if self.mark_every and self.items % self.mark_every == 0:
                    self.marks.append(p + 1)
                continue
            if k == CLOSE_OBJECT:
                return p, k
            self._end_item(p, window, out, closing=True)
            self.depth = level - 1
            return p, k
        if len(deep) > seen_deep:
            self.too_deep = True
        if len(after):
            self.depth = int(after[-1])
        return None

    def _count_commas(self, pos: np.ndarray, kinds: np.ndarray, bounds: np.ndarray,
                      deep_before: list[int]) -> tuple[int, int]:
        """Count mode: the commas before the chunk's first closing bracket end one item each.
        Returns how many bounds were taken and the deep brackets seen before the last of them."""
        run = int(np.argmax(kinds[bounds] != COMMA)) if (kinds[bounds] != COMMA).any() else len(bounds)
        if not run:
            return 0, 0
        at = pos[bounds[:run]]
        numbers = self.items + np.arange(1, run + 1)
        self.marks.extend((at[numbers % self.mark_every == 0] + 1).tolist())
        self.items += run
        self.counted += run
        self.separators += run
        self.item_start, self.too_deep = int(at[-1]) + 1, False
        return run, deep_before[run - 1]

    def _end_item(self, p: int, window: ByteWindow, out: list[Item], closing: bool) -> None:
        before = len(out)
        if self.hasher is not None:
            self._hash(window.slice(self.hashed_to, p))
            out.append(Oversize(self.head, p - self.item_start, self.hasher.hexdigest()))
        else:
            span = window.get(self.item_start, p)
            if not span.strip(WHITESPACE):
                if not (closing and self.separators == 0):  # "[]" is an empty array, "[1,]" is not
                    out.append(empty_item(p))
            elif len(span) > self.max_bytes:
                out.append(oversize(span))
            elif self.too_deep:
                out.append(too_deep(self.max_depth, span))
            else:
                out.append(span.strip(WHITESPACE))
        self.items += len(out) - before
        self.item_start, self.hasher, self.head, self.too_deep = p + 1, None, b"", False

    def partial(self, window: ByteWindow, end: int | None = None) -> bytes:
        """The first bytes of the open item (up to stream offset ``end``: where it was cut
        short, so the bytes do not depend on where a read ended)."""
        stop = window.end if end is None else end
        if self.hasher is None:
            return window.get(self.item_start, min(stop, self.item_start + RAW_KEEP_BYTES)).strip(WHITESPACE)
        head = self.head  # hashed up to the last read's end; the bytes after it are still held
        if len(head) < RAW_KEEP_BYTES and stop > self.hashed_to:
            head += window.get(self.hashed_to, min(stop, self.hashed_to + RAW_KEEP_BYTES - len(head)))
        return head[:min(stop - self.item_start, RAW_KEEP_BYTES)].strip(WHITESPACE)

    def keep_from(self, window: ByteWindow) -> int:
        """At the end of a chunk: the first stream offset still needed. An open item that grew
        past ``max_bytes`` is hashed from here on instead of kept."""
        if self.hasher is None and window.end - self.item_start > self.max_bytes:
            data = window.get(self.item_start)
            self.head, self.hasher = data[:RAW_KEEP_BYTES], hashlib.sha256(data)
        elif self.hasher is not None:
            self._hash(window.slice(self.hashed_to))
        if self.hasher is None:
            return self.item_start
        self.hashed_to = window.end
        return window.end

    def _hash(self, data: bytearray) -> None:
        """More of an oversized item: hashed, and its head topped up to ``RAW_KEEP_BYTES`` (a
        limit below that size must not make the head depend on where reads end)."""
        self.hasher.update(data)
        if len(self.head) < RAW_KEEP_BYTES:
            self.head += bytes(data[:RAW_KEEP_BYTES - len(self.head)])
