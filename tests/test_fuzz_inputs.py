"""Fuzz every reader and the normalizer with random and adversarial bytes, under a memory cap.

The promise: any input bytes give either a run that accounts for every row (rows in =
kept + rejected, each reject with a reason and a detail, positions 0..n-1 in order) or one
``InputError`` - never another exception, never unbounded memory, never a kept row that
merges two input rows. Every generated row carries a unique marker token (``mk<n>z``); a
kept row must hold at most one (exactly one when the file was not damaged).

The bodies run in one spawned worker process whose address space is capped
(``RLIMIT_AS`` = what the imports took + ``MEMORY_BUDGET``) and whose peak RSS growth is
checked after every test, so a reader that materialises a 512 MiB line, or a parser whose
memory grows with the square of the nesting depth, fails here instead of taking the
machine down. Hypothesis runs derandomized (same examples every run) with small counts.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import resource
import tempfile
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MEMORY_BUDGET = 2 << 30  # address space the worker may add after its imports
RSS_GROWTH_LIMIT = 400 << 20  # peak resident memory it may add over its whole life
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MARK = re.compile(r"mk\d+z")
_BASELINE_RSS = 0


# ------------------------------------------------------------------ the capped worker
def _vm_size() -> int | None:
    """Address space in use (Linux); None where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cap_memory(budget: int) -> None:
    """Worker initializer: load everything a test may use, then cap what may be added."""
    global _BASELINE_RSS
    import datasets  # imported before the cap is measured
    import pyarrow as pa
    import pyarrow.parquet  # noqa: F401

    import dataguard.pipeline  # noqa: F401

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    datasets.disable_progress_bars()
    used, hard = _vm_size(), resource.getrlimit(resource.RLIMIT_AS)[1]
    if used is not None and (hard == resource.RLIM_INFINITY or used + budget <= hard):
        resource.setrlimit(resource.RLIMIT_AS, (used + budget, hard))
    _BASELINE_RSS = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_growth() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - _BASELINE_RSS


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, int]:
    return fn(*args), _rss_growth()


@pytest.fixture(scope="module")
def capped() -> Iterator[Callable[..., Any]]:
    """Run ``fn(*args)`` in the memory-capped worker; fail if its peak RSS grew too much."""
    state: dict[str, Any] = {}

    def pool() -> ProcessPoolExecutor:
        if "pool" not in state:
            old = os.environ.get("MALLOC_ARENA_MAX")
            os.environ["MALLOC_ARENA_MAX"] = "2"  # glibc arenas reserve address space per thread
            try:
                state["pool"] = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_cap_memory,
                                                    initargs=(MEMORY_BUDGET,))
            finally:
                if old is None:
                    os.environ.pop("MALLOC_ARENA_MAX")
                else:
                    os.environ["MALLOC_ARENA_MAX"] = old
        return state["pool"]

    def run(fn: Callable[..., Any], *args: Any, timeout: float = 240) -> Any:
        try:
            result, growth = pool().submit(_call, fn, args).result(timeout=timeout)
        except BrokenProcessPool:
            state.pop("pool").shutdown(cancel_futures=True)
            pytest.fail(f"{fn.__name__}: the capped worker died (memory cap {MEMORY_BUDGET >> 20} MiB hit in C code?)")
        assert growth < RSS_GROWTH_LIMIT, f"{fn.__name__}: peak RSS grew by {growth >> 20} MiB"
        return result

    yield run
    if "pool" in state:
        state["pool"].shutdown()


# ------------------------------------------------------------------ checking one input
def _texts(row: dict[str, Any]) -> str:
    return "\n".join(m["content"] or "" for m in row["messages"] or []) + "\n" + (row["label"] or "") \
        + "\n" + (row["meta"] or "")


def check_input(path: Path, reader: str = "auto", fmt: str = "auto", chunk: int | None = None,
                max_record_bytes: int | None = None, json_key: str | None = None) -> dict[str, Any]:
    """Read (deferred, as the pipeline does) and normalize one input; assert the promise.

    Returns {"error": message} for an InputError, else the rows in, the kept rows' marker
    lists and the rejected (reason, detail, record) triples.
    """
    import pyarrow as pa

    from dataguard.io import bounded
    from dataguard.io.readers import DEFAULT_MAX_RECORD_BYTES, InputError, InputSpec, read_batches
    from dataguard.records import REJECTED_SCHEMA
    from dataguard.stages.normalize import Normalizer

    saved = bounded.READ_CHUNK_BYTES
    if chunk:
        bounded.READ_CHUNK_BYTES = chunk
    try:
        spec = InputSpec(path=path, reader=reader, format=fmt, json_key=json_key)
        norm = Normalizer()
        positions: list[int] = []
        kept: list[pa.Table] = []
        rejected: list[pa.Table] = []
        try:
            for batch in read_batches(spec, batch_rows=7, defer_parse=True,
                                      max_record_bytes=max_record_bytes or DEFAULT_MAX_RECORD_BYTES):
                n = len(batch)
                batch.parse_pending()
                assert len(batch) == n
                positions += batch.positions
                out = norm.normalize(batch, spec.options())
                assert out.kept.num_rows + out.rejected.num_rows == n
                kept.append(out.kept)
                rejected.append(out.rejected)
        except InputError as exc:
            assert str(exc) and "\n" not in str(exc)
            return {"error": str(exc)}
        if spec.resolved_reader() == "jsonl" and not path.name.endswith(".gz"):
            # Workers read a JSON-lines file in byte ranges: wherever the ranges are cut,
            # they must give exactly the whole-file reader's rows.
            for split_bytes in (1, 13, 97):
                assert _by_ranges(path, spec, split_bytes, max_record_bytes or DEFAULT_MAX_RECORD_BYTES) \
                    == _rows_of(kept, rejected), split_bytes
    finally:
        bounded.READ_CHUNK_BYTES = saved
    assert positions == list(range(len(positions))), positions[:20]
    rej = pa.concat_tables(rejected).cast(REJECTED_SCHEMA)
    for reason, detail in zip(rej.column("reason").to_pylist(), rej.column("detail").to_pylist(), strict=True):
        assert reason and detail, (reason, detail)
    rows = pa.concat_tables(kept).to_pylist()
    return {"rows_in": len(positions), "kept": [MARK.findall(_texts(r)) for r in rows],
            "rejected": list(zip(rej.column("reason").to_pylist(), rej.column("detail").to_pylist(),
                                 rej.column("record").to_pylist(), strict=True))}


def _rows_of(kept: list[Any], rejected: list[Any]) -> tuple[list[Any], list[Any]]:
    return ([r for t in kept for r in t.to_pylist()], [r for t in rejected for r in t.to_pylist()])


def _by_ranges(path: Path, spec: Any, split_bytes: int, max_bytes: int) -> tuple[list[Any], list[Any]]:
    """Index the ranges, read each unit's lines from its range, normalize: as workers do."""
    from dataguard.io.line_index import index_lines, plan_line_ranges
    from dataguard.run.splits import line_splits
    from dataguard.stages.normalize import Normalizer

    indexes = [index_lines(path, start, end, max_bytes, 7) for start, end in plan_line_ranges(path, split_bytes)]
    kept, rejected = [], []
    for unit in line_splits(str(path), indexes, 7, max_bytes):
        out = Normalizer().normalize(unit.read(str(spec.name)).parse_pending(), spec.options())
        kept.append(out.kept)
        rejected.append(out.rejected)
    return _rows_of(kept, rejected)


def _assert_no_merge(result: dict[str, Any], intact: bool, n_rows: int) -> None:
    """No kept row holds two markers; an undamaged file keeps every row."""
    assert "error" not in result, result
    for marks in result["kept"]:
        assert len(marks) <= 1, marks
    seen = [m for marks in result["kept"] for m in marks]
    assert len(seen) == len(set(seen)), "a marker was kept twice"
    if intact:
        assert [m for marks in result["kept"] for m in marks] == [f"mk{i}z" for i in range(n_rows)], result


# ------------------------------------------------------------------ generators
SAFE_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e"
                                  "\x85\u2028\u2029"), max_size=30)
TOKENS = [b'"', b"\\", b"[", b"{", b"]", b"}", b",", b":", b"\n", b"\r", b"\r\n", b"\xff", b"\xc3", b"\x00",
          b"\xef\xbb\xbf", b"\\ud800", b"\\udc00", b'"\\ud83d"', b"\t", b" "]


@st.composite
def mutations(draw: Any) -> list[tuple[float, bytes, int]]:
    """Byte edits at relative positions: (where in 0..1, bytes to insert, bytes to delete)."""
    return draw(st.lists(st.tuples(st.floats(0, 1), st.sampled_from(TOKENS) | st.binary(max_size=3),
                                   st.integers(0, 4)), max_size=4))


def _mutate(data: bytes, edits: list[tuple[float, bytes, int]]) -> bytes:
    return _mutate_and_tell(data, edits)[0]


def _mutate_and_tell(data: bytes, edits: list[tuple[float, bytes, int]]) -> tuple[bytes, bool]:
    """The edited bytes, and whether an edit deleted a line break (joining two rows in the
    file itself, which no reader can undo)."""
    joined = False
    for where, insert, delete in edits:
        at = int(where * len(data))
        joined = joined or b"\n" in data[at:at + delete] or b"\r" in data[at:at + delete]
        data = data[:at] + insert + data[at + delete:]
    return data, joined


def _alpaca(i: int, text: str, extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"instruction": f"mk{i}z {text}", "input": "", "output": f"answer {text}."}
    if extra is not None:
        rec["extra"] = extra
    return rec


JSON_EXTRA = st.none() | st.recursive(st.none() | st.booleans() | st.integers() | SAFE_TEXT,
                                      lambda inner: st.lists(inner, max_size=3)
                                      | st.dictionaries(SAFE_TEXT, inner, max_size=3), max_leaves=8)


# ------------------------------------------------------------------ property-based bodies
@SETTINGS
@given(texts=st.lists(st.tuples(SAFE_TEXT, JSON_EXTRA), max_size=12), sep=st.sampled_from([b"\n", b"\r\n", b"\r"]),
       ascii_only=st.booleans(), bom=st.booleans(), blank=st.booleans(), edits=mutations(),
       chunk=st.sampled_from([5, 64, 1 << 20]), gz=st.booleans())
def fuzz_jsonl(texts: list[tuple[str, Any]], sep: bytes, ascii_only: bool, bom: bool, blank: bool,
               edits: list[tuple[float, bytes, int]], chunk: int, gz: bool) -> None:
    lines = [json.dumps(_alpaca(i, t, x), ensure_ascii=ascii_only).encode() for i, (t, x) in enumerate(texts)]
    data = (b"\xef\xbb\xbf" if bom else b"") + (sep + (sep if blank else b"")).join(lines) + sep
    data = _mutate(data, edits)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("f.jsonl.gz" if gz else "f.jsonl")
        path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
        result = check_input(path, chunk=chunk)
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    expected = sum(1 for line in re.split(rb"\r\n|\r|\n", body) if line.strip())
    assert result["rows_in"] == max(expected, 1), (result["rows_in"], expected)  # an empty file is one row
    _assert_no_merge(result, intact=not edits, n_rows=len(texts))


@SETTINGS
@given(texts=st.lists(st.tuples(SAFE_TEXT, JSON_EXTRA), max_size=12), indent=st.sampled_from([None, 0, 2]),
       bom=st.booleans(), edits=mutations(), chunk=st.sampled_from([5, 64, 1 << 20]),
       key=st.sampled_from([None, "data", "a.b"]))
def fuzz_json_array(texts: list[tuple[str, Any]], indent: int | None, bom: bool,
                    edits: list[tuple[float, bytes, int]], chunk: int, key: str | None) -> None:
    items: Any = [_alpaca(i, t, x) for i, (t, x) in enumerate(texts)]
    doc = {"version": [1, {"x": "]"}], "data": items} if key == "data" else \
        {"skip": "[", "a": {"z": 1, "b": items}} if key == "a.b" else items
    data = (b"\xef\xbb\xbf" if bom else b"") + json.dumps(doc, indent=indent).encode()
    data = _mutate(data, edits)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.json"
        path.write_bytes(data)
        result = check_input(path, reader="json", chunk=chunk, json_key=key)
    if "error" in result:
        assert edits, result  # only damage can hide the array
        return
    _assert_no_merge(result, intact=not edits, n_rows=len(texts))


@SETTINGS
@given(texts=st.lists(st.tuples(SAFE_TEXT, st.sampled_from(["greet", "bye", "", " ", "a,b", 'say "hi"'])),
                      max_size=12),
       multiline=st.booleans(), tsv=st.booleans(), sep=st.sampled_from(["\n", "\r\n", "\r"]), bom=st.booleans(),
       edits=mutations(), chunk=st.sampled_from([5, 64, 1 << 20]))
def fuzz_csv(texts: list[tuple[str, str]], multiline: bool, tsv: bool, sep: str, bom: bool,
             edits: list[tuple[float, bytes, int]], chunk: int) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter="\t" if tsv else ",", lineterminator=sep,  # "\n" alone is not quoted
                        quoting=csv.QUOTE_ALL if multiline else csv.QUOTE_MINIMAL)
    writer.writerow(["text", "label"])
    for i, (text, label) in enumerate(texts):
        body = f"mk{i}z {text}" + ("\nsecond line" if multiline else "")
        writer.writerow([body, label])
    data = (b"\xef\xbb\xbf" if bom else b"") + buf.getvalue().encode()
    data, joined = _mutate_and_tell(data, edits)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("f.tsv" if tsv else "f.csv")
        path.write_bytes(data)
        result = check_input(path, chunk=chunk)
    assert "error" not in result
    if not joined:  # (a deleted line break joins two rows in the file itself: one row now)
        for marks in result["kept"]:
            assert len(marks) <= 1, marks
    if not edits and (not multiline or len(texts) >= 2):
        labelled = [f"mk{i}z" for i, (_, label) in enumerate(texts) if label.strip()]
        assert [m for marks in result["kept"] for m in marks] == labelled
        assert result["rows_in"] == max(1, len(texts))


ROW = st.fixed_dictionaries({
    "messages": st.none() | st.just([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]),
    "instruction": st.none() | SAFE_TEXT,
    "input": st.none() | st.just(""),
    "output": st.none() | SAFE_TEXT,
    "label": st.none() | st.sampled_from(["", " ", "pos"]),
    "blob": st.none() | st.binary(max_size=20),
})


@SETTINGS
@given(rows=st.lists(ROW, max_size=10), big=st.booleans(), hf=st.booleans())
def fuzz_parquet(rows: list[dict[str, Any]], big: bool, hf: bool) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
                        ("instruction", pa.string()), ("input", pa.string()), ("output", pa.string()),
                        ("label", pa.string()), ("blob", pa.binary())])
    rows = [{**r, "instruction": f"mk{i}z {r['instruction']}" if r["instruction"] is not None else None}
            for i, r in enumerate(rows)]
    if big and rows:
        rows[0] = {**rows[0], "output": "x" * 5000}
    table = pa.Table.from_pylist(rows, schema=schema)
    with tempfile.TemporaryDirectory() as tmp:
        if hf and rows:  # (`datasets` cannot load an empty saved dataset)
            datasets.Dataset(table).save_to_disk(f"{tmp}/ds")
            path = Path(tmp) / "ds"
        else:
            path = Path(tmp) / "f.parquet"
            pq.write_table(table, path, row_group_size=3)
        result = check_input(path, max_record_bytes=4000)
    assert result["rows_in"] == max(1, len(rows))
    for marks in result["kept"]:
        assert len(marks) <= 1
    if big and rows:
        assert any(reason == "record_too_large" for reason, _, _ in result["rejected"])


@SETTINGS
@given(data=st.binary(max_size=3000) | st.lists(st.sampled_from(TOKENS + [b"a", b"1", b'{"a":', b"mk1z"]),
                                                max_size=200).map(b"".join),
       name=st.sampled_from(["f.jsonl", "f.json", "f.csv", "f.tsv", "f.parquet", "f.jsonl.gz", "f.json.gz",
                             "f.csv.gz"]),
       gz=st.sampled_from(["plain", "compressed", "truncated"]), chunk=st.sampled_from([5, 1 << 20]))
def fuzz_random_bytes(data: bytes, name: str, gz: str, chunk: int) -> None:
    if name.endswith(".gz") and gz != "plain":
        packed = gzip.compress(data, mtime=0)
        data = packed[: len(packed) // 2] if gz == "truncated" else packed
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        result = check_input(path, chunk=chunk)
        if name.endswith(".json"):
            check_input(path, reader="json", json_key="k")
    if "error" in result:
        assert name.startswith("f.json") and "JSON object" in result["error"], result
        return
    assert result["rows_in"] >= 1


# ------------------------------------------------------------------ adversarial files
def _deep(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


def _gzip_bomb(path: Path, size: int) -> None:
    """One line of ``size`` bytes of JSON in a small gzip file (written in pieces)."""
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(comp.compress(b'{"instruction": "mk0z", "output": "a"}\n{"instruction": "'))
        piece = b"x" * (4 << 20)
        for _ in range(size // len(piece)):
            f.write(comp.compress(piece))
        f.write(comp.compress(b'", "output": "y"}\n{"instruction": "mk2z", "output": "b"}\n'))
        f.write(comp.flush())


def adversarial_files(folder: str) -> dict[str, Any]:
    """Each issue-10 file in turn; returns a summary per file (checked by the caller)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    out: dict[str, Any] = {}
    root = Path(folder)

    def run(name: str, data: bytes | None = None, **kw: Any) -> dict[str, Any]:
        path = root / name
        if data is not None:
            path.write_bytes(data)
        out[name] = check_input(path, **kw)
        return out[name]

    ok = b'{"instruction": "mk%dz", "output": "a"}'
    # memory: a 512 MiB line in a ~0.5 MB gzip; nesting 10^6 deep in a JSON array and a line
    _gzip_bomb(root / "bomb.jsonl.gz", 512 << 20)
    run("bomb.jsonl.gz")
    run("deep.json", b"[" + ok % 0 + b"," + _deep(1_000_000) + b"," + b'{"a":' * 300_000 + b"]")
    run("deep.jsonl", b"\n".join([ok % 0, _deep(1000), _deep(1_000_000), ok % 3]))
    # lone surrogates on every path
    run("sur.jsonl", b"\n".join([ok % 0, b'{"instruction": "mk1z \\ud800", "output": "a"}']))
    run("sur.json", b"[" + ok % 0 + b',{"instruction": "mk1z", "output": "\\udfff"}]')
    run("sur.csv", b"te\xffxt,lab\xfeel\nmk0z \xed\xa0\x80,x\n")
    # damaged gzip: truncated, not gzip at all, for each reader
    lines = b"\n".join(ok % i for i in range(2000)) + b"\n"
    run("trunc.jsonl.gz", gzip.compress(lines, mtime=0)[:3000])
    run("notgz.json.gz", b"[" + ok % 0 + b"]")
    run("trunc.csv.gz", gzip.compress(b"text,label\n" + b"".join(b"mk%dz,x\n" % i for i in range(3000)),
                                      mtime=0)[:2000])
    # binary garbage CSV, BOMs, CR-only lines, unclosed quotes
    run("garbage.csv", bytes(range(256)) * 64)
    run("bom.jsonl", b"\xef\xbb\xbf" + ok % 0 + b"\n" + ok % 1)
    run("bom.json", b"\xef\xbb\xbf[" + ok % 0 + b"," + ok % 1 + b"]")
    run("cr.jsonl", b"\r".join(ok % i for i in range(10)))
    run("quote.csv", b'text,label\n"mk0z,a\nmk1z,b\nmk2z c",d\nmk3z,e\n')
    # a null messages column beside Alpaca fields; an empty label
    table = pa.Table.from_pylist([{"messages": None, "instruction": "mk0z", "input": "", "output": "a"}])
    pq.write_table(table, root / "nulls.parquet")
    run("nulls.parquet")
    datasets.Dataset(table).save_to_disk(str(root / "nulls_ds"))
    run("nulls_ds")
    run("labels.csv", b'text,label\nmk0z,greet\nmk1z,""\n')
    # one clear error: a top-level object, a folder that is not a dataset
    run("object.json", json.dumps({"data": [{"instruction": "mk0z", "output": "a"}], "version": 1},
                                  indent=2).encode())
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("hello")
    run("notes")
    return out


def pipeline_run(folder: str) -> dict[str, Any]:
    """End to end, one worker: adversarial inputs together still balance the manifest."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline

    root = Path(folder)
    files = {
        "sur.jsonl": b'{"instruction": "mk0z", "output": "a"}\n{"instruction": "\\ud800", "output": "b"}\n',
        "deep.json": b'[{"instruction": "mk1z", "output": "a"},' + _deep(5000) + b"]",
        "cr.jsonl": b'{"instruction": "mk2z", "output": "a"}\r{"instruction": "mk3z", "output": "b"}\r',
        "notgz.jsonl.gz": b'{"instruction": "mk4z", "output": "a"}\n',
        "garbage.csv": bytes(range(256)) * 8,
        "quote.csv": b'text,label\n"mk5z,a\nmk6z,b\n',
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    result = Pipeline([], workers=1).run([InputSpec(path=root / name) for name in files], root / "out")
    return result.manifest["counts"]


# ------------------------------------------------------------------ the tests
def run_fuzz(name: str) -> None:
    """Run one Hypothesis body by name (a @given function cannot be pickled to the worker)."""
    globals()[name]()


@pytest.mark.parametrize("body", ["fuzz_jsonl", "fuzz_json_array", "fuzz_csv", "fuzz_parquet", "fuzz_random_bytes"])
def test_fuzz(capped: Callable[..., Any], body: str) -> None:
    capped(run_fuzz, body)


def test_adversarial_files(capped: Callable[..., Any], tmp_path: Path) -> None:
    out = capped(adversarial_files, str(tmp_path))

    def reasons(name: str) -> list[str]:
        return [r for r, _, _ in out[name]["rejected"]]

    def kept(name: str) -> list[str]:
        return [m for marks in out[name]["kept"] for m in marks]

    assert (kept("bomb.jsonl.gz"), reasons("bomb.jsonl.gz")) == (["mk0z", "mk2z"], ["record_too_large"])
    bomb_raw = out["bomb.jsonl.gz"]["rejected"][0][2]
    assert len(bomb_raw) < 70_000 and "536,870,9" in bomb_raw  # clipped, with the size and hash
    assert (kept("deep.json"), reasons("deep.json")) == (["mk0z"], ["too_deep", "invalid_json"])
    assert (kept("deep.jsonl"), reasons("deep.jsonl")) == (["mk0z", "mk3z"], ["too_deep", "too_deep"])
    assert reasons("sur.jsonl") == reasons("sur.json") == ["invalid_unicode"]
    assert reasons("sur.csv") == ["invalid_utf8"]
    for name in ("trunc.jsonl.gz", "notgz.json.gz", "trunc.csv.gz"):
        assert reasons(name).count("corrupt_compressed_file") == 1 and reasons(name)[-1] == "corrupt_compressed_file"
    assert kept("trunc.jsonl.gz") == [f"mk{i}z" for i in range(len(kept("trunc.jsonl.gz")))]
    assert out["garbage.csv"]["kept"] == [] and out["garbage.csv"]["rows_in"] > 1
    assert kept("bom.jsonl") == kept("bom.json") == ["mk0z", "mk1z"]
    assert kept("cr.jsonl") == [f"mk{i}z" for i in range(10)]
    # the stray quote's line and the line that closes it; the valid rows between are kept (#22)
    assert (kept("quote.csv"), reasons("quote.csv")) == (["mk1z", "mk3z"], ["malformed_csv"] * 2)
    assert kept("nulls.parquet") == kept("nulls_ds") == ["mk0z"]
    assert (kept("labels.csv"), reasons("labels.csv")) == (["mk0z"], ["missing_field"])
    assert "set json_key" in out["object.json"]["error"] and "data, version" in out["object.json"]["error"]
    assert "not a saved Hugging Face dataset" in out["notes"]["error"]


def test_pipeline_end_to_end(capped: Callable[..., Any], tmp_path: Path) -> None:
    counts = capped(pipeline_run, str(tmp_path))
    assert counts["balanced"] and counts["rows_kept"] == 5, counts  # quote.csv keeps mk6z after the stray quote
