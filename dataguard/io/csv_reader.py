"""The CSV/TSV reader: strict quoting, and a record that cannot be trusted is rejected one
physical line at a time, so no merged row is ever kept.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dataguard.io.bounded import (
    RAW_KEEP_BYTES,
    Broken,
    Line,
    Oversize,
    Row,
    bounded_lines,
    damage_error,
    open_binary,
    preview,
)


class _LineTooLarge(Exception):
    def __init__(self, line_no: int, big: Oversize) -> None:
        super().__init__(line_no)
        self.line_no, self.big = line_no, big


class _StreamBroken(Exception):
    def __init__(self, line_no: int, broken: Broken) -> None:
        super().__init__(line_no)
        self.line_no, self.broken = line_no, broken


class _CsvFeed:
    """Bounded, decoded physical lines for ``csv.reader``; remembers the lines of the record
    being read, so a record that must be rejected is rejected line by line, each line
    keeping its own text. Bytes that are not UTF-8 pass as surrogate escapes and flag it."""

    def __init__(self, lines: Iterator[tuple[int, Line]]) -> None:
        self.lines = lines
        self.taken: list[tuple[int, bytes]] = []
        self.bad_utf8 = False
        self.pushed: list[tuple[int, bytes]] = []  # lines given back, read again first (last one first)
        self.refed = False  # the record being read holds a line given back

    def __iter__(self) -> _CsvFeed:
        return self

    def __next__(self) -> str:
        if self.pushed:
            line_no, line = self.pushed.pop()
            self.refed = True
        else:
            line_no, line = next(self.lines)  # type: ignore[assignment]
        if isinstance(line, Oversize):
            raise _LineTooLarge(line_no, line)
        if isinstance(line, Broken):
            raise _StreamBroken(line_no, line)
        self.taken.append((line_no, line))
        try:
            return line.decode("utf-8") + "\n"
        except UnicodeDecodeError:
            self.bad_utf8 = True
            return line.decode("utf-8", "surrogateescape") + "\n"

    def take(self) -> tuple[list[tuple[int, bytes]], bool, bool]:
        taken, bad, refed = self.taken, self.bad_utf8, self.refed
        self.taken, self.bad_utf8, self.refed = [], False, False
        return taken, bad, refed

    def give_back(self, lines: list[tuple[int, bytes]]) -> None:
        """Lines to read again, as the next ones, before the rest of the file."""
        self.pushed.extend(reversed(lines))


@dataclass
class _CsvRecord:
    lines: list[tuple[int, bytes]]
    bad_utf8: bool
    refed: bool = False  # read from lines given back after a stray quote (see `_csv_records`)
    fields: list[str] | None = None
    error: str | None = None  # csv.Error text (strict quoting, unclosed quote at EOF, field too large)
    too_large: tuple[int, Oversize] | None = None
    broken: tuple[int, Broken] | None = None
    stray: bool = False  # a line whose quote ran over the next lines, split off them

    def blank(self) -> bool:
        return self.fields is not None and (not self.fields or (len(self.fields) == 1 and not self.fields[0].strip()))


def _csv_records(path: Path, delimiter: str, max_bytes: int, split_multiline: bool = False) -> Iterator[_CsvRecord]:
    """Every record of a CSV file with the physical lines it was read from (strict quoting).

    With ``split_multiline`` (a file with no legitimate multi-line fields) a record read over
    several lines - a stray quote that ran on until a later quote, an error or the end of the
    file - is cut back to its first line (where the quote opened: the line break ending it
    lies inside the quote), a ``stray`` record, and the lines after it are read again as
    records of their own: the valid rows around a stray quote are kept.
    """
    csv.field_size_limit(max_bytes)
    with open_binary(path) as f:
        feed = _CsvFeed(bounded_lines(f, max_bytes))
        reader = csv.reader(feed, delimiter=delimiter, strict=True)
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                rec = _CsvRecord(*feed.take(), error=str(exc))
            except _LineTooLarge as exc:
                rec = _CsvRecord(*feed.take(), too_large=(exc.line_no, exc.big))
            except _StreamBroken as exc:
                yield _CsvRecord(*feed.take(), broken=(exc.line_no, exc.broken))
                return
            else:
                rec = _CsvRecord(*feed.take(), fields=fields)
            if split_multiline and rec.too_large is None and len(rec.lines) > 1:
                feed.give_back(rec.lines[1:])
                rec = _CsvRecord(rec.lines[:1], False, rec.refed, stray=True)
            yield rec
            if rec.fields is None:
                reader = csv.reader(feed, delimiter=delimiter, strict=True)  # start clean after an error


def _multiline_records(path: Path, delimiter: str, max_bytes: int, enough: int = 2) -> int:
    """How many well-formed records span several lines (counting stops at ``enough``).

    A quoted field may hold line breaks, but a stray quote also makes the rows after it
    one "field": a file whose only multi-line record is that one is damaged there.
    """
    header: int | None = None
    found = 0
    for rec in _csv_records(path, delimiter, max_bytes):
        if rec.fields is None or rec.blank():
            continue
        if header is None:
            header = len(rec.fields)
        elif len(rec.lines) > 1 and len(rec.fields) == header:
            found += 1
            if found >= enough:
                break
    return found


_STRAY = "a quoted field opened on this line runs on over the next lines (a stray quote?)"


def _odd_quotes(lines: list[tuple[int, bytes]], quote: str) -> bool:
    """A record whose lines hold an odd number of quotes cannot stand alone: it closes a
    quote that an earlier line opened (read alone, the quote counts as text)."""
    return sum(line.count(quote.encode()) for _, line in lines) % 2 == 1


def _line_rows(position: int, lines: list[tuple[int, bytes]], reason: str, detail: str) -> list[Row]:
    """One rejected row per non-blank physical line, each with its own text."""
    rows: list[Row] = []
    for line_no, line in lines:
        if line.strip():
            rows.append((position + len(rows), None, reason, f"line {line_no}: {detail}", preview(line)))
    return rows


def _span(lines: list[tuple[int, bytes]]) -> str:
    return f"lines {lines[0][0]}-{lines[-1][0]}" if len(lines) > 1 else f"line {lines[0][0]}" if lines else "EOF"


def _header_name(name: str) -> str:
    """A column name; bytes that are not UTF-8 (surrogate-escaped by the feed) as ``\\xff``."""
    if not name.isascii():
        name = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return name.lstrip("\ufeff").strip()


def _unique(names: list[str]) -> list[str]:
    """Column names made unique (``name_2``, ...), so no column's values silently vanish."""
    seen: set[str] = set()
    out = []
    for name in names:
        candidate, n = name, 1
        while candidate in seen:
            n += 1
            candidate = f"{name}_{n}"
        seen.add(candidate)
        out.append(candidate)
    return out


def read_csv(path: Path, source: str, delimiter: str, max_bytes: int) -> Iterator[Row]:
    """CSV/TSV rows as dicts keyed by the header, read with strict quoting.

    A record that cannot be trusted - a quoting error, a quoted field still open at the
    end of the file, the wrong number of fields - is rejected as ``malformed_csv`` one
    physical line at a time: no merged row is ever kept. Where no other record in the file
    spans lines, a record that does is a stray quote: only its first line is rejected, and
    the lines it swallowed are read again as rows (one closing the quote, with an odd number
    of quotes, is rejected too).
    """
    multiline_ok = _multiline_records(path, delimiter, max_bytes) >= 2
    header: list[str] | None = None
    header_problem: str | None = None
    position = 0
    for rec in _csv_records(path, delimiter, max_bytes, split_multiline=not multiline_ok):
        rows: list[Row] = []
        if rec.broken is not None:
            line_no, broken = rec.broken
            partial = Broken(broken.message, b"\n".join(line for _, line in rec.lines)[:RAW_KEEP_BYTES]
                             or broken.head)
            damage = damage_error(path, partial, f"line {line_no}")
            yield position, None, damage.reason, damage.detail, damage.raw
            return
        if header is None and header_problem is None:
            if rec.blank():
                continue
            if rec.fields is not None:
                header = _unique([_header_name(h) for h in rec.fields])
                continue
            header_problem = (f"the header ({_span(rec.lines)}) is not valid CSV "
                              f"({_STRAY if rec.stray else rec.error or 'a line over the size limit'}); "
                              "the file cannot be read")
            rows = _line_rows(position, rec.lines[1:], "malformed_csv", header_problem)
        elif header_problem is not None:
            rows = _line_rows(position, rec.lines, "malformed_csv", header_problem)
            if rec.too_large is not None:
                rows.append((position + len(rows), None, "malformed_csv", f"line {rec.too_large[0]}: {header_problem}",
                             rec.too_large[1].raw()))
        elif rec.too_large is not None:
            line_no, big = rec.too_large
            rows = _line_rows(position, rec.lines, "malformed_csv", f"part of a record cut by the oversized line {line_no}")
            rows.append((position + len(rows), None, "record_too_large", big.detail(f"line {line_no}", max_bytes),
                         big.raw()))
        elif rec.stray:
            rows = _line_rows(position, rec.lines, "malformed_csv", f"{_STRAY}; the lines after it are read as "
                              "rows of their own (no other record in the file spans lines)")
        elif rec.error is not None:
            if "unexpected end of data" in rec.error:
                detail = (f"a quoted field opened on line {rec.lines[0][0] if rec.lines else '?'} never closes; "
                          f"{_span(rec.lines)} cannot be split into rows")
            else:
                detail = f"{rec.error} (in the record on {_span(rec.lines)})"
            rows = _line_rows(position, rec.lines, "malformed_csv", detail)
        else:
            assert rec.fields is not None and header is not None
            if rec.blank():
                continue
            fields = rec.fields
            if rec.refed and _odd_quotes(rec.lines, quote='"'):
                rows = _line_rows(position, rec.lines, "malformed_csv", "an odd number of quotes, right after a "
                                  "stray quote: this line may close a field opened on an earlier line")
            elif len(rec.lines) > 1 and (len(fields) != len(header) or not multiline_ok):
                why = (f"has {len(fields)} fields, the header {len(header)}" if len(fields) != len(header)
                       else "is the only record in the file with a line break inside a field")
                rows = _line_rows(position, rec.lines, "malformed_csv",
                                  f"the record on {_span(rec.lines)} {why}; a stray quote may have merged rows")
            else:
                raw_text = b"\n".join(line for _, line in rec.lines)
                if len(fields) != len(header):
                    rows = [(position, None, "malformed_csv",
                             f"row {position + 1} ({_span(rec.lines)}) has {len(fields)} fields, the header has "
                             f"{len(header)}", preview(raw_text))]
                elif rec.bad_utf8:
                    rows = [(position, None, "invalid_utf8", f"row {position + 1} ({_span(rec.lines)}) has bytes "
                             "that are not UTF-8", preview(raw_text))]
                else:
                    rows = [(position, dict(zip(header, fields, strict=True)), None, None, None)]
        yield from rows
        position += len(rows)
