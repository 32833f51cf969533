"""Training dynamics per row (issue #27): the runner writes ``RUN/dynamics.arrow``, a resumed
run writes the same bytes, short runs record an evaluation pass over the training rows, a
planted garbage batch names its rows (with stage scores) on the training page, and the next
data run excludes them with reason ``training_anomaly``. Real pipeline runs, real training
(the tiny models), no mocks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.report.fmt import row_anchor
from dataguard.train.config import load_train_config
from dataguard.train.dynamics.file import SCHEMA, DynamicsFileError, read_dynamics
from dataguard.train.loop import Trainer

REPO = Path(__file__).resolve().parent.parent
BANKING = REPO / "tests/data/banking77/train.csv"


@pytest.fixture(scope="module")
def intents(tmp_path_factory) -> Path:
    """120 banking77 rows (every 80th of the slice), through a pipeline with no stages."""
    tmp = tmp_path_factory.mktemp("intents")
    lines = BANKING.read_text(encoding="utf-8").splitlines()
    (tmp / "bank.csv").write_text("\n".join([lines[0], *lines[1::80][:120]]) + "\n", encoding="utf-8")
    out = tmp / "shards"
    Pipeline([], workers=1).run([InputSpec(path=str(tmp / "bank.csv"), format="labelled_text",
                                           aliases={"category": "label"})], out)
    return out


def _classify(data: Path, out: Path, **kw):
    values = {"task": "classify", "model": "tiny-classifier", "data": str(data), "output": str(out), "epochs": 3,
              "batch_size": 8, "lr": 1e-3, "eval_every": 10, "save_every": 5, "tensorboard": False,
              "logit_adjustment": False, "threads": 1}
    values.update(kw)
    return load_train_config(values)


@pytest.fixture(scope="module")
def classify_run(intents, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("dyn") / "run"
    Trainer(_classify(intents, run), progress=False).fit()
    return run


def test_one_entry_per_row_and_epoch_with_the_fixed_schema(classify_run):
    table, meta = read_dynamics(classify_run)
    assert table.schema.remove_metadata() == SCHEMA
    assert meta["task"] == "classify" and meta["source"] == "train_forward" and len(meta["labels"]) > 10
    passes = table.column("pass").to_numpy()
    ids = table.column("id").to_pylist()
    assert len(set(zip(ids, passes.tolist(), strict=True))) == table.num_rows  # one entry per (row, pass)
    every = set(ids)
    assert len(every) == 108  # the training rows (120 less the 10% held out)
    for p in (0, 1, 2):  # three whole epochs: every training row once in each
        assert {i for i, q in zip(ids, passes, strict=True) if q == p} == every
    gold = table.column("gold_prob").to_numpy()
    margin = table.column("margin").to_numpy()
    correct = np.asarray(table.column("correct").to_pylist())
    assert ((gold > 0) & (gold < 1)).all()
    assert (correct == (margin > 0)).all()  # correct iff the gold logit beats every other
    assert table.column("predicted").null_count == 0
    assert (table.column("loss").to_numpy() > 0).all()
    # each entry names the label its margin scores: the row's label in the shards
    from dataguard.train.data import RunShards

    shards = RunShards.open(json.loads((classify_run / "run.json").read_text())["config"]["data"], task="classify")
    given = dict(zip(shards.table.column("id").to_pylist(), shards.table.column("label").to_pylist(), strict=True))
    assert table.column("label").to_pylist() == [given[i] for i in ids]
    ckpt = sorted((classify_run / "checkpoints").iterdir())[-1]
    assert (ckpt / "dynamics_state.safetensors").is_file()
    assert "dynamics_state.safetensors" in json.loads((ckpt / "checksums.json").read_text())["sha256"]


def test_a_file_of_format_1_still_reads_with_no_labels(classify_run, tmp_path):
    """Runs trained before the ``label`` column existed keep working: matched by id alone."""
    import pyarrow.ipc as ipc

    table, _ = read_dynamics(classify_run)
    old = table.drop_columns(["label"]).replace_schema_metadata(
        {**{k.decode(): v.decode() for k, v in pa.ipc.open_file(str(classify_run / "dynamics.arrow"))
            .schema.metadata.items()}, "format": "dataguard.dynamics/1"})
    with ipc.new_file(str(tmp_path / "dynamics.arrow"), old.schema) as w:
        w.write_table(old)
    back, meta = read_dynamics(tmp_path)
    assert back.schema.remove_metadata() == SCHEMA and back.column("label").null_count == back.num_rows
    assert back.drop_columns(["label"]).equals(table.drop_columns(["label"]))
    assert meta["task"] == "classify"


def test_a_resumed_run_writes_the_same_file(intents, classify_run, tmp_path):
    run = tmp_path / "resumed"
    Trainer(_classify(intents, run), progress=False).fit(stop_after=7)  # checkpoint at 5: steps 6-7 redone
    Trainer(_classify(intents, run), progress=False).fit(resume=True)
    assert (run / "dynamics.arrow").read_bytes() == (classify_run / "dynamics.arrow").read_bytes()


def test_a_run_shorter_than_an_epoch_records_the_rows_drawn_unless_told_to_pass_over_all(intents, tmp_path):
    notes: list[str] = []
    auto = Trainer(_classify(intents, tmp_path / "auto", max_steps=4, eval_every=2, save_every=100), progress=False)
    auto.echo = notes.append
    auto.fit()
    table, meta = read_dynamics(tmp_path / "auto")
    assert meta["source"] == "train_forward"  # no extra pass nobody asked for
    assert len(set(table.column("id").to_pylist())) <= 4 * 8  # at most the rows drawn (batch 8)
    assert any("dynamics_pass: eval scores every row" in n and "more compute" in n for n in notes)

    run = tmp_path / "short"
    Trainer(_classify(intents, run, max_steps=4, eval_every=2, save_every=100, dynamics_pass="eval"),
            progress=False).fit()
    table, meta = read_dynamics(run)
    assert meta["source"] == "eval_pass"
    ids, passes = table.column("id").to_pylist(), table.column("pass").to_pylist()
    assert sorted(set(passes)) == [0, 1]  # evaluation points at steps 2 and 4
    assert len({i for i, p in zip(ids, passes, strict=True) if p == 0}) == len(set(ids))  # every row, each pass
    assert set(table.column("step").to_pylist()) == {2, 4}


def test_dynamics_off_writes_nothing_and_bad_keys_are_one_line(intents, tmp_path):
    run = tmp_path / "off"
    Trainer(_classify(intents, run, max_steps=2, dynamics=False), progress=False).fit()
    assert not (run / "dynamics.arrow").exists()
    with pytest.raises(DynamicsFileError, match="no dynamics.arrow"):
        read_dynamics(run)
    spec = tmp_path / "t.yaml"
    spec.write_text(f"task: classify\nmodel: tiny-classifier\ndata: {intents}\ndynamics_pass: sometimes\n")
    from dataguard.config_yaml import ConfigError

    with pytest.raises(ConfigError, match=r"t\.yaml:4: dynamics_pass: must be one of auto, train, eval"):
        load_train_config(spec)


# ---------------------------------------------------------------- the garbage batch, end to end
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dataguard", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


def test_a_garbage_batch_is_named_on_the_page_and_excluded_next_run(tmp_path):
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({
        "inputs": [{"path": str(REPO / "sample_data/alpaca_en_demo.json")}],
        "stages": [{"length": {"percentile": 90, "factor": 1.5, "action": "truncate"}}],
        "output": str(tmp_path / "data"),
        "train": {"task": "sft", "model": "tiny-causal-lm", "output": str(tmp_path / "run"), "max_steps": 40,
                  "batch_size": 4, "lr": 3e-3, "max_length": 96, "eval_every": 1000, "save_every": 10,
                  "tensorboard": False, "threads": 1, "faults": [{"step": 31, "kind": "garbage_batch"}]}}))
    done = _cli("run", str(config), "--quiet")
    assert done.returncode == 0, done.stderr
    done = _cli("train", str(config), "--quiet")
    assert done.returncode == 0, done.stderr
    events = [json.loads(x) for x in (tmp_path / "run/events.jsonl").read_text().splitlines()]
    anomaly = next(e for e in events if e["kind"] == "anomaly")
    assert anomaly["step"] == 31 and anomaly["cause"] == "loss_spike"
    rows = anomaly["rows"]
    assert len(rows) == 4 and all(r.startswith("alpaca_en_demo.json:") for r in rows)
    assert set(anomaly["row_scores"]) == set(rows)  # each row's stage scores from the shards
    assert all("n_tokens" in anomaly["row_scores"][r] for r in rows)
    page = (tmp_path / "run/training.html").read_text()
    assert 'id="named-rows"' in page
    for r in rows:
        assert f'#{row_anchor(r)}"' in page and "n_tokens" in page
    done = _cli("report", str(tmp_path / "data"), "--training", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    audit = (tmp_path / "data/audit.html").read_text()
    assert 'id="training-rows"' in audit and all(f'id="{row_anchor(r)}"' in audit for r in rows)
    assert "audit.html#" + row_anchor(rows[0]) in page  # the training page's link lands on that anchor
    table, meta = read_dynamics(tmp_path / "run")
    assert meta["task"] == "sft" and table.column("gold_prob").null_count == table.num_rows

    done = _cli("run", str(config), "--quiet", "--output", str(tmp_path / "data2"), "--exclude",
                str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "data2/manifest.json").read_text())
    assert manifest["counts"]["balanced"] is True
    before = json.loads((tmp_path / "data/manifest.json").read_text())["counts"]
    assert manifest["counts"]["rows_in"] == before["rows_in"]
    assert manifest["counts"]["rows_kept"] == before["rows_kept"] - 4
    rejected = pa.concat_tables([pa.ipc.open_stream(p.read_bytes()).read_all()
                                 for p in sorted((tmp_path / "data2/rejected").glob("*.arrow"))])
    excluded = [r for r in rejected.to_pylist() if r["reason"] == "training_anomaly"]
    assert sorted(r["id"] for r in excluded) == sorted(rows)
    assert "step 31 (loss_spike)" in excluded[0]["detail"]
    audit = (tmp_path / "data2/audit.html").read_text()
    assert f'id="{row_anchor(rows[0])}"' in audit

    # a run of other inputs: nothing matches, the run still succeeds, and the CLI says so in one line
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"inputs": [{"path": str(REPO / "sample_data/alpaca_en_demo.json"),
                                                 "name": "renamed"}], "output": str(tmp_path / "other")}))
    done = _cli("run", str(other), "--quiet", "--no-report", "--exclude", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "note: exclude: none of the 4 rows quarantined by" in done.stderr and done.stderr.count("\n") == 1
    assert "note: exclude" not in _cli("run", str(config), "--quiet", "--no-report", "--output",
                                       str(tmp_path / "data4"), "--exclude", str(tmp_path / "run")).stderr

    bad = _cli("run", str(config), "--output", str(tmp_path / "data3"), "--exclude", str(tmp_path / "nope"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such training run folder" in bad.stderr
