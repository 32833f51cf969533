"""Reading a JSON array item by item without parsing it: ``JsonArrayFramer`` cuts the
array (top-level, or under a key) into its items' bytes, so each one is size- and
depth-checked before ``json.loads`` sees it.

The framer is the state machine that ties four parts together, one job each:
``json_structure`` (structural characters outside strings, ``JsonScanner``),
``json_keypath`` (walking an object down to the array), ``json_items`` (cutting the array
into items in bounded memory) and ``json_problems`` (what is reported instead of an item).
The readers import all of these names from here.
"""

from __future__ import annotations

import numpy as np

from dataguard.io.bounded import RAW_KEEP_BYTES
from dataguard.io.json_items import ItemCutter
from dataguard.io.json_keypath import KEY_KEEP_BYTES, PROBE_BYTES, KeyPath, missing
from dataguard.io.json_problems import (
    FrameError,
    Item,
    Problem,
    not_an_array,
    stray_close,
    trailing_data,
    truncated,
)
from dataguard.io.json_structure import (
    CLOSE_OBJECT,
    MAX_DEPTH,
    OPEN_ARRAY,
    WHITESPACE,
    JsonScanner,
    json_balance,
    json_depth,
)
from dataguard.io.json_window import ByteWindow

__all__ = ["KEY_KEEP_BYTES", "MAX_DEPTH", "PROBE_BYTES", "WHITESPACE", "FrameError", "Item", "JsonArrayFramer",
           "JsonScanner", "Problem", "json_balance", "json_depth"]


class JsonArrayFramer:
    """Cuts the JSON array found under ``keys`` (none: the top-level array) into the byte
    spans of its items, fed chunk by chunk.

    Only structural characters outside strings are looked at (``JsonScanner``), so an item
    is size-checked before it is parsed and depth-checked without recursion: an item over
    ``max_bytes`` comes out as ``Oversize`` (hashed while skipped, never held whole), one
    nested deeper than ``max_depth`` as a ``too_deep`` ``Problem``, and the others as bytes for
    ``json.loads``. A syntax error stays inside its item; an unclosed array (truncated file),
    a stray closing bracket or data after the array is one ``Problem`` row.
    """

    def __init__(self, keys: list[str], max_bytes: int, max_depth: int = MAX_DEPTH, mark_every: int = 0) -> None:
        self.keys = keys
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.mark_every = mark_every  # see `ItemCutter.marks`: where input splits may start
        self.scanner = JsonScanner()
        self.window = ByteWindow()
        self.mode = "start"  # start -> top -> nav (inside objects) -> items -> after -> tail | done
        self.tail = bytearray()  # in `tail`: the first bytes of data after the array
        self.path: KeyPath | None = None  # set in `nav`
        self.cutter: ItemCutter | None = None  # set from `items` on

    @classmethod
    def resume(cls, keys: list[str], max_bytes: int, level: int, offset: int, items: int) -> JsonArrayFramer:
        """A framer fed from stream offset ``offset``, where item ``items`` of the array open
        at depth ``level`` starts (offset just after ``[`` or after a comma at that level):
        from there it frames exactly as one that read the stream from the start."""
        framer = cls(keys, max_bytes)
        framer.mode = "items"
        framer.window.start = framer.window.end = offset
        framer.cutter = ItemCutter(level, offset, max_bytes, framer.max_depth)
        framer.cutter.items = framer.cutter.separators = items  # item k > 0 follows k commas
        return framer

    @property
    def level(self) -> int:
        """Depth of the array's items (1: a top-level array); 0 before the array is found."""
        return self.cutter.level if self.cutter is not None else 0

    @property
    def done(self) -> bool:
        return self.mode == "done"

    @property
    def end(self) -> int:
        """Stream offset after the last byte fed."""
        return self.window.end

    @property
    def found(self) -> list[str]:
        """Top-level keys seen while looking for the array (for the error naming them)."""
        return self.path.found if self.path is not None else []

    @property
    def items(self) -> int:
        """Items (records and problems) emitted so far."""
        return self.cutter.items if self.cutter is not None else 0

    def feed(self, chunk: bytes) -> list[Item]:
        """The items completed by this chunk (raises FrameError if there is no array)."""
        out: list[Item] = []
        if self.mode == "done" or not chunk:
            return out
        base = self.window.end
        if self.mode in ("after", "tail"):
            self.window.skip(len(chunk))
            self._trailing(chunk, out)
            return out
        if self.mode == "start":
            rest = chunk.lstrip(WHITESPACE)
            if not rest:
                self.window.skip(len(chunk))
                self.window.forget_before(self.window.end)
                return out
            if rest[:1] not in (b"[", b"{"):
                self.mode = "done"
                out.append(not_an_array(rest))
                return out
            self.mode = "top"
        self.window.add(chunk)
        pos, kinds = self.scanner.events(chunk)
        pos = pos + base
        for i in range(len(pos)):
            if self.mode in ("after", "done"):
                break
            if self.mode == "items":
                self._cut(pos[i:], kinds[i:], chunk, base, out)
                break
            p, k = int(pos[i]), int(kinds[i])
            if self.mode == "nav":
                assert self.path is not None
                if self.path.event(p, k, self.window):
                    self._start_array(self.path.depth, p)
            else:
                self._top_event(p, k)
        self._after_chunk()
        return out

    def finish(self) -> list[Item]:
        """At the end of the stream: an unclosed array is one row; no array is a FrameError."""
        mode, head = self.mode, self.partial()
        self.mode = "done"
        if mode == "tail":
            return [trailing_data(self.items, bytes(self.tail).rstrip(WHITESPACE))]
        if mode == "items":
            assert self.cutter is not None
            return [truncated(self.cutter.items, self.end - self.cutter.item_start, head)]
        if mode in ("nav", "top"):
            raise missing(self.keys, self.found, self.end)
        return []

    def partial(self) -> bytes:
        """The first bytes of the item being cut (for the row that reports damage)."""
        c = self.cutter
        if c is None or self.mode != "items":
            return b""
        return c.partial(self.window)

    def _top_event(self, p: int, k: int) -> None:
        """The document's first bracket: the array itself, or the object holding it."""
        if k == OPEN_ARRAY:
            if self.keys:
                raise FrameError("is_array", [])
            self._start_array(1, p)
        else:
            self.mode, self.path = "nav", KeyPath(self.keys, p)

    def _start_array(self, level: int, p: int) -> None:
        self.mode = "items"
        self.cutter = ItemCutter(level, p + 1, self.max_bytes, self.max_depth, self.mark_every)

    def _cut(self, pos: np.ndarray, kinds: np.ndarray, chunk: bytes, base: int, out: list[Item]) -> None:
        assert self.cutter is not None
        closed = self.cutter.cut(pos, kinds, self.window, out)
        if closed is None:
            return
        p, k = closed
        if k == CLOSE_OBJECT:
            out.append(stray_close(p, self.cutter.items, self.cutter.partial(self.window, p)))
            self.mode = "done"
        elif self.keys:
            self.mode = "done"  # the array under the key is read; the rest is not ours
        else:
            self.mode = "after"
            self._trailing(chunk[p + 1 - base:], out)

    def _trailing(self, rest: bytes, out: list[Item]) -> None:
        """Bytes after the top-level array: whitespace, or one row showing the first
        ``RAW_KEEP_BYTES`` of what follows (read on until that much, or the end, is seen)."""
        if self.mode == "after":
            rest = rest.lstrip(WHITESPACE)
            if not rest:
                return
            self.mode = "tail"
        self.tail += rest[:RAW_KEEP_BYTES - len(self.tail)]
        if len(self.tail) >= RAW_KEEP_BYTES:
            out.append(trailing_data(self.items, bytes(self.tail).rstrip(WHITESPACE)))
            self.mode = "done"

    def _after_chunk(self) -> None:
        """Bound memory: keep only what the open item or key needs."""
        keep = self.window.end
        if self.mode == "items":
            assert self.cutter is not None
            keep = self.cutter.keep_from(self.window)
        elif self.mode == "nav":
            assert self.path is not None
            keep = self.path.keep_from(self.window)
        self.window.forget_before(keep)
