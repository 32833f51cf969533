"""Dynamics under two processes (a real ``torchrun``, gloo on CPU): each rank records the rows of
its slice, the sums meet on rank 0 at every checkpoint, each rank writes its rows at the end and
rank 0 merges them into one ``dynamics.arrow`` with the entries one process writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_train_distributed import _launch

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.dynamics.file import read_dynamics

REPO = Path(__file__).resolve().parent.parent


def _config(tmp: Path, data: Path, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"train": {
        "task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(tmp / name), "max_steps": 4,
        "batch_size": 4, "lr": 3e-3, "max_length": 64, "eval_every": 2, "save_every": 2, "tensorboard": False,
        "seed": 3, "device": "cpu", "threads": 1, "dynamics_pass": "train"}}))
    return path


def test_two_processes_write_one_merged_file_like_one_process(tmp_path):
    data = tmp_path / "shards"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], data)
    for name, processes in (("one", 1), ("two", 2)):
        done = _launch(_config(tmp_path, data, name), processes)
        assert done.returncode == 0, done.stderr[-3000:]
    one, meta_one = read_dynamics(tmp_path / "one")
    two, meta_two = read_dynamics(tmp_path / "two")
    assert meta_one == meta_two and meta_two["source"] == "train_forward"
    assert not list((tmp_path / "two").glob("dynamics.rank*.arrow"))  # merged, then removed
    key = ["id", "pass", "step"]
    assert two.select(key).to_pylist() == one.select(key).to_pylist()  # every row drawn, on one rank or the other
    assert one.num_rows == 16  # 4 steps x 4 rows, each row once
    assert two.column("loss").to_pylist() == pytest.approx(one.column("loss").to_pylist(), rel=1e-3)
