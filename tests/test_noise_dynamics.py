"""The noise stage's ``inputs: dynamics`` (issue #27) on a real training run's dynamics.arrow:
its flags are the documented rule (score below the learned cut, budget, rare classes kept),
rows the run never saw pass through unjudged, sft runs flag ``hard_to_fit``, and every
mistake in the config is one line naming the file, line and key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from config_errors import assert_one_line_errors

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stages.noise.dynamics import aggregate, mixture_cut, robust_cut
from dataguard.stages.noise.stage import NoiseStage
from dataguard.train.config import load_train_config
from dataguard.train.data import RunShards
from dataguard.train.dynamics.file import read_dynamics
from dataguard.train.loop import Trainer

REPO = Path(__file__).resolve().parent.parent
BANKING = REPO / "tests/data/banking77/train.csv"


def _banking_run(folder: Path, name: str, rows: slice, epochs: int) -> tuple[Path, Path]:
    """banking77 rows ``rows`` of tests/data as input ``name`` through an empty pipeline, and a
    tiny classifier trained on them with dynamics: (shards, run)."""
    lines = BANKING.read_text(encoding="utf-8").splitlines()
    (folder / name).write_text("\n".join([lines[0], *lines[1:][rows]]) + "\n", encoding="utf-8")
    data, run = folder / "shards", folder / "run"
    Pipeline([], workers=1).run([InputSpec(path=str(folder / name), format="labelled_text",
                                           aliases={"category": "label"})], data)
    Trainer(load_train_config({"task": "classify", "model": "tiny-classifier", "data": str(data), "output": str(run),
                               "epochs": epochs, "batch_size": 16, "lr": 3e-3, "save_every": 1000, "eval_every": 1000,
                               "tensorboard": False, "logit_adjustment": False, "threads": 1}), progress=False).fit()
    return data, run


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[pa.Table, str]:
    data, run = _banking_run(tmp_path_factory.mktemp("noise_dyn"), "bank.csv", slice(0, 10000, 50), epochs=3)
    return RunShards.open(data, task="classify").table, str(run)


def _flags(table: pa.Table, **params) -> tuple[NoiseStage, pa.Table]:
    stage = NoiseStage(inputs="dynamics", **params)
    stage.fit([stage.summarize(table)])
    return stage, stage.apply(table).kept


def test_flags_are_the_scores_below_the_learned_cut(trained):
    table, run = trained
    rows = aggregate(read_dynamics(run)[0])
    stage, out = _flags(table, dynamics=run)
    aum = dict(zip(rows.ids, rows.aum, strict=True))
    cut = mixture_cut(np.array([aum[i] for i in table.column("id").to_pylist() if i in aum]))
    assert stage.dynamics_log["cut_value"] == pytest.approx(cut, abs=1e-4)
    seen_ids = set(rows.ids)
    for rid, q, flag in zip(out.column("id").to_pylist(), out.column("label_quality").to_pylist(),
                            out.column("is_label_issue").to_pylist(), strict=True):
        if rid not in seen_ids:  # a held-out row: never trained on, never judged
            assert q is None and flag is None
            continue
        assert q == pytest.approx(aum[rid], abs=1e-5)
        if flag:
            assert q < cut
    assert stage.dynamics_log["rows_unseen"] == table.num_rows - len(seen_ids) > 0
    _, conf = _flags(table, dynamics=run, dynamics_score="cartography", dynamics_cut=0.5)
    quality = np.array([np.nan if q is None else q for q in conf.column("label_quality").to_pylist()])
    flags = np.array([bool(f) for f in conf.column("is_label_issue").to_pylist()])
    assert np.nanmax(quality) <= 1.0 and (quality[flags] < 0.5).all()


def test_budget_and_rare_classes_still_hold(trained):
    table, run = trained
    _, out = _flags(table, dynamics=run, dynamics_cut=100.0, max_flagged=15, min_rows_per_class=0)
    flags = np.array([bool(f) for f in out.column("is_label_issue").to_pylist()])
    assert flags.sum() == 15
    q = np.array([np.inf if v is None else v for v in out.column("label_quality").to_pylist()])
    assert q[flags].max() <= q[~flags].min()  # the 15 worst by AUM
    _, out = _flags(table, dynamics=run, dynamics_cut=100.0, min_rows_per_class=2)
    labels = out.column("label").to_pylist()
    for c in set(labels):
        rows = [i for i, lab in enumerate(labels) if lab == c]
        unflagged = sum(1 for i in rows if not out.column("is_label_issue")[i].as_py())
        assert unflagged >= min(2, len(rows))
    stage = NoiseStage(inputs="dynamics", dynamics=run, dynamics_cut=100.0, action="drop", min_rows_per_class=2)
    stage.fit([stage.summarize(table)])
    result = stage.apply(table)
    assert result.kept.num_rows + result.rejected.num_rows == table.num_rows
    assert set(result.rejected.column("reason").to_pylist()) == {"label_issue"}
    assert "training dynamics: AUM < 100.0" in result.rejected.column("detail")[0].as_py()


def test_sft_rows_whose_loss_stays_an_outlier_are_hard_to_fit(tmp_path):
    data = tmp_path / "sft"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], data)
    run = tmp_path / "run"
    Trainer(load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(run),
                               "max_steps": 30, "batch_size": 4, "lr": 3e-3, "max_length": 96, "eval_every": 15,
                               "dynamics_pass": "eval", "save_every": 1000, "tensorboard": False,
                               "threads": 1}), progress=False).fit()
    table = RunShards.open(data, task="sft").table
    stage = NoiseStage(inputs="dynamics", dynamics=str(run), action="drop")
    assert set(stage.output_columns()) == {"dynamics_loss", "hard_to_fit"}
    stage.fit([stage.summarize(table)])
    result = stage.apply(table)
    rows = aggregate(read_dynamics(run)[0])
    cut = robust_cut(rows.late_loss)
    late = dict(zip(rows.ids, rows.late_loss, strict=True))
    expected = {i for i in table.column("id").to_pylist() if late.get(i, -np.inf) > cut}
    assert set(result.rejected.column("id").to_pylist()) == expected
    assert set(result.rejected.column("reason").to_pylist()) <= {"hard_to_fit"}
    assert result.kept.num_rows + result.rejected.num_rows == table.num_rows


def test_config_mistakes_are_one_line(trained, tmp_path):
    _, run = trained
    base = f"inputs:\n  - path: {BANKING}\n    format: labelled_text\n    aliases: {{category: label}}\nstages:\n"
    cases = {
        "  - noise: {inputs: dynamics}\n": r"p\.yaml:6: stages\[0\]\.noise\.inputs: dynamics needs `dynamics: <training run folder>`",
        f"  - noise: {{inputs: dynamics, dynamics: {tmp_path}/none}}\n": r"stages\[0\]\.noise\.dynamics: .*no such",
        f"  - noise: {{dynamics: {run}, dynamics_cut: 0.5}}\n": r"noise\.dynamics_cut: applies only with inputs: dynamics",
        f"  - noise: {{inputs: dynamics, dynamics: {run}, dynamics_score: margin}}\n": r"noise\.dynamics_score",
        f"  - noise: {{inputs: dynamics, dynamics: {run}, rounds: 2}}\n": r"noise\.rounds: rounds > 1",
        f"  - noise: {{inputs: dynamics, dynamics: {tmp_path}}}\n": r"no dynamics\.arrow in this run folder",
    }
    assert_one_line_errors(tmp_path, base, cases)


@pytest.mark.parametrize("noise", ["{inputs: dynamics, dynamics: RUN}", "{features: tfidf, dynamics: RUN}"])
def test_a_run_of_other_rows_is_refused_in_one_line(trained, tmp_path, noise):
    """A run that judged none of the rows (trained on other shards: no row id matches) would
    flag nothing and read as clean data; `dataguard run` refuses it in one line instead."""
    _, run = trained
    other = tmp_path / "other.csv"  # the same rows under another input name: other ids
    lines = BANKING.read_text(encoding="utf-8").splitlines()
    other.write_text("\n".join([lines[0], *lines[1::50][:200]]) + "\n", encoding="utf-8")
    (tmp_path / "p.yaml").write_text(
        f"inputs:\n  - path: {other}\n    format: labelled_text\n    aliases: {{category: label}}\n"
        f"stages:\n  - noise: {noise.replace('RUN', run)}\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "dataguard", "run", str(tmp_path / "p.yaml"), "--output", str(out),
                           "--no-report"], capture_output=True, text=True, env=dict(os.environ, DATAGUARD_TRACEBACK=""))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "stage noise:" in lines[0] and f"training run {run} judged none of the 200 rows" in lines[0]
    assert "internal error" not in lines[0]


def test_each_run_of_a_list_must_judge_some_rows(trained, tmp_path):
    """A wrong run beside a right one would otherwise go unnoticed: each is checked alone."""
    from dataguard.stage import StageDataError

    table, run = trained
    _, other = _banking_run(tmp_path, "other.csv", slice(1, 3000, 50), epochs=1)  # other rows, other ids
    for params in ({"inputs": "dynamics"}, {"features": "tfidf"}):
        stage = NoiseStage(**params, dynamics=[run, str(other)])
        with pytest.raises(StageDataError, match=f"training run {other} judged none of the 200 rows"):
            stage.fit([stage.summarize(table)])


@pytest.mark.parametrize("params", [{"inputs": "dynamics"}, {"features": "tfidf"}])
def test_a_run_of_another_file_of_the_same_name_is_refused(trained, tmp_path, params):
    """Row ids are ``file:position``, so a run of another ``bank.csv`` matches every id.
    `dataguard run` refuses it by the inputs' sha256 (tests/test_trained_inputs.py); the stage
    itself, handed such rows directly, tells them apart by the label each entry was trained
    under, and refuses too."""
    from dataguard.stage import StageDataError

    _, run = trained
    lines = BANKING.read_text(encoding="utf-8").splitlines()
    (tmp_path / "bank.csv").write_text("\n".join([lines[0], *lines[:0:-50][:200]]) + "\n", encoding="utf-8")
    data = tmp_path / "shards"
    Pipeline([], workers=1).run([InputSpec(path=str(tmp_path / "bank.csv"), format="labelled_text",
                                           aliases={"category": "label"})], data)
    table = RunShards.open(data, task="classify").table
    stage = NoiseStage(**params, dynamics=run)
    with pytest.raises(StageDataError, match=r"trained \d+ of the \d+ rows whose ids it shares under another label"):
        stage.fit([stage.summarize(table)])


@pytest.mark.parametrize("params", [{"inputs": "dynamics"}, {"features": "tfidf"}])
def test_a_row_relabelled_since_the_run_is_not_judged_by_it(trained, params):
    """The run's margin for a row scores the label it trained under; a row whose label is
    another now (edited, or relabelled by a stage) is judged as if the run never drew it."""
    table, run = trained
    trained_on = set(aggregate(read_dynamics(run)[0]).ids)  # the run holds some rows out
    ids = table.column("id").to_pylist()
    labels = table.column("label").to_pylist()
    classes = sorted(set(labels))
    moved = [i for i, r in enumerate(ids) if r in trained_on][:3]
    for i in moved:
        labels[i] = next(c for c in classes if c != labels[i])
    edited = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels, pa.string()))
    stage = NoiseStage(**params, dynamics=run, min_rows_per_class=0)
    stage.fit([stage.summarize(edited)])
    out = stage.apply(edited).kept
    log = stage.dynamics_log
    assert log["rows_other_label"] == len(moved)
    if params.get("inputs") == "dynamics":
        assert log["rows_seen"] == len(trained_on) - len(moved)
        judged = np.asarray(out.column("label_quality").is_valid().to_pylist())
        assert not judged[moved].any() and judged.sum() == len(trained_on) - len(moved)
    else:  # the cross-validated rank alone for those rows
        assert log["rows_judged"] == len(trained_on) - len(moved)
        assert log["rows_unjudged"] == table.num_rows - log["rows_judged"]


def test_a_hand_relabelled_input_keeps_its_run_and_only_the_edited_rows_go_unjudged(trained, tmp_path):
    """The user fixes three labels in the file the run trained on and runs again with the same
    ``dynamics: RUN``: not refused as another file (the run records each row's label), the
    three rows are judged by the cross-validated view alone."""
    import csv

    table, run = trained
    source = Path(json.loads((Path(run) / "run.json").read_text())["config"]["data"]).parent / "bank.csv"
    with source.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    trained_on = set(aggregate(read_dynamics(run)[0]).ids)
    edited = [i for i in range(len(rows)) if f"bank.csv:{i}" in trained_on][:3]
    for i in edited:
        rows[i]["category"] = next(r["category"] for r in rows if r["category"] != rows[i]["category"])
    (tmp_path / "bank.csv").write_text("", encoding="utf-8")
    with (tmp_path / "bank.csv").open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["text", "category"])
        w.writeheader()
        w.writerows(rows)
    (tmp_path / "p.yaml").write_text(
        f"inputs:\n  - path: {tmp_path / 'bank.csv'}\n    format: labelled_text\n    aliases: {{category: label}}\n"
        f"stages:\n  - noise: {{features: tfidf, dynamics: {run}}}\n")
    proc = subprocess.run([sys.executable, "-m", "dataguard", "run", str(tmp_path / "p.yaml"), "--output",
                           str(tmp_path / "out"), "--no-report", "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    noise = next(s for s in manifest["stages"] if s["name"] == "noise")
    assert noise["description"]["summary"]["second_view"]["rows_other_label"] == 3
    counts = manifest["counts"]  # rows in = kept + rejected
    assert counts["balanced"] is True and counts["rows_in"] == counts["rows_kept"] + counts["rows_rejected"] == 200


def test_a_binary_run_of_other_rows_is_told_apart_from_chance():
    """With two classes a run of another file agrees on about half the labels by chance: the
    cut sits halfway between chance and full agreement, not at one half."""
    from dataguard.stage import StageDataError
    from dataguard.stages.noise.dynamics import chance_agreement, require_judged

    chance = chance_agreement(["a", "b"] * 50)
    assert chance == pytest.approx(0.5)
    scores = np.r_[np.zeros(60), np.full(40, np.nan)]
    with pytest.raises(StageDataError, match="60% agree, 50% by chance"):
        require_judged(scores, "RUN", other_label=40, chance=chance)
    require_judged(np.r_[np.zeros(97), np.full(3, np.nan)], "RUN", other_label=3, chance=chance)  # three edits
