"""Resume state is data, verified before it is trusted; workers die with their driver;
units give the same bytes in the driver and in workers (embedding stages included)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dataguard.io import state_codec
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stage import Stage
from dataguard.stages.dedup import DedupStage, DedupSummary
from dataguard.text.histogram import IntHistogram

REPO = Path(__file__).resolve().parent.parent


def _jsonl(path: Path, n: int = 60) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"instruction": f"question {i % 45}?", "output": f"answer {i % 45}."}) + "\n")
    return path


def _output_bytes(out: Path) -> dict[str, bytes]:
    files = sorted((out / "data").glob("*.arrow")) + sorted((out / "rejected").glob("*.arrow"))
    return {p.name: p.read_bytes() for p in [*files, out / "manifest.json"]}


def test_codec_round_trips_what_stages_summarize() -> None:
    value = {
        "hist": IntHistogram.of(np.array([3, 1, 3, 9], dtype=np.int64)),
        "dedup": DedupSummary(hashes=np.array([2**64 - 1, 7], dtype=np.uint64), first_ids=["a:0", "b:1"]),
        "counter": Counter({"x": 2, "y": 1}),
        "floats": [float("nan"), float("inf"), -0.0, 1e-300],
        "probs": np.arange(6, dtype=np.float32).reshape(2, 3),
        "ids": np.array(["a", None, 3], dtype=object),
        (1, "k"): {2: (np.int64(5), np.float64(0.5), b"\x00\xff")},
        "set": {3, 1, 2},
    }
    back = state_codec.loads(state_codec.dumps(value))
    assert state_codec.dumps(back) == state_codec.dumps(value)
    assert isinstance(back["hist"], IntHistogram) and back["hist"].values.tolist() == value["hist"].values.tolist()
    assert back["dedup"].hashes.dtype == np.uint64 and back["dedup"].hashes[0] == 2**64 - 1
    assert back["probs"].dtype == np.float32 and back["probs"].shape == (2, 3)
    assert back["ids"].tolist() == ["a", None, 3]
    assert np.isnan(back["floats"][0]) and back["floats"][1] == float("inf")
    assert back[(1, "k")][2][2] == b"\x00\xff" and isinstance(back["counter"], Counter)


@pytest.mark.parametrize("crafted", [
    {"$dc": "os.system", "fields": {}},
    {"$dc": "subprocess.Popen", "fields": {}},
    {"$dc": "dataguard.pipeline.Pipeline", "fields": {}},
    {"$dc": "dataguard.stages.dedup.DedupSummary", "fields": {"hashes": 1}},
    {"$nd": "|O", "shape": [1], "b64": ""},
    {"$float": "__import__('os')"},
    {"$mystery": 1},
])
def test_crafted_state_is_refused_not_executed(crafted: dict) -> None:
    data = json.dumps({"format": state_codec.FORMAT, "value": crafted}).encode()
    with pytest.raises(state_codec.StateFormatError):
        state_codec.loads(data)


def test_codec_refuses_to_store_arbitrary_objects() -> None:
    with pytest.raises(TypeError, match="plain data"):
        state_codec.dumps({"x": object()})


def test_resume_never_unpickles_and_verifies_unit_files(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "a.jsonl")
    clean = tmp_path / "clean"
    Pipeline([DedupStage(action="drop")], workers=1, batch_rows=20).run([data], clean)

    out = tmp_path / "out"
    Pipeline([DedupStage(action="drop")], workers=1, batch_rows=20, keep_work=True).run([data], out)
    seg0 = out / "_work" / "seg00"
    sentinel = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (open, (str(sentinel), "w"))

    # A crafted completion marker (pickle bytes where JSON belongs) and a legacy .meta.pkl.
    (seg0 / "unit-000000.meta.json").write_bytes(pickle.dumps(Payload()))
    (seg0 / "unit-000001.meta.pkl").write_bytes(pickle.dumps(Payload()))
    # A unit whose data file was damaged after its marker was written.
    damaged = seg0 / "unit-000002.arrow"
    damaged.write_bytes(damaged.read_bytes()[:100])
    # A marker that points at a unit file that is gone.
    (out / "_work" / "seg01" / "unit-000001.arrow").unlink()

    Pipeline([DedupStage(action="drop")], workers=1, batch_rows=20, keep_work=True).run([data], out)

    assert not sentinel.exists()
    assert _output_bytes(out) == _output_bytes(clean)
    # The redone units have good markers again.
    meta = state_codec.loads((seg0 / "unit-000000.meta.json").read_bytes())
    assert meta["files"]["unit-000000.arrow"]["sha256"] == hashlib.sha256(
        (seg0 / "unit-000000.arrow").read_bytes()).hexdigest()


def test_runtime_keys_in_the_config_never_discard_resumable_work(tmp_path: Path) -> None:
    """`workers:` (or executor, report, output, train) written in the YAML says how a run
    executes, like `--workers`: changing it must resume the finished units, not redo them."""
    from dataguard.run.workdir import RUNTIME_KEYS, fingerprint

    base = {"inputs": ["a.jsonl"], "stages": [{"dedup": {"action": "drop"}}], "batch_rows": 20}
    runtime = {"workers": 2, "executor": "ray", "ray_address": "auto", "report": False, "output": "x",
               "train": {"task": "sft"}}
    assert set(runtime) == set(RUNTIME_KEYS)
    assert fingerprint({**base, **runtime}, [], 20, ["dedup"]) == fingerprint(base, [], 20, ["dedup"])
    assert fingerprint({**base, "batch_rows": 10}, [], 20, ["dedup"]) != fingerprint(base, [], 20, ["dedup"])

    data = _jsonl(tmp_path / "a.jsonl")
    out = tmp_path / "out"

    def run(config: dict, action: str = "drop") -> dict[Path, int]:
        Pipeline([DedupStage(action=action)], workers=1, batch_rows=20, keep_work=True, config=config).run(
            [data], out)
        return {p: p.stat().st_mtime_ns for p in sorted((out / "_work").rglob("unit-*"))}

    first = run({**base, "workers": 1})
    assert len(first) >= 6
    time.sleep(0.01)
    assert run({**base, **{k: v for k, v in runtime.items() if k != "executor"}}) == first  # all resumed
    changed = run({**base, "stages": [{"dedup": {"action": "flag"}}]}, action="flag")
    assert not set(changed.items()) & set(first.items())  # a key that shapes the output: redone


def test_workers_exit_when_the_driver_is_killed(tmp_path: Path) -> None:
    (tmp_path / "slowstage.py").write_text(textwrap.dedent("""
        import time
        from dataguard.stage import Outcome, Stage

        class Slow(Stage):
            name = "slow"
            def apply(self, batch):
                time.sleep(30)
                return Outcome(kept=batch)
    """))
    data = _jsonl(tmp_path / "a.jsonl", 40)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from slowstage import Slow
        from dataguard.pipeline import Pipeline
        if __name__ == "__main__":
            Pipeline([Slow()], workers=2, batch_rows=10).run([{str(data)!r}], {str(tmp_path / "out")!r})
    """))
    proc = subprocess.Popen([sys.executable, str(driver)], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        children: list[int] = []
        deadline = time.time() + 120
        while time.time() < deadline and len(children) < 2 and proc.poll() is None:
            time.sleep(0.2)
            children = _workers_of(proc.pid)
        assert len(children) >= 2, "the pool never started"
        time.sleep(1.0)  # let the workers finish importing and start their units
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 15
        while time.time() < deadline and any(_alive(pid) for pid in children):
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in children), "workers outlived their driver"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _workers_of(proc.pid):
            os.kill(pid, signal.SIGKILL)


def _workers_of(parent: int) -> list[int]:
    """Spawned pool workers of ``parent`` (not the resource tracker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_embedding_stage_gives_the_same_bytes_for_any_worker_count(tmp_path: Path) -> None:
    from dataguard.stages.consistency import ConsistencyStage

    records = json.loads((REPO / "sample_data" / "alpaca_en_demo.json").read_text(encoding="utf-8"))[:120]
    src = tmp_path / "alpaca.json"
    src.write_text(json.dumps(records), encoding="utf-8")
    outputs = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        Pipeline([ConsistencyStage(action="flag")], workers=workers, batch_rows=40).run(
            [InputSpec(path=src, name="alpaca")], out)
        outputs[workers] = _output_bytes(out)
    assert outputs[1] == outputs[2]


class _ThreadProbe(Stage):
    """Records how many math threads the unit ran with (torch and BLAS/OpenMP pools)."""

    name = "thread_probe"

    def score(self, batch: pa.Table) -> pa.Table:
        import torch
        from threadpoolctl import threadpool_info

        most = max([torch.get_num_threads()] + [p["num_threads"] for p in threadpool_info()])
        return batch.append_column("math_threads", pa.array([most] * batch.num_rows, pa.int64()))


def test_units_in_the_driver_use_one_math_thread_like_workers(tmp_path: Path) -> None:
    # workers=2 runs units in single-threaded worker processes; the driver (workers=1) must
    # match them, or float reductions round differently and the bytes differ (issue #10:
    # 20 of 718 consistency scores in sft.yaml differed by one float32 step).
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = Pipeline([_ThreadProbe()], workers=1, batch_rows=20).run([_jsonl(tmp_path / "a.jsonl")],
                                                                          tmp_path / "out")
        assert set(result.kept_table().column("math_threads").to_pylist()) == {1}
        assert torch.get_num_threads() == 2  # restored for the caller afterwards
    finally:
        torch.set_num_threads(before)
