"""Byte-level reading shared by every reader, so that any input bytes stay in bounded memory
and never raise: ``bounded_lines`` splits a stream at ``\\n``, ``\\r\\n`` or ``\\r`` without
holding more than the record-size limit of a line, and ends the stream with one ``Broken``
line when the bytes cannot be read on (a damaged ``.gz``).
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

READ_CHUNK_BYTES = 1 << 20  # read size; a module global so tests can make lines cross reads
RAW_KEEP_BYTES = 64 * 1024  # how much of an unusable record we keep in `rejected`
BOM = b"\xef\xbb\xbf"
# What reading a damaged file raises: gzip's EOFError / zlib.error / BadGzipFile (an
# OSError), or an I/O error of the disk itself.
READ_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, OSError)

# Each low-level reader yields (position, record | None, error | None, detail, raw).
Row = tuple[int, Any, str | None, str | None, str | None]


# Defined here, below every reader module, so they raise it without importing `readers`
# (which re-exports it).
class InputError(ValueError):
    """An input cannot be read at all (missing file, unknown reader, no array to read)."""


@dataclass(frozen=True)
class ReadError:
    """A row the reader could not turn into a record: reason code, detail, raw preview."""

    reason: str
    detail: str
    raw: str


@dataclass(frozen=True)
class Oversize:
    """A record larger than the limit: its first bytes, full size and hash (never held whole)."""

    head: bytes
    size: int
    sha256: str

    def raw(self) -> str:
        return clip_note(self.head, self.size, self.sha256)

    def detail(self, what: str, limit: int) -> str:
        return f"{what} is {self.size:,} bytes (limit {limit:,}); sha256 {self.sha256}"


@dataclass(frozen=True)
class Broken:
    """The stream could not be read past this point (e.g. a corrupt or truncated .gz)."""

    message: str
    head: bytes  # the start of the partial line being read when it broke


def preview(data: bytes, limit: int = RAW_KEEP_BYTES) -> str:
    """At most ``limit`` bytes of ``data`` as text: bad bytes escaped (``\\xff``), a character
    cut at the end dropped. Never holds a surrogate, so Arrow can always store it."""
    if len(data) <= limit:
        text = data.decode("utf-8", "backslashreplace")
    else:
        text = codecs.getincrementaldecoder("utf-8")("backslashreplace").decode(data[:limit], final=False)
    return text if len(text) <= limit else text[:limit]


def clip_note(head: bytes, size: int, sha256: str) -> str:
    """The raw text kept for an oversized record: a clipped preview plus size and hash."""
    return (preview(head) + f"\n[... clipped: the record is {size:,} bytes, sha256 {sha256}; "
            f"only the first {min(size, RAW_KEEP_BYTES):,} are kept]")


def oversize(data: bytes) -> Oversize:
    return Oversize(data[:RAW_KEEP_BYTES], len(data), hashlib.sha256(data).hexdigest())


def describe_error(exc: BaseException) -> str:
    """One line for an exception: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def read_some(f: BinaryIO, size: int) -> bytes:
    """Up to ``size`` bytes, b"" only at the end. ``read1`` does one read of the underlying
    stream, so the data decoded before damage in a ``.gz`` comes out before the error does."""
    read1 = getattr(f, "read1", None)
    return read1(size) if read1 is not None else f.read(size)


def read_first(f: BinaryIO, size: int) -> tuple[bytes, int]:
    """A stream's first read with a UTF-8 BOM cut off, and the BOM's length (0 or 3). Reads
    on while the bytes could still be a BOM, or were only one, so how the stream happens to
    be chunked never decides whether a BOM is seen."""
    chunk = read_some(f, size)
    while chunk and len(chunk) < 3 and BOM.startswith(chunk):
        more = read_some(f, size)
        if not more:
            break
        chunk += more
    if not chunk.startswith(BOM):
        return chunk, 0
    return chunk[3:] or read_some(f, size), 3


def read_head(f: BinaryIO, size: int) -> bytes:
    """Up to ``size`` bytes from the start of ``f`` (BOM removed); what a damaged file gives."""
    out = b""
    try:
        while len(out) < size:
            chunk = read_some(f, size - len(out))
            if not chunk:
                break
            out += chunk
    except READ_ERRORS:
        pass
    return out[3:] if out.startswith(BOM) else out


Line = bytes | Oversize | Broken


class _Partial:
    """The start of a line that continues in the next read; past the size limit only its
    first bytes, size and running hash are kept."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[bytes] = []
        self.size = 0
        self.hasher: Any = None
        self.head = b""

    def __bool__(self) -> bool:
        return bool(self.parts) or self.hasher is not None

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.hasher is not None:
            self.hasher.update(piece)
            if len(self.head) < RAW_KEEP_BYTES:  # the same head wherever the reads fell
                self.head += piece[:RAW_KEEP_BYTES - len(self.head)]
            return
        self.parts.append(piece)
        if self.size > self.max_bytes:
            joined = b"".join(self.parts)
            self.head, self.hasher, self.parts = joined[:RAW_KEEP_BYTES], hashlib.sha256(joined), []

    def start(self) -> bytes:
        return self.head if self.hasher is not None else b"".join(self.parts)[:RAW_KEEP_BYTES]

    def finish(self) -> bytes | Oversize:
        line: bytes | Oversize
        if self.hasher is not None:
            line = Oversize(self.head, self.size, self.hasher.hexdigest())
        else:
            line = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        self.parts, self.size, self.hasher, self.head = [], 0, None, b""
        return line


def bounded_lines(f: BinaryIO, max_bytes: int, strip_bom: bool = True) -> Iterator[tuple[int, Line]]:
    """(line number, line) for each line of ``f``, terminator removed.

    Lines end at ``\\n``, ``\\r\\n`` or a bare ``\\r`` (a JSON text cannot hold a raw CR, and
    old Mac exports use it alone). A line over ``max_bytes`` comes out as ``Oversize``: its
    first bytes, size and sha256, computed while the rest is skipped, so memory stays near
    ``max_bytes + READ_CHUNK_BYTES`` whatever the input. A read error (damaged gzip) ends the
    stream with one ``Broken`` item. A UTF-8 BOM at the very start is dropped (unless
    ``strip_bom`` is false: ``f`` is a byte range that starts inside a file).
    """
    partial = _Partial(max_bytes)
    line_no = 0
    skip_lf = False
    first = strip_bom
    while True:
        try:
            chunk = read_first(f, READ_CHUNK_BYTES)[0] if first else read_some(f, READ_CHUNK_BYTES)
        except READ_ERRORS as exc:
            yield line_no + 1, Broken(describe_error(exc), partial.start())
            return
        if not chunk:
            break
        first = False
        if skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the "\n" of a "\r\n" split between two reads
        if not chunk:
            continue
        skip_lf = chunk.endswith(b"\r")
        lines = chunk.splitlines()  # bytes split at \n, \r\n and \r only
        tail = None if chunk.endswith((b"\n", b"\r")) else lines.pop()
        begin = 0
        if partial and lines:
            partial.add(lines[0])
            line_no += 1
            yield line_no, partial.finish()
            begin = 1
        for i in range(begin, len(lines)):
            line = lines[i]
            line_no += 1
            yield line_no, line if len(line) <= max_bytes else oversize(line)
        if tail is not None:
            partial.add(tail)
    if partial:
        yield line_no + 1, partial.finish()


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes (decompressed for ``.gz``), as UTF-8: a UTF-16 or UTF-32 text (see
    `text_encoding`) is transcoded as it is read, so every reader sees the bytes it expects."""
    try:
        if path.name.lower().endswith(".gz"):
            f: BinaryIO = gzip.open(path, "rb")  # type: ignore[assignment]
        else:
            f = open(path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        found = text_encoding(f.peek(4)[:4])  # type: ignore[attr-defined]
    except READ_ERRORS:  # damaged at once: the reader reports it where it reads
        found = None
    return f if found is None else _Utf8Reader(f, *found)  # type: ignore[return-value]


# (encoding, BOM length) by the BOM a file starts with; UTF-32 first: its LE BOM starts as UTF-16's
_BOMS = ((b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe", "utf-16-le"),
         (b"\xfe\xff", "utf-16-be"))
BAD_TEXT = "dataguard-bad-text"  # decode errors become a byte that is not UTF-8: the row is rejected


def text_encoding(head: bytes) -> tuple[str, int] | None:
    """(encoding, BOM length) of a UTF-16 or UTF-32 text from its first 4 bytes; None for
    anything else (UTF-8, or not text). Without a BOM, a JSON, JSON-lines or CSV text starts
    with an ASCII character, whose zero bytes give the encoding away (as RFC 4627 notes)."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding, len(bom)
    if len(head) < 4 or head.count(0) not in (2, 3):
        return None
    zeros = tuple(b == 0 for b in head)
    return {(False, True, True, True): ("utf-32-le", 0), (True, True, True, False): ("utf-32-be", 0),
            (False, True, False, True): ("utf-16-le", 0), (True, False, True, False): ("utf-16-be", 0)}.get(zeros)


def _bad_text(exc: UnicodeError) -> tuple[str, int]:
    """A code unit that is not text (a lone surrogate, an odd last byte): one escaped 0xff."""
    assert isinstance(exc, UnicodeDecodeError)
    return "\udcff", exc.end


codecs.register_error(BAD_TEXT, _bad_text)


class _Utf8Reader:
    """A UTF-16/32 stream read as UTF-8 bytes, decoded incrementally (a code unit or a
    surrogate pair may straddle two reads); what cannot be decoded comes out as a 0xff byte,
    so that record is rejected as not UTF-8 like any other. Reads only; no seeking."""

    def __init__(self, raw: BinaryIO, encoding: str, bom: int) -> None:
        self.raw = raw
        self.encoding = encoding
        raw.read(bom)
        self._decoder = codecs.getincrementaldecoder(encoding)(BAD_TEXT)
        self._out = b""
        self._eof = False

    def read(self, size: int = -1) -> bytes:
        while not self._eof and (size < 0 or len(self._out) < size):
            chunk = read_some(self.raw, READ_CHUNK_BYTES)
            self._eof = not chunk
            self._out += self._decoder.decode(chunk, final=self._eof).encode("utf-8", "surrogateescape")
        if size < 0 or size >= len(self._out):
            out, self._out = self._out, b""
        else:
            out, self._out = self._out[:size], self._out[size:]
        return out

    read1 = read

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> _Utf8Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def damage_error(path: Path, broken: Broken, where: str) -> ReadError:
    """The one row that stands for the unreadable rest of a file."""
    compressed = path.name.lower().endswith(".gz")
    reason = "corrupt_compressed_file" if compressed else "unreadable_file"
    what = "compressed data is damaged or truncated" if compressed else "the file could not be read"
    return ReadError(reason, f"{what} at {where} ({broken.message}); the rows before it are kept, "
                             "the rest of the file is lost", preview(broken.head))
