"""A training run's verdicts are read by row id (``input name:position``), so a run trained on
another file of the same name would judge or exclude rows it never saw. The runner records the
names and sha256 of its inputs; `dataguard run` refuses such a run in one line, for the noise
stage's ``dynamics:`` (sft runs carry no label to tell rows apart) and for ``--exclude``, and
still checks a run from before they were recorded through its shards' manifest. Real pipeline,
a real (tiny) training run, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dataguard.io.readers import InputSpec, file_sha256
from dataguard.pipeline import Pipeline
from dataguard.train.config import load_train_config
from dataguard.train.loop import Trainer

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    """An sft run (dynamics on) trained on 60 Alpaca rows in ``a/alpaca.json``."""
    tmp = tmp_path_factory.mktemp("trained_inputs")
    rows = json.loads((REPO / "sample_data/alpaca_en_demo.json").read_text(encoding="utf-8"))[:60]
    (tmp / "a").mkdir()
    (tmp / "a/alpaca.json").write_text(json.dumps(rows), encoding="utf-8")
    data, run = tmp / "data", tmp / "run"
    Pipeline([], workers=1).run([InputSpec(path=str(tmp / "a/alpaca.json"))], data)
    Trainer(load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(run),
                               "max_steps": 6, "batch_size": 4, "max_length": 64, "eval_every": 1000,
                               "dynamics_pass": "eval", "save_every": 1000, "tensorboard": False,
                               "threads": 1}), progress=False).fit()
    return run, rows


def _run(tmp: Path, source: Path, stages: list, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp / "p.yaml").write_text(yaml.safe_dump({"inputs": [{"path": str(source)}], "stages": stages}))
    return subprocess.run([sys.executable, "-m", "dataguard", "run", str(tmp / "p.yaml"), "--output",
                           str(tmp / "out"), "--no-report", "--quiet", *extra], capture_output=True, text=True,
                          env=dict(os.environ, DATAGUARD_TRACEBACK=""))


def test_the_run_records_its_inputs(sft_run):
    run, _ = sft_run
    recorded = json.loads((run / "run.json").read_text())["inputs"]
    source = run.parent / "a/alpaca.json"
    assert recorded == [{"name": "alpaca.json", "sha256": file_sha256(source)}]


@pytest.mark.parametrize("how", ["dynamics", "exclude"])
def test_a_run_of_another_file_of_the_same_name_is_refused(sft_run, tmp_path, how):
    run, rows = sft_run
    stages = [{"noise": {"inputs": "dynamics", "dynamics": str(run)}}] if how == "dynamics" else []
    extra = ("--exclude", str(run)) if how == "exclude" else ()
    same = _run(tmp_path, run.parent / "a/alpaca.json", stages, *extra)  # the file it trained on: fine
    assert same.returncode == 0, same.stderr
    described = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file() and p.suffix == ".json"}
    counts = json.loads(described["manifest.json"])["counts"]  # rows in = kept + rejected
    assert counts["balanced"] is True and counts["rows_in"] == counts["rows_kept"] + counts["rows_rejected"] == 60

    (tmp_path / "b").mkdir()
    other = tmp_path / "b/alpaca.json"  # the same name, the rows in another order: every id matches
    other.write_text(json.dumps(rows[::-1]), encoding="utf-8")
    proc = _run(tmp_path, other, stages, *extra)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"the training run {run} trained on another version of alpaca.json" in lines[0]
    # refused before the output folder's last run description was touched
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()
            if p.is_file() and p.suffix == ".json"} == described


def test_a_run_from_before_inputs_were_recorded_is_checked_through_its_shards(sft_run, tmp_path):
    """Through the manifest of the shards it names, while its newest checkpoint says it
    trained on that manifest; a run with no checkpoint to vouch for it is not checked."""
    import shutil

    run, rows = sft_run
    old = tmp_path / "old_run"
    shutil.copytree(run, old)
    summary = json.loads((old / "run.json").read_text())
    del summary["inputs"]
    (old / "run.json").write_text(json.dumps(summary))
    (tmp_path / "b").mkdir()
    (tmp_path / "b/alpaca.json").write_text(json.dumps(rows[::-1]), encoding="utf-8")
    proc = _run(tmp_path, tmp_path / "b/alpaca.json", [], "--exclude", str(old))
    assert proc.returncode != 0 and "trained on another version of alpaca.json" in proc.stderr, proc.stderr
    shutil.rmtree(old / "checkpoints")
    unchecked = _run(tmp_path, tmp_path / "b/alpaca.json", [], "--exclude", str(old))
    assert unchecked.returncode == 0, unchecked.stderr
