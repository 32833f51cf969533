"""What readers hand to normalization: parsed input records, or why they could not be parsed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dataguard.io.bounded import ReadError
from dataguard.io.json_parse import DEFAULT_MAX_RECORD_BYTES, parse_jsonl_line


@dataclass
class RawBatch:
    """A batch of input records from one source, in file order.

    For each row exactly one of ``records[i]`` (the parsed value: usually a dict, but a
    reader passes through whatever the file held, e.g. a list or a number, so that
    normalization can reject it with a reason) or ``errors[i]`` (a reason code such as
    ``invalid_json``) is meaningful. ``raw[i]`` keeps the raw text when parsing failed, so
    the rejected row preserves what the user gave us. ``details[i]`` is a human-readable
    explanation of the error.
    """

    source: str
    positions: list[int] = field(default_factory=list)
    records: list[Any] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    details: list[str | None] = field(default_factory=list)
    raw: list[str | None] = field(default_factory=list)
    # Unparsed JSONL lines (position, line number, bytes) when the reader deferred parsing
    # to the worker that normalizes the batch; see ``parse_pending``. A line the reader
    # already rejected (too large, unreadable) is kept in order as a ``ReadError``.
    pending: list[tuple[int, int, bytes | ReadError]] = field(default_factory=list)
    max_record_bytes: int | None = None

    def __len__(self) -> int:
        return len(self.positions) + len(self.pending)

    def parse_pending(self) -> RawBatch:
        """Parse deferred JSONL lines in place (in file order); a no-op otherwise."""
        if self.pending:
            limit = self.max_record_bytes or DEFAULT_MAX_RECORD_BYTES
            for position, line_no, line in self.pending:
                if isinstance(line, ReadError):
                    self.add_error(position, line.reason, line.detail, line.raw)
                    continue
                self.add_row(parse_jsonl_line(position, line_no, line, limit))
            self.pending = []
        return self

    def add_row(self, row: tuple[int, Any, str | None, str | None, Any]) -> None:
        """A reader's row: (position, record, error, detail, raw), a record or an error."""
        position, record, error, detail, raw = row
        if error is None:
            self.add(position, record)
        else:
            self.add_error(position, error, detail or error, raw)

    def add(self, position: int, record: Any) -> None:
        self.positions.append(position)
        self.records.append(record)
        self.errors.append(None)
        self.details.append(None)
        self.raw.append(None)

    def add_error(self, position: int, error: str, detail: str, raw: str | None) -> None:
        self.positions.append(position)
        self.records.append(None)
        self.errors.append(error)
        self.details.append(detail)
        self.raw.append(raw)

    def add_empty_file(self) -> None:
        """The one row an input without any record gives (so it is not silently missing)."""
        self.add_error(0, "empty_file", f"input {self.source!r} contains no records", "")

    def row_id(self, i: int) -> str:
        """Stable id for row i: the source name and its position in the source."""
        return f"{self.source}:{self.positions[i]}"


@dataclass
class SourceOptions:
    """Per-input options that normalization needs (set in the config's ``inputs``)."""

    name: str
    format: str = "auto"  # auto | alpaca | sharegpt | messages | dolly | prompt_completion | labelled_text
    # source field path -> canonical field (``question: instruction``, ``conversations[].speaker:
    # from``, ``entities.uid: user_id``; syntax in dataguard/stages/normalize_aliases.py)
    aliases: dict[str, str] = field(default_factory=dict)
    text_field: str | None = None  # for labelled_text: which column holds the text
    label_field: str | None = None  # for labelled_text: which column holds the label
    path: str | None = None  # the input's file, named in errors (e.g. an alias that matched nothing)
