"""The audit report opened in a real headless Chromium (Debian's, via the DevTools protocol).

Checks what only a browser can: the page loads with no console errors and no network
requests, sections are there, the search and expand script works, script payloads
planted in the data do not run, the CSP blocks inline script that is not ours, and the
page reads without JavaScript and in print. Screenshots go to test-artifacts/.
Chromium comes from scripts/install_chromium.sh (run by `make test`); without it these
tests fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataguard.report import build_report
from dataguard.testing.browser import Chromium, chromium_path
from dataguard.testing.runs import CLASSIFICATION_STAGES, SFT_STAGES, gsm8k_test_item

pytestmark = pytest.mark.browser
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

if chromium_path() is None:
    # `make test` installs it; a missing browser is a failure, never a silent skip.
    pytest.fail("chromium missing: run scripts/install_chromium.sh (make test does)", pytrace=False)


@pytest.fixture(scope="module")
def browser():
    with Chromium(width=1280, height=900) as b:
        yield b


@pytest.fixture(scope="module")
def reports(tmp_path_factory, sft_run_dir, classification_run_dir) -> dict[str, Path]:
    """Reports of the session's real runs (sample_data/ + payload rows; banking77)."""
    base = tmp_path_factory.mktemp("browser")
    sft = build_report(sft_run_dir, base / "sft.html")
    cls = build_report(classification_run_dir, base / "cls.html")
    return {"sft": sft, "cls": cls}


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def real_report(tmp_path_factory) -> Path:
    """A real pipeline run (normalize + dedup) over the shipped Alpaca slice."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline
    from dataguard.stages.dedup import DedupStage

    root = Path(__file__).resolve().parent.parent / "sample_data"
    out = tmp_path_factory.mktemp("real") / "out"
    Pipeline([DedupStage(action="drop")], workers=1).run(
        [InputSpec(path=root / "alpaca_en_demo.json", name="alpaca")], out)
    return build_report(out)


PWNED = ("[typeof window.__pwned, document.body.getAttribute('data-pwned'), "
         "document.querySelectorAll('img,iframe,object,embed,textarea,link,form').length, "
         "document.scripts.length, getComputedStyle(document.body).display]")


def _section_ids(browser) -> list[str]:
    return browser.evaluate("[...document.querySelectorAll('section.card')].map(s => s.id)")


def test_sft_report_loads_clean_with_every_section(browser, reports, sft_run_dir):
    reasons = sum(len(s["reasons"]) for s in _manifest(sft_run_dir)["stages"])
    load = browser.load(reports["sft"])
    assert load.errors == []
    assert load.requests == [load.url]  # the document itself and nothing else
    ids = _section_ids(browser)
    assert ids[:4] == ["overview", "inputs", "funnel", "rejects"]
    assert [i for i in ids if i.startswith("stage-")] == [f"stage-{s}" for s in SFT_STAGES]
    assert "kept" in ids and "config" in ids and "training" in ids  # the length cap, for the runner
    assert browser.evaluate("document.getElementById('verdict').dataset.verdict") == "ok"
    assert "NOTHING LOST" in browser.evaluate("document.getElementById('verdict').innerText")
    assert browser.evaluate("document.querySelectorAll('svg.chart').length") >= 6
    assert reasons >= 10
    assert browser.evaluate("document.querySelectorAll('#rejects details.reason').length") == reasons
    browser.screenshot(ARTIFACTS / "report-sft-top.png")
    browser.screenshot(ARTIFACTS / "report-sft-full.png", full_page=True)


def test_injected_payloads_show_as_text_and_do_not_run(browser, reports):
    browser.load(reports["sft"])
    browser.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    pwned, marker, foreign, scripts, display = browser.evaluate(PWNED)
    assert (pwned, marker, foreign, scripts, display) == ("undefined", None, 0, 1, "block")
    text = browser.evaluate("document.body.innerText")
    assert "<script>window.__pwned=1</script>" in text
    assert "onerror=\"window.__pwned=2" in text
    assert "</textarea></pre></details><script>window.__pwned=4</script>" in text
    assert "javascript:window.__pwned=3" in text
    # no element anywhere carries an event handler or a javascript: URL
    assert browser.evaluate(
        "[...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on') "
        "|| /^\\s*javascript:/i.test(a.value))).length") == 0
    browser.screenshot(ARTIFACTS / "report-sft-payloads-expanded.png", full_page=True, max_height=6000)


def test_search_and_expand_work(browser, reports):
    browser.load(reports["sft"])
    total = browser.evaluate("document.querySelectorAll('details.sample').length")
    assert total > 50
    assert browser.evaluate("document.getElementById('sample-toolbar').hidden") is False
    visible = ("(() => {const s=document.getElementById('sample-search'); s.value=%r; "
               "s.dispatchEvent(new Event('input')); return [...document.querySelectorAll('details.sample')]"
               ".filter(d => !d.hidden && !d.closest('details.reason').hidden).length})()")
    gsm = " ".join(gsm8k_test_item(0)["question"].lower().split()[2:6])  # "lay 16 eggs per"
    n_gsm = browser.evaluate(visible % gsm)
    assert 0 < n_gsm <= 12  # only the contamination samples quote the GSM8K item
    assert browser.evaluate("[...document.querySelectorAll('details.reason')].filter(d => !d.hidden)"
                            ".map(d => d.querySelector('.rc').textContent)") == ["contamination"]
    assert "match" in browser.evaluate("document.getElementById('sample-count').textContent")
    assert browser.evaluate(visible % "") == total
    browser.evaluate("document.getElementById('expand-all').click()")
    assert browser.evaluate("[...document.querySelectorAll('details.sample')].every(d => d.open)")
    browser.evaluate("document.getElementById('collapse-all').click()")
    assert browser.evaluate("[...document.querySelectorAll('details.reason')].every(d => !d.open)")


def test_classification_report_heat_map_and_bars(browser, reports, classification_run_dir):
    stages = {s["name"]: s for s in _manifest(classification_run_dir)["stages"]}
    matrix = next(b for b in stages["noise"]["description"]["blocks"] if b["type"] == "matrix")
    load = browser.load(reports["cls"])
    assert load.errors == [] and load.requests == [load.url]
    ids = _section_ids(browser)
    assert [i for i in ids if i.startswith("stage-")] == [f"stage-{s}" for s in CLASSIFICATION_STAGES]
    assert "training" in ids
    cells = len(matrix["row_labels"]) * len(matrix["col_labels"])
    assert cells >= 64
    assert browser.evaluate("document.querySelectorAll('#stage-noise table.heat td').length") == cells
    summary = stages["drift"]["description"]["summary"]
    assert browser.evaluate("document.querySelectorAll('#stage-drift .badge.major').length") == summary["columns_major"]
    assert browser.evaluate("document.querySelectorAll('#stage-drift .badge.stable').length") >= 1
    assert browser.evaluate("document.querySelectorAll('#stage-longtail svg.chart').length") >= 1
    browser.evaluate("document.getElementById('stage-noise').scrollIntoView({behavior: 'instant'})")
    browser.screenshot(ARTIFACTS / "report-classification-noise.png")
    browser.screenshot(ARTIFACTS / "report-classification-full.png", full_page=True)


def test_csp_blocks_inline_script_that_is_not_ours(browser, reports, tmp_path):
    # Simulate an escaping bug: raw markup smuggled into the page must still not run.
    page = reports["sft"].read_text(encoding="utf-8")
    bad = page.replace("<main>", "<main><script>window.__csp=1</script><img src=x onerror=\"window.__csp=2\">"
                       "<img src=\"https://example.com/x.png\">", 1)
    (tmp_path / "bad.html").write_text(bad, encoding="utf-8")
    load = browser.load(tmp_path / "bad.html")
    assert browser.evaluate("typeof window.__csp") == "undefined"
    assert any("Content Security Policy" in e for e in load.errors), load.errors
    # the browser announced the two image fetches, and CSP refused both before they left
    assert set(load.requests[1:]) == set(load.blocked) and set(load.blocked.values()) == {"csp"}, load


def test_reads_without_javascript_and_prints_clean(browser, reports):
    browser.send("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        browser.load(reports["sft"])
        ids = _section_ids(browser)
        assert "overview" in ids and "stage-length" in ids
        assert browser.evaluate("1 + 1") == 2  # DevTools evaluation still works; the page's script did not run
        assert browser.evaluate("document.getElementById('sample-toolbar').hidden") is True
        assert browser.evaluate("document.querySelectorAll('details.sample').length") > 0
    finally:
        browser.send("Emulation.setScriptExecutionDisabled", {"value": False})
    browser.load(reports["sft"])
    browser.send("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        assert browser.evaluate("getComputedStyle(document.querySelector('nav.toc')).display") == "none"
        browser.screenshot(ARTIFACTS / "report-sft-print.png")
    finally:
        browser.send("Emulation.setEmulatedMedia", {"media": ""})


def test_real_pipeline_report_loads_clean(browser, real_report):
    load = browser.load(real_report)
    assert load.errors == [] and load.requests == [load.url]
    ids = _section_ids(browser)
    assert [i for i in ids if i.startswith("stage-")] == ["stage-normalize", "stage-dedup"]
    assert browser.evaluate("document.getElementById('verdict').dataset.verdict") == "ok"
    assert browser.evaluate("document.querySelectorAll('#rejects details.sample').length") > 0
    browser.screenshot(ARTIFACTS / "report-real-normalize-dedup.png", full_page=True, max_height=8000)
