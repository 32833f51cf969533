"""The training report (dataguard/train/report/page.py): built from a real tiny CPU run that has
only today's files, and from a synthetic rich run folder with every optional file of the
monitor and the guard (events with a rollback, per-layer norms, histograms, diagnosis).
Payloads planted in row ids, causes and layer names must come out as text; the page is
then opened in headless Chromium like the audit (no console errors, no requests)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.report import build_report
from dataguard.train.report.page import build_training_report
from dataguard.train.report.page_data import ReportInputError

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
P_SCRIPT = "<script>window.__pwned=1</script>"
P_ATTR = '"onerror="window.__pwned=2'
P_IMG = "<img src=x onerror=window.__pwned=3>"
P_LAYER = "<svg onload=window.__pwned=4>.weight"
LAYERS = ["model.embed_tokens", "model.layers.0.attn", "model.layers.0.mlp", "model.layers.1.attn",
          "model.layers.1.mlp", P_LAYER]


def _section_ids(html: str) -> list[str]:
    return re.findall(r'<section class="card" id="([^"]+)"', html)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trdata") / "data"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], out)
    build_report(out)  # audit.html beside the shards: the training page links to it
    return out


@pytest.fixture(scope="module")
def real_run(data_dir, tmp_path_factory) -> Path:
    from dataguard.train.config import load_train_config
    from dataguard.train.loop import Trainer

    run = tmp_path_factory.mktemp("trrun") / "run"
    cfg = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": str(data_dir), "output": str(run),
                             "max_steps": 4, "batch_size": 2, "lr": 3e-3, "max_length": 64, "eval_every": 2,
                             "save_every": 2, "keep_checkpoints": 1, "tensorboard": False, "log_every": 1})
    Trainer(cfg).fit()
    return run


def _write_jsonl(path: Path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def rich_run(tmp_path_factory) -> Path:
    """A run folder as the monitor and the guard will write it (all files synthetic)."""
    base = tmp_path_factory.mktemp("rich")
    data = base / "javascript:alert(1)"  # a folder name that would be a URL scheme if not encoded
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({
        "counts": {"rows_in": 1000, "rows_kept": 900, "rows_rejected": 100},
        "stages": [{"name": "dedup", "rows_in": 1000, "rows_kept": 940, "rows_rejected": 60,
                    "reasons": {"exact_duplicate": 60}},
                   {"name": "quality", "rows_in": 940, "rows_kept": 900, "rows_rejected": 40,
                    "reasons": {"repetition": 30, P_SCRIPT: 10}}]}))
    (data / "audit.html").write_text("<!DOCTYPE html><title>audit</title>")
    run = base / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({
        "config": {"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(run), "lr": 1e-3,
                   "max_steps": 120},
        "total_steps": 120, "train_examples": 300, "val_examples": 30, "notes": [P_IMG],
        "param_groups": [{"kind": "mlp", "rule": "mlp", "lr": 1e-3, "lr_mult": 1.0, "weight_decay": 0.01,
                          "tensors": 4, "params": 4096}]}))
    metrics, hist = [], []
    for step in range(1, 121):
        loss = 5.0 * math.exp(-step / 40) + 1.0
        norm = 1.0 / (1 + step / 30)
        rec = {"step": step, "loss": loss, "lr": 1e-3, "grad_norm": norm, "clipped": False, "skipped": False,
               "tokens": 2000, "tokens_per_s": 30000.0, "amp_scale": 65536.0,
               "lr_groups": {"mlp": 1e-3, "embeddings": 1e-4}}
        if step in (60, 61):
            rec.update(loss=float("nan"), grad_norm=float("inf"), skipped=True)
        if step % 10 == 0:
            rec["layer_grad_norms"] = {name: norm * (i + 1) for i, name in enumerate(LAYERS)}
            if step == 60:
                rec["layer_grad_norms"]["model.layers.1.mlp"] = float("nan")
            rec["update_ratios"] = {name: 1e-3 * (i + 1) for i, name in enumerate(LAYERS)}
            if step == 120:  # a non-finite value must never reach an SVG coordinate
                rec["update_ratios"][P_LAYER] = float("inf")
            rec["grad_std_ratio"] = {name: 0.5 for name in LAYERS}
            rec["n_big_grads"] = 3 if step == 60 else 0
            rec["n_big_weights"] = 0
        metrics.append(rec)
        if step % 10 == 0:
            metrics.append({"step": step, "eval_loss": loss + 0.2, "eval_accuracy": 0.3})
        if step % 50 == 0:
            hist.append({"step": step, "layers": {name: {"edges": [-1.0, -0.5, 0.0, 0.5, 1.0], "counts": [1, 5, 7, 2]}
                                                  for name in LAYERS}})
            hist[-1]["layers"]["broken"] = {"edges": [0, 1], "counts": [float("nan")]}  # left out
    # steps 56-61 re-run after the rollback: logged again, the later record stands
    metrics += [dict(r, loss=r["loss"] if r["step"] < 60 else 2.5, skipped=False, grad_norm=0.6)
                for r in metrics if 56 <= r["step"] <= 61 and "loss" in r]
    metrics.sort(key=lambda r: r["step"])
    metrics.insert(3, "not json at all {")  # a torn line must not break the page
    (run / "metrics.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in metrics))
    _write_jsonl(run / "histograms.jsonl", hist)
    _write_jsonl(run / "events.jsonl", [
        {"step": 50, "kind": "checkpoint", "detail": "step-000050"},
        {"step": 60, "kind": "fault", "cause": "injected nan", "layer": "model.layers.1.mlp"},
        {"step": 60, "kind": "anomaly", "cause": P_SCRIPT, "layer": P_LAYER, "rows": ["alpaca:17", P_ATTR]},
        {"step": 60, "kind": "skip", "cause": "non-finite loss"},
        {"step": 61, "kind": "rollback", "cause": "2 anomalies in 10 steps", "detail": {"to": "step-000050"},
         "lr": 5e-4, "rows": [P_IMG]},
        {"step": 70, "kind": "recovered", "cause": "loss back in range"},
    ])
    (run / "diagnosis.json").write_text(json.dumps({"step": 61, "first_layer": P_LAYER, "cause": P_SCRIPT,
                                                    "rows": ["alpaca:17", P_ATTR]}))
    (run / "best.json").write_text(json.dumps({"checkpoint": str(run / "checkpoints/step-000100"),
                                               "eval_loss": 1.9, "step": 100}))
    for name, complete in (("step-000100", True), ("step-000120", True), ("step-000110.tmp-123", False),
                           ("step-000115", False)):
        d = run / "checkpoints" / name
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"\0" * 2048)
        if complete:
            (d / "COMPLETE").write_text("ok\n")
    return run


def test_real_run_report(real_run, data_dir):
    page = build_training_report(real_run)
    assert page == real_run / "training.html"
    html = page.read_text(encoding="utf-8")
    ids = _section_ids(html)
    assert ids[:3] == ["overview", "curves", "events"]
    assert {"checkpoints", "final", "data-audit", "config"} <= set(ids)
    assert 'data-status="completed"' in html
    assert html.count('<svg class="chart"') >= 3  # loss, lr, grad norm
    assert 'class="ckpt" data-complete="1"' in html and ">best<" in html
    assert 'id="audit-link" href="../../' in html and "audit.html" in html
    assert "<script" not in html and "default-src &#x27;none&#x27;" in html
    assert not list(real_run.glob(".training.html.*"))  # atomic write left no temp file
    # registered in the run folder's marker, so a later build may overwrite it and others may not
    assert "training.html" in (real_run / ".dataguard").read_text()


def _legacy_copy(run: Path, dest: Path) -> Path:
    """The real run as the runner wrote it before the monitor and the guard: no events,
    histograms or diagnosis, and metrics.jsonl without the monitor's fields."""
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns("events.jsonl", "histograms.jsonl", "diagnosis.json",
                                                             "training.html", ".dataguard*"))
    keep = {"step", "loss", "lr", "grad_norm", "clipped", "skipped", "tokens", "tokens_per_s", "phase",
            "eval_loss", "eval_accuracy"}
    lines = (dest / "metrics.jsonl").read_text().splitlines()
    _write_jsonl(dest / "metrics.jsonl", [{k: v for k, v in json.loads(line).items() if k in keep} for line in lines])
    return dest


def test_legacy_run_folder_degrades_with_notes(real_run, tmp_path):
    legacy = _legacy_copy(real_run, tmp_path / "legacy")
    html = build_training_report(legacy).read_text(encoding="utf-8")
    ids = _section_ids(html)
    assert ids[:3] == ["overview", "curves", "events"]
    assert "layer-norms" not in ids and "histograms" not in ids and "diagnosis" not in ids
    assert 'data-status="completed"' in html
    assert "No events.jsonl" in html and "No per-layer gradient norms" in html  # notes, not errors
    assert html.count('<svg class="chart"') >= 3


def test_rich_run_report_has_every_section_and_marker(rich_run):
    html = build_training_report(rich_run).read_text(encoding="utf-8")
    ids = _section_ids(html)
    assert ids == ["overview", "diagnosis", "curves", "events", "named-rows", "layer-norms", "update-ratios",
                   "histograms", "checkpoints", "final", "data-audit", "config"]  # named-rows: issue #27
    assert 'data-status="stopped"' in html
    marks = re.findall(r'<g class="ev ([a-z -]+)">', html)
    for kind in ("rollback", "anomaly", "skip", "fault", "recovered"):
        assert any(f"ev-{kind}" in m.split() for m in marks), kind
    # one marker per step, in the colour of its most severe event: 60 = fault + anomaly + skip
    assert "ev-fault ev-anomaly ev-skip" in marks
    assert marks.count("ev-rollback") >= 4  # loss, lr, grad norm, heat maps
    assert 'class="chart heatmap"' in html and 'fill="#000000"' in html  # NaN layer norm drawn black
    loss_chart = html.split('id="curve-loss"')[1].split('id="curve-lr"')[0]
    assert 'class="nonfinite"' not in loss_chart  # steps 60-61 were re-run: the NaN records are superseded
    assert "1 step record(s) were logged again" not in html and "step record(s) were logged again" in html
    assert "1 line(s) were not JSON objects" in html
    assert html.count('class="ckpt"') == 4 and html.count('data-complete="0"') == 2
    assert "lr mlp" in html and "lr embeddings" in html  # per-group LR curves
    assert html.count('class="block block-histogram"') == len(LAYERS)
    assert 'href="../javascript%3Aalert%281%29/audit.html"' in html
    assert "exact_duplicate" in html and "repetition" in html


def test_rollback_rerun_uses_the_last_record(rich_run):
    from dataguard.train.report.page_data import collect

    m = collect(rich_run)
    by_step = {r["step"]: r for r in m["train"]}
    assert by_step[60]["loss"] == 2.5 and by_step[60]["skipped"] is False
    assert m["event_counts"]["rollback"] == 1 and m["status"] == "stopped"
    assert [c["complete"] for c in m["checkpoints"]] == [True, False, False, True]
    assert [c["best"] for c in m["checkpoints"]] == [True, False, False, False]


def test_payloads_are_escaped(rich_run, tmp_path):
    html = build_training_report(rich_run, tmp_path / "out" / "page.html").read_text(encoding="utf-8")
    for payload in (P_SCRIPT, P_ATTR, P_IMG, P_LAYER):
        assert payload not in html
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    assert "&quot;onerror=&quot;window.__pwned=2" in html
    assert "&lt;svg onload=window.__pwned=4&gt;.weight" in html
    assert "<script" not in html and "<img" not in html and "<svg onload" not in html
    assert not re.search(r"<[a-z][^<>]*\son[a-z]+\s*=", html)  # no tag carries an event handler
    coords = re.findall(r'\s(?:x|y|x1|x2|y1|y2|cx|cy|width|height|d|viewBox)="([^"]*)"', html)
    assert len(coords) > 1000 and not [c for c in coords if re.search(r"nan|inf", c, re.I)]  # all finite


def test_not_a_run_folder(tmp_path):
    with pytest.raises(ReportInputError):
        build_training_report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportInputError):
        build_training_report(tmp_path / "empty")


def test_minimal_folder_with_only_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [{"step": 1, "loss": float("nan"), "lr": 0.0, "grad_norm": float("inf"),
                                          "skipped": True}, {"step": 2, "loss": 3.0, "lr": 1e-3, "grad_norm": 1.0}])
    html = build_training_report(run).read_text(encoding="utf-8")
    assert 'data-status="incomplete"' in html and "run.json is missing" in html
    assert '<g class="ev ev-skip">' in html and 'class="nonfinite"' in html


@pytest.mark.browser
def test_training_report_in_chromium(real_run, rich_run, tmp_path):
    from dataguard.testing.browser import Chromium, chromium_path

    if chromium_path() is None:
        pytest.fail("chromium missing: run scripts/install_chromium.sh (make test does)", pytrace=False)
    real = build_training_report(real_run)
    rich = build_training_report(rich_run)
    with Chromium(width=1280, height=900) as b:
        load = b.load(real)
        assert load.errors == [] and load.requests == [load.url]
        assert b.evaluate("document.getElementById('status').dataset.status") == "completed"
        b.screenshot(ARTIFACTS / "training-real.png", full_page=True)

        load = b.load(rich)
        assert load.errors == [] and load.requests == [load.url]
        assert b.evaluate("[...document.querySelectorAll('section.card')].length") == 12  # + rows and dynamics
        assert b.evaluate("document.querySelectorAll('svg g.ev-rollback').length") >= 4
        assert b.evaluate("document.querySelectorAll('#events-table tr.event').length") == 6
        assert b.evaluate("[typeof window.__pwned, document.scripts.length, "
                          "document.querySelectorAll('img,iframe,object,embed,form').length]") == ["undefined", 0, 0]
        text = b.evaluate("document.body.innerText")
        assert P_SCRIPT in text and P_ATTR in text and P_IMG in text
        assert b.evaluate(
            "[...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on') "
            "|| /^\\s*javascript:/i.test(a.value))).length") == 0
        assert b.evaluate("document.getElementById('audit-link').getAttribute('href')").startswith("../javascript%3A")
        b.screenshot(ARTIFACTS / "training-rich.png", full_page=True)


def test_long_run_page_stays_small(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    names = [f"layers.{i}" for i in range(24)]
    records = []
    for step in range(1, 20001):
        rec = {"step": step, "loss": 3.0 + (40.0 if step == 12345 else 0.0), "lr": 1e-4, "grad_norm": 1.0}
        if step % 10 == 0:
            rec["layer_grad_norms"] = {n: 1.0 for n in names}
        records.append(rec)
    _write_jsonl(run / "metrics.jsonl", records)
    html = build_training_report(run).read_text(encoding="utf-8")
    assert len(html) < 1_500_000
    assert html.count("<circle") < 100  # long series are drawn as thinned paths, not one dot per step
    assert 'class="chart heatmap"' in html and "groups 9 logged steps" in html


def test_thinning_keeps_spikes_and_nonfinite_points():
    from dataguard.train.report.svg import thin

    pts = [(i, 1.0) for i in range(1, 50001)]
    pts[12344] = (12345, 43.0)
    pts[30000] = (30001, float("nan"))
    out = thin(pts)
    assert len(out) <= 2100
    assert (12345, 43.0) in out and any(s == 30001 and math.isnan(v) for s, v in out)
