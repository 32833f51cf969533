"""`dataguard loop CONFIG --rounds N` (issue #27): round 2 re-runs the pipeline with round 1's
training fed back (exclude + noise from dynamics) and trains again; starting it again finishes
the same rounds without retraining a finished one. Real pipeline, real tiny LM, the CLI."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from banking_slice import banking_rows

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dataguard", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_two_rounds_feed_the_first_run_back_and_resume(tmp_path):
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({
        "inputs": [{"path": str(REPO / "sample_data/alpaca_en_demo.json")}],
        "stages": [{"length": {"percentile": 90, "factor": 1.5, "action": "truncate"}}],
        "output": str(tmp_path / "unused"),
        "train": {"task": "sft", "model": "tiny-causal-lm", "max_steps": 40, "batch_size": 4, "lr": 3e-3,
                  "max_length": 96, "eval_every": 20, "save_every": 20, "tensorboard": False, "threads": 1,
                  "faults": [{"step": 31, "kind": "garbage_batch"}]}}))
    loop = tmp_path / "loop"
    done = _cli("loop", str(config), "--rounds", "2", "--output", str(loop), "--quiet")
    assert done.returncode == 0, done.stderr
    m1 = json.loads((loop / "round1/data/manifest.json").read_text())
    m2 = json.loads((loop / "round2/data/manifest.json").read_text())
    assert m2["counts"]["balanced"] is True and m2["counts"]["rows_in"] == m1["counts"]["rows_in"]
    names = [s["name"] for s in m2["stages"] if s["name"] != "normalize"]
    assert names[:2] == ["exclude", "noise"]
    by_stage = {s["name"]: s for s in m2["stages"]}
    assert by_stage["exclude"]["rows_rejected"] >= 4  # the garbage batch's rows, named by round 1's guard
    assert m2["counts"]["rows_kept"] < m1["counts"]["rows_kept"] - 4 + 1  # and hard_to_fit rows, if any
    for r in (1, 2):
        assert (loop / f"round{r}/run/dynamics.arrow").is_file()
    first = (loop / "round2/run/dynamics.arrow").read_bytes()

    again = _cli("loop", str(config), "--rounds", "2", "--output", str(loop), "--quiet")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("training already finished") == 2
    assert (loop / "round2/run/dynamics.arrow").read_bytes() == first
    assert json.loads((loop / "round2/data/manifest.json").read_text()) == m2

    # a damaged last checkpoint is never "finished": the round resumes from the verified one,
    # writes an intact last checkpoint again and the same dynamics (exact resume)
    from dataguard.train.checkpoint import checkpoint_damage, latest_checkpoint

    last = latest_checkpoint(loop / "round2/run")
    weights = next(p for p in sorted(last.iterdir()) if p.suffix == ".safetensors" and "dynamics" not in p.name)
    damaged = bytearray(weights.read_bytes())
    damaged[-64] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    assert checkpoint_damage(last) is not None
    repaired = _cli("loop", str(config), "--rounds", "2", "--output", str(loop), "--quiet")
    assert repaired.returncode == 0, repaired.stderr
    assert repaired.stdout.count("training already finished") == 1  # round 1 only
    assert checkpoint_damage(latest_checkpoint(loop / "round2/run")) is None
    assert (loop / "round2/run/dynamics.arrow").read_bytes() == first

    # killed after round 1's last checkpoint, before its dynamics were written: round 1 is
    # resumed (which writes them), not "finished" and then refused by round 2
    dynamics1 = (loop / "round1/run/dynamics.arrow").read_bytes()
    (loop / "round1/run/dynamics.arrow").unlink()
    rewritten = _cli("loop", str(config), "--rounds", "2", "--output", str(loop), "--quiet")
    assert rewritten.returncode == 0, rewritten.stderr
    assert (loop / "round1/run/dynamics.arrow").read_bytes() == dynamics1
    assert json.loads((loop / "round2/data/manifest.json").read_text()) == m2

    # the training settings changed since: the finished rounds no longer follow from the config
    edited = yaml.safe_load(config.read_text())
    edited["train"]["lr"] = 1e-4
    config.write_text(yaml.safe_dump(edited))
    other = _cli("loop", str(config), "--rounds", "2", "--output", str(loop), "--quiet")
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert "round 1:" in other.stderr and "trained with other settings (lr 0.003 -> 0.0001)" in other.stderr
    edited["train"]["lr"] = 3e-3
    edited["train"]["weight_decay"] = 0.5  # one a resume may change midway, but not a finished model's
    config.write_text(yaml.safe_dump(edited))
    other = _cli("loop", str(config), "--rounds", "2", "--output", str(loop), "--quiet")
    assert other.returncode == 2 and "trained with other settings (weight_decay " in other.stderr, other.stderr
    del edited["train"]["weight_decay"]
    edited["train"]["log_every"] = 7  # how the run is logged is not the model: still finished
    config.write_text(yaml.safe_dump(edited))
    logged = _cli("loop", str(config), "--rounds", "2", "--output", str(loop), "--quiet")
    assert logged.returncode == 0 and logged.stdout.count("training already finished") == 2, logged.stderr
    del edited["train"]["log_every"]
    config.write_text(yaml.safe_dump(edited))

    # the config changed since: round 1's data is rebuilt, and its finished run no longer
    # follows from it, so the loop refuses in one line instead of keeping the old models
    changed = yaml.safe_load(config.read_text())
    changed["stages"][0]["length"]["factor"] = 1.2
    config.write_text(yaml.safe_dump(changed))
    stale = _cli("loop", str(config), "--rounds", "2", "--output", str(loop), "--quiet")
    assert stale.returncode == 2 and "Traceback" not in stale.stderr
    assert len(stale.stderr.strip().splitlines()) == 1 and "round 1: its data changed since" in stale.stderr


def test_a_classify_round_feeds_the_run_into_the_noise_stage_as_its_second_view(tmp_path):
    """With a cross-validated noise stage that drops, round 1 only flags (so its run trains on
    and judges every row), and round 2 gives that stage round 1's run as a second view instead
    of stacking a dynamics-only stage in front."""
    rows = banking_rows(("card_arrival", "exchange_rate", "lost_or_stolen_card", "top_up_failed"), 30)
    rng = np.random.default_rng(5)
    for i in rng.choice(len(rows), size=12, replace=False).tolist():  # some flipped labels to find
        rows[i] = {**rows[i], "category": "exchange_rate" if rows[i]["category"] != "exchange_rate" else "pin_blocked"}
    with (tmp_path / "bank.csv").open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["text", "category"])
        w.writeheader()
        w.writerows(rows)
    config = tmp_path / "p.yaml"
    noise = {"features": "tfidf", "action": "drop", "min_rows_per_class": 0}
    config.write_text(yaml.safe_dump({
        "inputs": [{"path": str(tmp_path / "bank.csv"), "format": "labelled_text", "aliases": {"category": "label"}}],
        "stages": [{"noise": noise}],
        "train": {"task": "classify", "model": "tiny-classifier", "epochs": 4, "batch_size": 16, "lr": 3e-3,
                  "eval_fraction": 0.0, "save_every": 1000, "tensorboard": False, "threads": 1}}))
    loop = tmp_path / "loop"
    done = _cli("loop", str(config), "--rounds", "2", "--output", str(loop), "--quiet")
    assert done.returncode == 0, done.stderr
    run1 = str((loop / "round1/run").resolve())
    assert "loop: the noise stage flags (does not drop) this round" in done.stdout
    assert f"loop: {run1}'s dynamics are the second view of the noise stage already there" in done.stdout
    m1 = json.loads((loop / "round1/data/manifest.json").read_text())
    m2 = json.loads((loop / "round2/data/manifest.json").read_text())
    assert m1["config"]["stages"] == [{"noise": {**noise, "action": "flag"}}]
    assert m2["config"]["stages"] == [{"exclude": {"runs": [run1]}}, {"noise": {**noise, "dynamics": run1}}]
    assert [s["name"] for s in m2["stages"] if s["name"] != "normalize"] == ["exclude", "noise"]
    first = next(s for s in m1["stages"] if s["name"] == "noise")
    second = next(s for s in m2["stages"] if s["name"] == "noise")
    assert m1["counts"]["rows_kept"] == 120 and first["description"]["summary"]["label_issues"] > 0
    # round 1 trained on every row (it only flagged; no eval split): its run judges them all
    assert second["description"]["summary"]["second_view"]["rows_judged"] == 120
    assert second["rows_rejected"] > 0 and m2["counts"]["balanced"] is True and m2["counts"]["rows_in"] == 120
    _feed_back_edge_cases(Path(run1))


def _feed_back_edge_cases(run: Path) -> None:
    """Which noise stages take the run as their second view, which get a dynamics stage, and
    what a round before the last flags (a middle round of three both takes the view and flags)."""
    from dataguard.loop_rounds import Stages, loop_round
    from dataguard.stages.noise.stage import NoiseStage

    def fed(*entries: dict, prev: Path | None = run, before_last: bool = False) -> list:
        stages = [NoiseStage(**next(iter(e.values()))) for e in entries]
        out, _ = loop_round(Stages(stages, list(entries)), prev, before_last=before_last)
        assert [s.params() for s in out.stages] == [next(iter(e.values())) for e in out.raw]  # in step
        return out.raw

    run_s = str(run.resolve())
    exclude = {"exclude": {"runs": [run_s]}}
    stacked = {"noise": {"inputs": "dynamics", "dynamics": run_s, "action": "drop"}}
    drop = {"noise": {"features": "tfidf", "action": "drop"}}
    assert fed(drop) == [exclude, {"noise": {"features": "tfidf", "action": "drop", "dynamics": run_s}}]
    assert fed(drop, before_last=True) == [  # round 2 of 3: the view, and flags for round 3
        exclude, {"noise": {"features": "tfidf", "action": "flag", "dynamics": run_s}}]
    assert fed(drop, prev=None, before_last=True) == [{"noise": {"features": "tfidf", "action": "flag"}}]
    assert fed(drop, prev=None) == [drop]  # --rounds 1: the config as it is
    # an explicit `dynamics: null` is still a stage without a run
    assert fed({"noise": {"dynamics": None, "action": "relabel"}}) == [
        exclude, {"noise": {"dynamics": run_s, "action": "relabel"}}]
    # a flag-only stage (the default) would leave the loop cleaning nothing: a dynamics stage goes first
    assert fed({"noise": {}}) == [exclude, stacked, {"noise": {}}]
    assert fed({"noise": {}}, before_last=True) == [exclude, stacked, {"noise": {}}]
    assert fed({"noise": {"rounds": 2, "action": "drop"}}) == [exclude, stacked, {"noise": {"rounds": 2, "action": "drop"}}]
    assert fed({"noise": {"label_column": "intent", "action": "drop"}})[1] == stacked
    with pytest.raises(ValueError, match="1 stages but 0 config entries"):
        loop_round(Stages([NoiseStage()], []), run, before_last=False)


def test_an_early_stopped_round_is_finished(tmp_path):
    """A round whose run stopped early (no eval improvement) is not trained again on a rerun."""
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({
        "inputs": [{"path": str(REPO / "sample_data/alpaca_en_demo.json")}], "stages": [],
        "train": {"task": "sft", "model": "tiny-causal-lm", "max_steps": 60, "batch_size": 4, "lr": 0.5,
                  "max_length": 64, "eval_every": 2, "save_every": 2, "early_stopping_patience": 1,
                  "tensorboard": False, "threads": 1, "guard": None}}))
    loop = tmp_path / "loop"
    first = _cli("loop", str(config), "--rounds", "1", "--output", str(loop), "--quiet")
    assert first.returncode == 0, first.stderr
    assert "early stopping at step" in first.stdout + first.stderr
    again = _cli("loop", str(config), "--rounds", "1", "--output", str(loop), "--quiet")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("training already finished") == 1
    # killed before its dynamics were written: the resume writes them and trains no further
    from dataguard.train.checkpoint import complete_checkpoints

    checkpoints = [p.name for p in complete_checkpoints(loop / "round1/run")]
    dynamics = (loop / "round1/run/dynamics.arrow").read_bytes()
    (loop / "round1/run/dynamics.arrow").unlink()
    resumed = _cli("loop", str(config), "--rounds", "1", "--output", str(loop), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert [p.name for p in complete_checkpoints(loop / "round1/run")] == checkpoints
    assert (loop / "round1/run/dynamics.arrow").read_bytes() == dynamics


@pytest.mark.parametrize(("train", "message"), [
    (None, r"config error: .*p\.yaml.*train"),
    ({"task": "sft", "model": "tiny-causal-lm", "max_step": 4}, r"config error: .*p\.yaml:\d+: train\.max_step"),
    ({"task": "sft", "model": "tiny-causal-lm", "max_steps": 4, "dynamics": False},
     r"train\.dynamics is false, but each round feeds"),
])
def test_a_loop_config_the_training_would_refuse_is_refused_before_any_round(tmp_path, train, message):
    import re

    doc = {"inputs": [{"path": str(REPO / "sample_data/alpaca_en_demo.json")}], "stages": []}
    if train is not None:
        doc["train"] = train
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    proc = _cli("loop", str(tmp_path / "p.yaml"), "--rounds", "2", "--output", str(tmp_path / "loop"), "--quiet")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and re.search(message, proc.stderr), proc.stderr
    assert not (tmp_path / "loop").exists()  # no round's work was done


def test_a_link_planted_for_a_round_folder_is_not_written_through(tmp_path):
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"inputs": [{"path": str(REPO / "sample_data/alpaca_en_demo.json")}],
                                      "stages": [], "train": {"task": "sft", "model": "tiny-causal-lm",
                                                              "max_steps": 2}}))
    loop, elsewhere = tmp_path / "loop", tmp_path / "elsewhere"
    loop.mkdir()
    elsewhere.mkdir()
    (loop / "round1").symlink_to(elsewhere)
    proc = _cli("loop", str(config), "--rounds", "1", "--output", str(loop), "--quiet")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "round1 is a link" in proc.stderr
    assert list(elsewhere.iterdir()) == []
