"""Unit tests of the HTML audit report: on real pipeline runs over sample_data/ (conftest's
``sft_run_dir`` / ``classification_run_dir``) and, for the loader's edge cases, on small
rejected shards written with pyarrow."""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pytest

from dataguard.records import REJECTED_SCHEMA, json_dumps
from dataguard.report import ReportInputError, build_report, collect
from dataguard.report.assets import CSS, JS, csp_hash
from dataguard.report.blocks import highlight, render_block
from dataguard.report.fmt import yamlish
from dataguard.report.load import MAX_MESSAGE_CHARS, parse_record, sample_rejected
from dataguard.report.svg import _is_geometric, histogram, nice_ticks
from dataguard.testing.runs import CLASSIFICATION_STAGES, PAYLOADS, SFT_STAGES


class TagCollector(HTMLParser):
    """Every start tag and its attributes as a browser's tokenizer would see them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_bodies: list[str] = []
        self.style_bodies: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in = tag if tag in ("script", "style") else None

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in == "script":
            self.script_bodies.append(data)
        elif self._in == "style":
            self.style_bodies.append(data)


@pytest.fixture(scope="module")
def sft_dir(sft_run_dir) -> Path:
    return sft_run_dir


def _copy(run: Path, dest: Path) -> Path:
    """A private copy of a session run, for tests that edit it."""
    return Path(shutil.copytree(run, dest))


@pytest.fixture(scope="module")
def sft_report(sft_dir) -> tuple[Path, str, dict]:
    html_path = build_report(sft_dir)
    model = json.loads(html_path.with_suffix(".json").read_text(encoding="utf-8"))
    return html_path, html_path.read_text(encoding="utf-8"), model


def test_writes_html_and_json_with_manifest_counts(sft_dir, sft_report):
    html_path, page, model = sft_report
    manifest = json.loads((sft_dir / "manifest.json").read_text())
    assert html_path == sft_dir / "audit.html" and html_path.with_suffix(".json").is_file()
    rows_in = sum(i["rows"] for i in manifest["inputs"])
    assert model["counts"]["rows_in"] == manifest["counts"]["rows_in"] == rows_in > 900
    assert model["counts"]["rows_kept"] + model["counts"]["rows_rejected"] == rows_in
    assert model["nothing_lost"] is True
    assert all(c["ok"] for c in model["checks"]), model["checks"]
    assert "NOTHING LOST" in page
    reasons = {(r["stage"], r["reason"]): r["count"] for r in model["reasons"]}
    expected = {(s["name"], k): v for s in manifest["stages"] for k, v in s["reasons"].items()}
    assert reasons == expected
    for r in model["reasons"]:
        assert 1 <= len(r["samples"]) <= min(12, r["count"])
        assert all(s["id"] for s in r["samples"])


def test_sections_present_only_for_stages_that_ran(sft_report, classification_run_dir, tmp_path):
    _, page, _ = sft_report
    for name in SFT_STAGES:
        assert f'id="stage-{name}"' in page
    for name in ("noise", "longtail", "drift", "consistency"):
        assert f'id="stage-{name}"' not in page
    for sid in ("overview", "inputs", "funnel", "rejects", "kept", "config"):
        assert f'id="{sid}"' in page
    assert 'id="training"' in page  # the length stage's cap, for the training runner
    page2 = build_report(classification_run_dir, tmp_path / "cls.html").read_text()
    for name in CLASSIFICATION_STAGES:
        assert f'id="stage-{name}"' in page2
    for name in ("length", "quality", "overlap", "consistency", "dedup"):
        assert f'id="stage-{name}"' not in page2
    assert 'class="heat' in page2 and 'id="training"' in page2


def test_no_external_resources_and_nothing_executable_from_data(sft_report):
    _, page, _ = sft_report
    parser = TagCollector()
    parser.feed(page)
    tags = [t for t, _ in parser.tags]
    assert tags.count("script") == 1 and tags.count("style") == 1
    for forbidden in ("img", "iframe", "object", "embed", "link", "svg:script", "textarea", "form", "base"):
        assert forbidden not in tags, forbidden
    for tag, attrs in parser.tags:
        assert not [a for a in attrs if a.lower().startswith("on")], (tag, attrs)
        assert "style" not in attrs, (tag, attrs)  # the CSP forbids inline style attributes
        for a in ("src", "href", "xlink:href", "action"):
            if attrs.get(a) is not None:
                assert attrs[a].startswith("#"), (tag, a, attrs[a])
    assert tags.count("svg") >= 5
    # the payloads are on the page, as text
    for p in PAYLOADS[:4]:
        assert p.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;").replace(
            "'", "&#x27;") in page
    assert "window.__pwned" not in parser.script_bodies[0]


def test_csp_is_strict_and_hashes_match_the_inline_code(sft_report):
    _, page, _ = sft_report
    parser = TagCollector()
    parser.feed(page)
    meta = [a for t, a in parser.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert len(meta) == 1
    csp = meta[0]["content"]
    assert "default-src 'none'" in csp and "img-src data:" in csp and "unsafe" not in csp
    assert parser.script_bodies == [JS] and parser.style_bodies == [CSS]
    assert f"script-src {csp_hash(parser.script_bodies[0])}" in csp
    assert f"style-src {csp_hash(parser.style_bodies[0])}" in csp
    assert page.index("Content-Security-Policy") < page.index("<style>")


def test_deterministic_output(sft_dir, tmp_path):
    a = build_report(sft_dir, tmp_path / "a.html")
    b = build_report(sft_dir, tmp_path / "b.html", tmp_path / "b-stats.json")
    assert a.read_bytes() == b.read_bytes()
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b-stats.json").read_bytes()


def _write_rejected(path: Path, rows: list[dict], batch: int = 1000) -> None:
    table = pa.Table.from_pylist(rows, schema=REJECTED_SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, REJECTED_SCHEMA) as w:
        for b in table.to_batches(max_chunksize=batch):
            w.write_batch(b)


def _rej(i: int, reason: str, stage: str = "length") -> dict:
    rec = {"id": f"s:{i}", "source": "s", "messages": [{"role": "user", "content": f"q{i}"}], "label": None,
           "meta": None, "n_tokens": i}
    return {"id": f"s:{i}", "source": "s", "stage": stage, "reason": reason, "detail": f"d{i}",
            "record": json_dumps(rec)}


def test_sampling_stops_early_and_is_bounded(tmp_path):
    rows = [_rej(i, "too_long") for i in range(50_000)] + [_rej(50_000 + i, "too_short") for i in range(30)]
    _write_rejected(tmp_path / "rejected" / "part-0.arrow", rows[:20_000])
    _write_rejected(tmp_path / "rejected" / "part-1.arrow", rows[20_000:])
    # every expected reason is common at the start: reading stops after the first batch
    samples, scanned, complete = sample_rejected(tmp_path / "rejected", {("length", "too_long"): 50_000}, 5)
    assert [s["id"] for s in samples[("length", "too_long")]] == [f"s:{i}" for i in range(5)]
    assert scanned == 1000 and not complete
    # a rare reason at the very end forces a full (streamed) scan, still 5 samples each at most
    samples, scanned, complete = sample_rejected(
        tmp_path / "rejected", {("length", "too_long"): 50_000, ("length", "too_short"): 30}, 5)
    assert scanned == 50_030  # read to the end for the rare reason
    assert len(samples[("length", "too_long")]) == 5 and len(samples[("length", "too_short")]) == 5
    assert samples[("length", "too_short")][0]["record"]["scores"] == {"n_tokens": 50_000}


def test_reads_ipc_file_format_shards_too(tmp_path):
    table = pa.Table.from_pylist([_rej(i, "r") for i in range(3)], schema=REJECTED_SCHEMA)
    (tmp_path / "rejected").mkdir()
    with pa.OSFile(str(tmp_path / "rejected" / "x.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    samples, scanned, _ = sample_rejected(tmp_path / "rejected", {("length", "r"): 3}, 10)
    assert scanned == 3 and len(samples[("length", "r")]) == 3


def test_unbalanced_run_is_reported_loudly(sft_run_dir, tmp_path):
    out = _copy(sft_run_dir, tmp_path / "o")
    m = json.loads((out / "manifest.json").read_text())
    m["counts"]["rows_kept"] -= 7
    m["counts"]["balanced"] = False
    (out / "manifest.json").write_text(json.dumps(m))
    page = build_report(out).read_text()
    model = collect(out)
    assert model["nothing_lost"] is False
    assert "ROWS UNACCOUNTED FOR" in page and "NOTHING LOST" not in page
    assert "difference +7" in page


def test_missing_manifest_raises(tmp_path):
    with pytest.raises(ReportInputError, match="manifest.json"):
        build_report(tmp_path)


def test_stage_without_description_and_unknown_blocks_still_render(sft_run_dir, tmp_path):
    weird = [{"type": "sankey", "title": "Future block", "nodes": ["<b>x</b>"]},
             {"type": "histogram", "title": "Broken", "series": {"a": [1]}},
             {"type": "table", "columns": ["a"], "rows": [["<i>v</i>", 1.5]]}]
    out = _copy(sft_run_dir, tmp_path / "o")
    m = json.loads((out / "manifest.json").read_text())
    m["stages"][0].pop("description")
    m["stages"][1]["description"]["blocks"].extend(weird)
    (out / "manifest.json").write_text(json.dumps(m))
    page = build_report(out).read_text()
    assert 'id="stage-normalize"' in page and 'id="stage-dedup"' in page
    assert "Future block" in page and "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert "KeyError" in page  # the broken histogram is shown as data, with why
    assert "&lt;i&gt;v&lt;/i&gt;" in page


def test_block_renderers():
    h = render_block({"type": "histogram", "title": "t", "edges": [0, 1, 2, 3],
                      "series": {"before": [1, 2, 3], "after": [1, 2, 0]}, "markers": [{"label": "cap", "value": 2}]})
    assert h.count("<path") == 2 and "cap = 2" in h and "Data (3 bins)" in h
    b = render_block({"type": "bar", "labels": ["a", "b"], "series": {"n": [3, 1]}})
    assert b.count("<rect") == 2 and "<svg" in b
    mx = render_block({"type": "matrix", "row_labels": ["a", "b"], "col_labels": ["a", "b"],
                       "values": [[0.9, 0.1], [0.3, 0.7]], "row_title": "given", "col_title": "true"})
    assert 'class="heat"' in mx and "d9" in mx and "h9" in mx  # diagonal and off-diagonal maxima
    assert "Largest off-diagonal cells" in mx
    ex = render_block({"type": "examples", "items": [{"id": "r1", "text": "abc <x> def", "spans": [[4, 7]],
                                                      "reference": "<x>", "reference_spans": [[0, 3]], "score": 0.5}]})
    assert ex.count("<mark>&lt;x&gt;</mark>") == 2 and "Score: <b>0.5</b>" in ex
    t = render_block({"type": "text", "text": "a\n<script>"})
    assert "&lt;script&gt;" in t and "<script>" not in t


def test_highlight_spans_and_long_text():
    assert highlight("hello world", [[6, 11], [0, 2], [1, 3]]) == "<mark>hel</mark>lo <mark>world</mark>"
    assert highlight("ab", [[5, 9], [1, 0], ["x", 1]]) == "ab"
    long = "x" * 10_000 + "NEEDLE" + "y" * 10_000
    out = highlight(long, [[10_000, 10_006]])
    assert "<mark>NEEDLE</mark>" in out and len(out) < 1000 and "more characters" in out


def test_parse_record_kinds_and_bounds():
    raw = parse_record("{not json <script>")
    assert raw["kind"] == "raw" and raw["text"] == "{not json <script>"
    js = parse_record('{"foo": [1, 2]}')
    assert js["kind"] == "json" and '"foo"' in js["text"]
    big = json_dumps({"id": "1", "source": "s", "messages": [{"role": "assistant", "content": "z" * 100_000}],
                      "label": "L", "meta": '{"k": 1}', "n_tokens": 5})
    row = parse_record(big)
    assert row["kind"] == "row" and row["label"] == "L" and row["scores"] == {"n_tokens": 5}
    assert len(row["messages"][0]["content"]) == MAX_MESSAGE_CHARS and row["messages"][0]["cut"] == 100_000 - MAX_MESSAGE_CHARS
    assert '"k": 1' in row["meta"]


def test_huge_records_do_not_bloat_the_page(tmp_path):
    rows = [{**_rej(i, "too_long"), "record": json_dumps({"id": str(i), "source": "s", "label": None, "meta": None,
                                                         "messages": [{"role": "user", "content": "w " * 200_000}]})}
            for i in range(30)]
    _write_rejected(tmp_path / "rejected" / "p.arrow", rows)
    manifest = {"counts": {"rows_in": 30, "rows_kept": 0, "rows_rejected": 30, "balanced": True},
                "stages": [{"name": "length", "rows_in": 30, "rows_kept": 0, "rows_rejected": 30,
                            "reasons": {"too_long": 30}}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    page = build_report(tmp_path).read_text()
    assert len(page) < 120_000  # 12 samples x 1,500 chars, not 30 x 400 KB
    assert "398,500 more characters" in page


def test_svg_helpers():
    assert nice_ticks(0, 1000, 4) == [0, 250, 500, 750, 1000]
    assert _is_geometric([4, 8, 16, 32, 64, 128, 256, 512]) and not _is_geometric(list(range(0, 100, 10)))
    svg = histogram([1, 10, 100, 1000, 10_000, 100_000, 1_000_000], {"n": [1, 2, 3, 4, 5, 6]}, [], x_label="t")
    assert "(log scale)" in svg
    assert re.search(r'viewBox="0 0 \d+ \d+"', svg)


def test_yamlish_config_is_unambiguous():
    text = yamlish({"stages": [{"length": {"percentile": 90}}], "s": "true", "t": "a: b", "n": None})
    assert text.splitlines() == ["stages:", "  - length:", "      percentile: 90", 's: "true"', 't: "a: b"', "n: null"]


def test_many_reasons_get_fewer_samples_each(tmp_path):
    rows = [_rej(i, f"reason_{i % 300}") for i in range(3000)]
    _write_rejected(tmp_path / "rejected" / "p.arrow", rows)
    manifest = {"counts": {"rows_in": 3000, "rows_kept": 0, "rows_rejected": 3000, "balanced": True},
                "stages": [{"name": "length", "rows_in": 3000, "rows_kept": 0, "rows_rejected": 3000,
                            "reasons": {f"reason_{k}": 10 for k in range(300)}}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    model = collect(tmp_path)
    assert model["rejected_scan"]["per_reason"] == 3
    assert len(model["reasons"]) == 300 and all(len(r["samples"]) == 3 for r in model["reasons"])


def test_overview_share_bar_and_percent_summaries(sft_dir, sft_report):
    _, page, _ = sft_report
    assert "Where the rows went" in page and "rejected by dedup" in page
    length = next(s for s in json.loads((sft_dir / "manifest.json").read_text())["stages"] if s["name"] == "length")
    share = length["description"]["summary"]["share_tokens_removed"]
    assert 0 < share < 1  # shown as a percentage, not a fraction
    assert f"Share tokens removed</div><div class=\"v\">{share:.2%}" in page


def test_end_to_end_with_the_real_pipeline(tmp_path):
    """A real run (normalize + dedup) over a file with payloads, a duplicate and a broken line."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline
    from dataguard.stages.dedup import DedupStage

    rows = [{"instruction": f"Question {i} {PAYLOADS[i % len(PAYLOADS)]}", "input": "", "output": f"Answer {i}."}
            for i in range(40)]
    rows.append(dict(rows[3]))  # an exact duplicate
    lines = [json.dumps(r) for r in rows] + ['{"instruction": "broken <script>window.__pwned=9</script>",']
    src = tmp_path / "train.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    Pipeline([DedupStage(action="drop")], workers=1).run([InputSpec(path=src, name="train")], out)
    page = build_report(out).read_text(encoding="utf-8")
    model = json.loads((out / "audit.json").read_text())
    assert model["nothing_lost"] is True and model["counts"]["rows_in"] == 42
    assert [s["name"] for s in model["stages"]] == ["normalize", "dedup"]
    assert 'id="stage-normalize"' in page and 'id="stage-dedup"' in page and 'id="stage-length"' not in page
    reasons = {r["reason"]: r for r in model["reasons"]}
    assert sum(r["count"] for r in model["reasons"]) == model["counts"]["rows_rejected"] == 2
    assert all(r["samples"] for r in reasons.values())
    parser = TagCollector()
    parser.feed(page)
    assert [t for t, _ in parser.tags].count("script") == 1
    assert "&lt;script&gt;window.__pwned=9&lt;/script&gt;" in page


def test_a_row_rejected_for_a_lone_surrogate_is_shown_not_fatal(tmp_path):
    """A ``\\ud800`` escape is valid JSON text; the row is rejected as invalid_unicode and the
    page shows it escaped (it once stopped the report: a lone surrogate cannot be UTF-8)."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline

    src = tmp_path / "train.jsonl"
    src.write_text('{"instruction": "Say hi", "input": "", "output": "hi \\ud800 there"}\n'
                   '{"instruction": "Say hello", "input": "", "output": "hello there"}\n', encoding="utf-8")
    out = tmp_path / "out"
    Pipeline([], workers=1).run([InputSpec(path=src, name="train")], out)
    page = build_report(out).read_text(encoding="utf-8")
    model = json.loads((out / "audit.json").read_text())
    assert [r["reason"] for r in model["reasons"]] == ["invalid_unicode"]
    assert "\\ud800" in page and model["nothing_lost"] is True
