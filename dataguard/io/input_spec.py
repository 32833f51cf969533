"""What one input is (`InputSpec`): a file or a Hugging Face dataset, with how to read it.

Its own module because both the reader chooser (`readers`) and the readers it chooses
(`arrow_reader`, `hf_split`) need the type: in `readers` it would make each of them import
its own caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataguard.io import bounded
from dataguard.io.bounded import (
    READ_ERRORS,
    InputError,
    Line,
    bounded_lines,
    open_binary,
    read_first,
    read_head,
    read_some,
)
from dataguard.io.json_parse import DEFAULT_MAX_RECORD_BYTES
from dataguard.io.json_readers import frame_message
from dataguard.io.jsonscan import FrameError, JsonArrayFramer, json_balance
from dataguard.io.raw import SourceOptions
from dataguard.records import safe_text

READERS = ("auto", "json", "jsonl", "csv", "tsv", "parquet", "hf")


@dataclass
class InputSpec:
    """One input source: a file or a Hugging Face dataset (folder or in-memory object)."""

    path: str | Path | None = None
    name: str | None = None
    format: str = "auto"
    reader: str = "auto"
    aliases: dict[str, str] = field(default_factory=dict)
    text_field: str | None = None
    label_field: str | None = None
    json_key: str | None = None  # read the array under this key of a top-level JSON object ("a.b": nested)
    dataset: Any = None  # a datasets.Dataset, for the Python API

    def __post_init__(self) -> None:
        if self.path is None and self.dataset is None:
            raise InputError("an input needs a path or a dataset")
        if self.reader not in READERS:
            raise InputError(f"unknown reader {self.reader!r} (expected one of {', '.join(READERS)})")
        if self.name is None:
            self.name = Path(self.path).name if self.path is not None else "dataset"
        # A file name that is not UTF-8 (surrogate-escaped by the OS layer) would end up in
        # every row id; Arrow cannot store it.
        self.name = safe_text(str(self.name))

    def options(self) -> SourceOptions:
        return SourceOptions(
            name=str(self.name), format=self.format, aliases=dict(self.aliases),
            text_field=self.text_field, label_field=self.label_field,
            path=str(self.path) if self.path is not None else None,
        )

    def resolved_reader(self) -> str:
        """Pick a reader from the file name (and, for .json, the first bytes).

        Raises only InputError: e.g. for a ``.json`` file holding one JSON object (not an
        array, not JSON lines) and no ``json_key``, naming the keys it found.
        """
        if self.dataset is not None:
            return "hf"
        if self.reader != "auto":
            return self.reader
        path = Path(self.path)
        if path.is_dir():
            return "hf"
        name = path.name.lower().removesuffix(".gz")
        if name.endswith(".jsonl") or name.endswith(".ndjson"):
            return "jsonl"
        if name.endswith(".json"):
            return "json" if self.json_key else _sniff_json(path, str(self.name))
        if name.endswith(".csv"):
            return "csv"
        if name.endswith(".tsv"):
            return "tsv"
        if name.endswith(".parquet") or name.endswith(".pq"):
            return "parquet"
        if name.endswith(".arrow"):
            return "hf"
        raise InputError(f"cannot tell the format of {path} from its name; set `reader:`")


def _sniff_json(path: Path, source: str) -> str:
    """``json`` for an array, ``jsonl`` for JSON lines; a lone object is an InputError."""
    with open_binary(path) as f:
        first = read_head(f, 64 * 1024).lstrip()[:1]
    if first != b"{":
        return "json" if first == b"[" else "jsonl"
    # "{" starts JSON lines, or one (pretty-printed) object holding the records: JSON lines
    # have a first line that is complete on its own, followed by another object line.
    lines: list[Line] = []
    with open_binary(path) as f:
        for _, line in bounded_lines(f, DEFAULT_MAX_RECORD_BYTES):
            if not isinstance(line, bytes) or line.strip():
                lines.append(line)
            if len(lines) == 2:
                break
    head = lines[0] if lines else b""
    if not isinstance(head, bytes) or json_balance(head) <= 0:
        return "jsonl"
    if len(lines) == 2 and isinstance(lines[1], bytes) and lines[1].lstrip().startswith(b"{") \
            and json_balance(lines[1]) == 0:
        return "jsonl"  # a broken first record of a JSON-lines file
    raise InputError(frame_message(source, None, _object_keys(path)))


def _object_keys(path: Path) -> FrameError:
    """The top-level keys of a JSON object file (scans at most ``PROBE_BYTES``)."""
    framer = JsonArrayFramer([], DEFAULT_MAX_RECORD_BYTES)
    try:
        with open_binary(path) as f:
            first = True
            while True:
                try:
                    chunk = read_first(f, bounded.READ_CHUNK_BYTES)[0] if first else read_some(f, bounded.READ_CHUNK_BYTES)
                except READ_ERRORS:
                    chunk = b""
                first = False
                if not chunk:
                    framer.finish()
                    break
                framer.feed(chunk)
    except FrameError as exc:
        return exc
    return FrameError("object", framer.found, complete=False)
