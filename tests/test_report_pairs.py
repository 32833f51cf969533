"""The audit of a preference run: the sample DPO pipeline (160 real pairs) shows the length
and quality balance of chosen vs rejected responses; other runs have no such section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataguard.config import load_config
from dataguard.report import build_report

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dpo") / "out"
    loaded = load_config(REPO / "pipelines" / "train_dpo.yaml")
    loaded.pipeline().run(loaded.inputs, out)
    build_report(out)
    return out


def test_the_pairs_section_shows_length_and_quality_balance(dpo_run: Path) -> None:
    manifest = json.loads((dpo_run / "manifest.json").read_text())
    stages = {s["name"]: s for s in manifest["stages"]}
    length = stages["normalize"]["description"]["pairs"]["summary"]
    assert length["pairs"] == 160
    assert length["chosen_longer"] == 67 and length["median_length_ratio"] == 0.822
    quality = stages["quality"]["description"]["pairs"]["summary"]
    assert quality["rejected_chosen_fails_quality"] == stages["quality"]["reasons"]["chosen_fails_quality"] == 3  # with sft.yaml's relaxed Gopher limits
    assert manifest["counts"]["rows_in"] == manifest["counts"]["rows_kept"] + manifest["counts"]["rows_rejected"]
    html = (dpo_run / "audit.html").read_text()
    assert 'id="pairs"' in html and "Preference pairs: chosen vs rejected" in html
    assert "Length ratio chosen / rejected" in html and "Which response scores higher" in html
    assert "http://" not in html.replace("http://www.w3.org", "")  # still self-contained


def test_a_run_without_pairs_has_no_pairs_section(sft_run_dir) -> None:
    html = build_report(sft_run_dir, html_path=sft_run_dir.parent / "sft_audit.html",
                        json_path=sft_run_dir.parent / "sft_audit.json").read_text()
    assert 'id="pairs"' not in html
