"""Reference sets for contamination scans: shipped benchmarks and user-named files.

Shipped sets (compact ``jsonl.gz`` of the text fields only; provenance in SOURCE.md,
rebuilt by ``python scripts/build_references.py``):

=============  ======  ==================================================================
name           items   indexed fields (each field of each example is one reference item)
=============  ======  ==================================================================
gsm8k_test     1,319   question, answer
mmlu_test      14,042  question+choices (question and its four options, one per line)
humaneval      164     prompt, canonical_solution
truthfulqa     817     question, question+best_answer
mt_bench       80      turn_1, turn_2, reference_1, reference_2 (GPT-4 references, 30 qs)
=============  ======  ==================================================================

A reference spec is one of:

* a shipped name: ``"gsm8k_test"``;
* a mapping ``{"name": ..., "path": "bench.jsonl", "fields": ["question", "answer"],
  "id_field": "id", "format": "auto"}`` for a user's file (JSONL, JSONL.gz, JSON array,
  CSV, Parquet). ``fields`` name the text columns; ``"a+b"`` joins two columns with a
  newline into one item, ``"a.b"`` reaches into nested objects, list values are joined by
  newlines. A shipped name with ``fields`` overrides its default fields.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class BuiltinSet:
    file: str
    fields: tuple[str, ...]
    description: str


BUILTIN: dict[str, BuiltinSet] = {
    "gsm8k_test": BuiltinSet("gsm8k_test.jsonl.gz", ("question", "answer"), "GSM8K test (openai/grade-school-math)"),
    "mmlu_test": BuiltinSet("mmlu_test.jsonl.gz", ("question+choices",), "MMLU test, 57 subjects"),
    "humaneval": BuiltinSet("humaneval.jsonl.gz", ("prompt", "canonical_solution"), "OpenAI HumanEval"),
    "truthfulqa": BuiltinSet("truthfulqa.jsonl.gz", ("question", "question+best_answer"), "TruthfulQA generation"),
    "mt_bench": BuiltinSet("mt_bench.jsonl.gz", ("turn_1", "turn_2", "reference_1", "reference_2"),
                           "MT-Bench questions and GPT-4 reference answers"),
}
DEFAULT_REFERENCES: tuple[str, ...] = tuple(BUILTIN)
FORMATS = ("auto", "jsonl", "json", "csv", "parquet")


class ReferenceError(ValueError):
    """A reference spec or file cannot be used; the message says which and why."""


@dataclass(frozen=True)
class ReferenceSpec:
    """A validated reference spec (picklable, cheap: the texts are loaded on demand)."""

    name: str
    path: str | None  # None: shipped set
    fields: tuple[str, ...]
    id_field: str | None = None
    format: str = "auto"

    def load(self) -> ReferenceSet:
        return ReferenceSet(self.name, list(_items(self)))


@dataclass
class ReferenceSet:
    name: str
    items: list[tuple[str, str]]  # (item id, text)


def parse_spec(spec: str | Mapping[str, Any]) -> ReferenceSpec:
    """Validate one reference spec (see module docstring)."""
    if isinstance(spec, str):
        if spec in BUILTIN:
            return ReferenceSpec(spec, None, BUILTIN[spec].fields)
        raise ReferenceError(f"unknown reference set {spec!r}; shipped: {sorted(BUILTIN)} "
                             "(name a file with {name: ..., path: ..., fields: [...]})")
    if not isinstance(spec, Mapping):
        raise ReferenceError(f"a reference must be a name or a mapping, got {spec!r}")
    unknown = sorted(set(spec) - {"name", "path", "fields", "id_field", "format"})
    if unknown:
        raise ReferenceError(f"unknown reference key(s) {unknown}")
    name = spec.get("name")
    path = spec.get("path")
    if path is None:
        if name not in BUILTIN:
            raise ReferenceError(f"reference {name!r}: no 'path' and not a shipped set ({sorted(BUILTIN)})")
    elif not isinstance(path, str) or not Path(path).expanduser().is_file():
        raise ReferenceError(f"reference {name or path!r}: file not found: {path!r}")
    if name is None:
        name = Path(path).name.split(".")[0]
    if not isinstance(name, str) or not name:
        raise ReferenceError(f"reference name must be a non-empty string, got {name!r}")
    fields = spec.get("fields")
    if fields is None:
        if path is not None:
            raise ReferenceError(f"reference {name!r}: 'fields' (the text columns) is required for a file")
        fields = BUILTIN[name].fields
    if isinstance(fields, str):
        fields = [fields]
    if not fields or not all(isinstance(f, str) and f for f in fields):
        raise ReferenceError(f"reference {name!r}: 'fields' must be a non-empty list of column names")
    fmt = spec.get("format", "auto")
    if fmt not in FORMATS:
        raise ReferenceError(f"reference {name!r}: format must be one of {FORMATS}, got {fmt!r}")
    id_field = spec.get("id_field")
    if id_field is not None and not isinstance(id_field, str):
        raise ReferenceError(f"reference {name!r}: id_field must be a string")
    resolved = str(Path(path).expanduser().resolve()) if path is not None else None
    return ReferenceSpec(name, resolved, tuple(fields), id_field, fmt)


# ---------------------------------------------------------------------------------------
def _detect_format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    return {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "csv",
            ".parquet": "parquet", ".pq": "parquet"}.get(last, "jsonl")


def _open_text(path: Path) -> Any:
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8", newline="")


def _records(path: Path, fmt: str) -> Iterator[Any]:
    if fmt == "auto":
        fmt = _detect_format(path)
    if fmt == "jsonl":
        with _open_text(path) as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)
    elif fmt == "json":
        with _open_text(path) as f:
            data = json.load(f)
        if isinstance(data, Mapping):  # {"data": [...]} or {"train": [...]}: the first list
            lists = [v for v in data.values() if isinstance(v, list)]
            data = lists[0] if lists else [data]
        yield from data
    elif fmt == "csv":
        with _open_text(path) as f:
            dialect = "excel-tab" if ".tsv" in path.name.lower() else "excel"
            yield from csv.DictReader(f, dialect=dialect)
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches():
            yield from batch.to_pylist()


def _get(record: Any, dotted: str) -> Any:
    value = record
    for part in dotted.split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return "\n".join(_as_text(v) for v in value)
    return str(value)


def field_text(record: Any, field: str) -> str:
    """Text of a field spec on one record (``a+b`` joins, ``a.b`` nests)."""
    return "\n".join(t for t in (_as_text(_get(record, f)) for f in field.split("+")) if t)


def _items(spec: ReferenceSpec) -> Iterator[tuple[str, str]]:
    if spec.path is None:
        path, fmt, id_field = HERE / BUILTIN[spec.name].file, "jsonl", "id"
    else:
        path, fmt, id_field = Path(spec.path), spec.format, spec.id_field
    multi = len(spec.fields) > 1
    for i, record in enumerate(_records(path, fmt)):
        base = _as_text(_get(record, id_field)) if id_field else ""
        base = base or f"{spec.name}/{i}"
        for field in spec.fields:
            text = field_text(record, field)
            if text.strip():
                yield (f"{base}#{field}" if multi else base), text


def parse_specs(specs: Sequence[str | Mapping[str, Any]]) -> list[ReferenceSpec]:
    out = [parse_spec(s) for s in specs]
    names = [s.name for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ReferenceError(f"reference set names must be unique, repeated: {dup}")
    return out
