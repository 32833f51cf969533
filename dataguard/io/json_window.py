"""The bytes a JSON framer may still need, addressed by stream offset.

The framer reads a stream of any size in bounded memory, so it keeps only the tail that
an open item or an object key can still refer to. Its parts remember stream offsets and
read through this window, instead of each one shifting indexes whenever the buffer is cut.
"""

from __future__ import annotations


class ByteWindow:
    """``buf`` holds stream bytes ``[start, end)``; everything before ``start`` is gone."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.start = 0  # stream offset of buf[0]
        self.end = 0  # stream offset after the last byte seen

    def add(self, chunk: bytes) -> None:
        """Keep ``chunk`` (the bytes that follow ``end``)."""
        self.buf += chunk
        self.end += len(chunk)

    def skip(self, n: int) -> None:
        """Count ``n`` more stream bytes that are not kept (nothing can refer to them)."""
        self.end += n

    def get(self, a: int, b: int | None = None) -> bytes:
        """Stream bytes ``[a, b)`` (``b`` None: up to ``end``); ``a`` must still be held."""
        return bytes(self.slice(a, b))

    def slice(self, a: int, b: int | None = None) -> bytearray:
        """Like ``get``, as the buffer's own slice type (what a hasher is fed)."""
        return self.buf[a - self.start: None if b is None else b - self.start]

    def forget_before(self, keep: int) -> None:
        """Drop the bytes before stream offset ``keep``."""
        del self.buf[: keep - self.start]
        self.start = keep
