"""Guard snapshots held on disk (a full fine-tune on a CPU) behave exactly like snapshots in
memory: the same rollback, bit for bit, files that come and go with their snapshots, and
nothing of the user's touched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataguard.config_yaml import ConfigError
from dataguard.train.checkpoint import latest_checkpoint, read_weights
from dataguard.train.config import load_train_config
from dataguard.train.loop import Trainer
from dataguard.train.stability.guard import Guard
from dataguard.train.stability.snapshot_store import SPILL_BYTES, SpillFolder, choose_place, live_trainable
from dataguard.train.state import Trainables

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data(alpaca_shards) -> Path:
    return alpaca_shards


def _cfg(data: Path, out: Path, place: str):
    return load_train_config({
        "task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(out), "max_steps": 36,
        "batch_size": 4, "lr": 3e-3, "warmup_ratio": 0.1, "max_length": 96, "eval_every": 10, "save_every": 10,
        "tensorboard": False, "threads": 1, "device": "cpu",
        "guard": {"snapshot_in": place, "snapshot_every": 5, "verify_steps": 3},
        "faults": [{"step": 27, "kind": "lr_spike", "factor": 1000}]})


def test_a_rollback_from_disk_matches_a_rollback_from_memory_bit_for_bit(data, tmp_path):
    seen: list[list[str]] = []

    def watch(step: int) -> None:
        folder = tmp_path / "disk" / "_guard"
        seen.append(sorted(p.name for p in folder.iterdir()) if folder.is_dir() else [])

    results = {}
    for place in ("memory", "disk"):
        trainer = Trainer(_cfg(data, tmp_path / place, place), progress=False)
        if place == "disk":
            trainer.on_step = watch
        results[place] = trainer.fit()
    events = {p: [e for e in r.events if e["kind"] == "rollback"] for p, r in results.items()}
    assert len(events["disk"]) == 1 and events["disk"][0]["detail"] == events["memory"][0]["detail"]
    assert [h["loss"] for h in results["disk"].history] == [h["loss"] for h in results["memory"].history]
    a, b = (read_weights(latest_checkpoint(tmp_path / p)) for p in ("memory", "disk"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the files held at most the verified target and two pending snapshots, and are gone now
    assert seen and max(len(names) for names in seen) <= 3 and any(seen)
    assert all(n.startswith("snapshot-0-") and n.endswith(".pt") for names in seen for n in names)
    del results, trainer
    import gc

    gc.collect()
    assert not (tmp_path / "disk" / "_guard").exists()
    assert not (tmp_path / "memory" / "_guard").exists()
    assert latest_checkpoint(tmp_path / "disk").name == "step-000036"


def test_clearing_leaves_a_file_that_is_not_ours(tmp_path):
    store = SpillFolder(tmp_path)
    model = torch.nn.Linear(4, 3)
    live = live_trainable(model)
    mapped = store.write(7, live)
    assert torch.equal(mapped["weight"], model.weight.detach())
    (store.folder / "notes.txt").write_text("mine")
    store.clear()
    assert not store.path(7).exists() and (store.folder / "notes.txt").read_text() == "mine"


def test_a_large_cpu_state_goes_to_disk_and_a_small_one_or_a_gpu_stays_in_memory():
    small = {"w": torch.zeros(10)}
    large = {"w": torch.empty(SPILL_BYTES // 4 + 1)}
    assert choose_place("auto", small) == "memory" and choose_place("auto", large) == "disk"
    assert choose_place("memory", large) == "memory" and choose_place("disk", small) == "disk"


def test_a_refused_state_writes_no_file(tmp_path):
    knobs = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "x",
                               "guard": {"snapshot_in": "disk"}}).guard
    guard = Guard(knobs, 1.0, spill=SpillFolder(tmp_path))
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters())
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    assert guard.snapshots.take(3, Trainables(model, opt, None)) is False
    assert not SpillFolder(tmp_path).path(3).exists()


def test_snapshot_in_is_validated(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text("task: sft\nmodel: tiny-causal-lm\ndata: d\noutput: o\nguard:\n  snapshot_in: gpu\n")
    with pytest.raises(ConfigError) as err:
        load_train_config(spec)
    assert "t.yaml:6" in str(err.value) and "guard.snapshot_in" in str(err.value)
