"""near_dedup fitted in distributed rounds gives the in-driver fit's bytes, resumes a killed
round at the task, and redoes what it cannot trust. Real rows from tests/data."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline, PipelineError
from dataguard.rounds import tasks as round_tasks
from dataguard.rounds.tasks import range_bounds
from dataguard.stages.dedup import DedupStage
from dataguard.stages.near_dedup import NearDedupStage
from dataguard.stages.near_dedup_rounds import PairsTask


class DriverFitNearDedup(NearDedupStage):
    """Today's path: summaries to the driver, fit there (the reference for the bytes)."""

    def fits_in_rounds(self) -> bool:
        return False


@pytest.fixture(scope="module")
def inputs(real_data: Path) -> list[InputSpec]:
    """1,890 rows: Alpaca (its own near copies), glaive tool calls (same text, other tools),
    a JSON-lines file and a small validation source."""
    return [InputSpec(path=real_data / "alpaca_en_demo/alpaca_en_demo.json", name="alpaca"),
            InputSpec(path=real_data / "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json", name="glaive"),
            InputSpec(path=real_data / "messages_kto_demo/v1_sft_demo.jsonl", name="parts"),
            InputSpec(path=real_data / "alpaca_en_demo/identity.json", name="val")]


def stages(cls: type[NearDedupStage], per_task: int | None = None, **params: Any) -> list[Any]:
    near = cls(validation_sources=["val"], **params)
    if per_task is not None:
        near.partition_entries = per_task
    return [DedupStage(action="drop"), near]


def output_bytes(folder: Path) -> dict[str, bytes]:
    files = [folder / "manifest.json", *sorted((folder / "data").glob("*.arrow")),
             *sorted((folder / "rejected").glob("*.arrow"))]
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


@pytest.fixture(scope="module")
def reference(inputs: list[InputSpec], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """The in-driver fit's outputs, two configurations."""
    root = tmp_path_factory.mktemp("near_rounds_ref")
    out = {}
    for name, params in {"first": {"threshold": 0.5}, "longest": {"keep": "longest", "threshold": 0.4,
                                                                   "verify": False, "action": "flag"}}.items():
        Pipeline(stages(DriverFitNearDedup, **params), workers=1, batch_rows=97).run(inputs, root / name)
        out[name] = output_bytes(root / name)
    return out


@pytest.mark.parametrize(("workers", "per_task"), [(1, None), (1, 2_000), (2, 7_000)])
def test_rounds_give_the_driver_fits_bytes(inputs: list[InputSpec], reference: dict[str, dict[str, bytes]],
                                           tmp_path: Path, workers: int, per_task: int | None) -> None:
    """One bucket range or many, one process or two: the same manifest and shards."""
    result = Pipeline(stages(NearDedupStage, per_task, threshold=0.5), workers=workers, batch_rows=97,
                      keep_work=True).run(inputs, tmp_path / "out")
    assert output_bytes(tmp_path / "out") == reference["first"]
    summary = result.manifest["stages"][-1]["description"]["summary"]
    assert summary["near_duplicates"] > 100 and summary["candidate_pairs"] > summary["accepted_pairs"]
    ranges = sorted((tmp_path / "out/_work/fit02").glob("r1-*.done.json"))
    entries = (summary["rows"] - summary["rows_without_text"]) * summary["bands"]
    assert len(ranges) == (1 if per_task is None else len(range_bounds(entries, per_task)) - 1)
    assert per_task is None or len(ranges) > 3


def test_estimated_similarity_and_longest_keep(inputs: list[InputSpec], reference: dict[str, dict[str, bytes]],
                                                tmp_path: Path) -> None:
    Pipeline(stages(NearDedupStage, 3_000, keep="longest", threshold=0.4, verify=False, action="flag"),
             workers=1, batch_rows=97).run(inputs, tmp_path / "out")
    assert output_bytes(tmp_path / "out") == reference["longest"]
    assert not (tmp_path / "out/_work").exists()  # the round files go with the work folder


def test_a_killed_round_resumes_at_the_task(inputs: list[InputSpec], reference: dict[str, dict[str, bytes]],
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 1 dies at its fourth range: the three finished ranges are not run again, a
    tampered pair file is, and the output is the fresh run's."""
    ran: list[int] = []
    real_run = PairsTask.run

    def dying(task: PairsTask) -> dict[str, Any]:
        if len(ran) == 3:
            raise MemoryError("killed")
        ran.append(task.lo)
        return real_run(task)

    monkeypatch.setattr(PairsTask, "run", dying)
    with pytest.raises(MemoryError):
        Pipeline(stages(NearDedupStage, 2_000, threshold=0.5), workers=1, batch_rows=97).run(inputs, tmp_path / "out")
    fit = tmp_path / "out/_work/fit02"
    assert len(list(fit.glob("r1-*.done.json"))) == 3 and not list(fit.glob("r2-*"))
    (fit / "r1-00001.pairs.arrow").write_bytes(b"not arrow")  # a damaged file: that task runs again

    again: list[int] = []

    def counting(task: PairsTask) -> dict[str, Any]:
        again.append(task.lo)
        return real_run(task)

    monkeypatch.setattr(PairsTask, "run", counting)
    Pipeline(stages(NearDedupStage, 2_000, threshold=0.5), workers=1, batch_rows=97, keep_work=True).run(
        inputs, tmp_path / "out")
    assert output_bytes(tmp_path / "out") == reference["first"]
    tasks = len(list(fit.glob("r1-*.done.json")))
    assert tasks > 5 and len(again) == tasks - 2
    assert ran[1] in again and ran[0] not in again and ran[2] not in again


def test_lost_unit_fit_files_redo_the_unit(inputs: list[InputSpec], reference: dict[str, dict[str, bytes]],
                                           tmp_path: Path) -> None:
    """A unit whose fit file is gone is redone (its meta names the file with its sha256)."""
    out = tmp_path / "out"
    Pipeline(stages(NearDedupStage, threshold=0.5), workers=1, batch_rows=97, keep_work=True).run(inputs, out)
    lost = out / "_work/seg01/unit-000003.s02.rows.arrow"
    stamp = (out / "_work/seg01/unit-000004.meta.json").stat().st_mtime_ns
    lost.unlink()
    Pipeline(stages(NearDedupStage, threshold=0.5), workers=1, batch_rows=97, keep_work=True).run(inputs, out)
    assert lost.is_file() and (out / "_work/seg01/unit-000004.meta.json").stat().st_mtime_ns == stamp
    assert output_bytes(out) == reference["first"]


def test_a_link_planted_in_the_round_folder_is_refused(inputs: list[InputSpec], tmp_path: Path) -> None:
    """A symlink where a round writes is never followed: the run stops, the target is untouched."""
    out, target = tmp_path / "out", tmp_path / "precious.txt"
    target.write_text("mine")
    Pipeline(stages(NearDedupStage, threshold=0.5), workers=1, batch_rows=97, keep_work=True).run(inputs, out)
    for marker in (out / "_work/fit02").glob("r*.done.json"):
        marker.unlink()
    pairs = out / "_work/fit02/r1-00000.pairs.arrow"
    pairs.unlink()
    os.symlink(target, pairs)
    with pytest.raises((PipelineError, OSError)):
        Pipeline(stages(NearDedupStage, threshold=0.5), workers=1, batch_rows=97, keep_work=True).run(inputs, out)
    assert target.read_text() == "mine"


@dataclass(frozen=True)
class Wrote:
    """The smallest round task: a marker and one range."""

    marker: Path
    lo: int


def test_markers_check_their_files(tmp_path: Path) -> None:
    """A marker is trusted only for the task that wrote it, with every file it names unchanged."""
    written: list[Path] = []
    round_tasks.write_arrow(tmp_path / "r1-00000.pairs.arrow", pa.table({"a": [1, 2]}), written)
    task = Wrote(round_tasks.task_marker(tmp_path, 1, 0), 0)
    assert round_tasks.finish_task(task, {"checked": 2}, written)["checked"] == 2
    assert round_tasks.load_done(task)["checked"] == 2
    assert round_tasks.load_done(Wrote(task.marker, 5)) is None  # planned with another range
    (tmp_path / "r1-00000.pairs.arrow").write_bytes(b"x" * 10)
    assert round_tasks.load_done(task) is None
    task.marker.write_text("{")
    assert round_tasks.load_done(task) is None


KILLED_RUN = """
import sys
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stages.dedup import DedupStage
from dataguard.stages.near_dedup import NearDedupStage

if __name__ == "__main__":
    near = NearDedupStage(validation_sources=["val"], threshold=0.5)
    near.partition_entries = 150
    inputs = [InputSpec(path=p, name=n) for p, n in zip(sys.argv[2::2], sys.argv[3::2])]
    Pipeline([DedupStage(action="drop"), near], workers=2, batch_rows=97).run(inputs, sys.argv[1])
"""


def test_a_run_killed_during_round_one_resumes(inputs: list[InputSpec], reference: dict[str, dict[str, bytes]],
                                               tmp_path: Path) -> None:
    """SIGKILL to the driver (its pool workers die with it) while round 1 runs on 2 workers;
    the next run keeps the finished tasks' markers and writes the fresh run's bytes."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    script = tmp_path / "run.py"
    script.write_text(KILLED_RUN, encoding="utf-8")
    args = [str(a) for spec in inputs for a in (spec.path, spec.name)]
    proc = subprocess.Popen([sys.executable, str(script), str(out), *args], start_new_session=True)
    fit = out / "_work/fit02"
    deadline = time.time() + 120
    while len(list(fit.glob("r1-*.done.json"))) < 20 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p.name: p.stat().st_mtime_ns for p in fit.glob("r1-*.done.json")}
    assert len(finished) >= 20 and not (fit / "r2-00000.done.json").exists()
    near = NearDedupStage(validation_sources=["val"], threshold=0.5)
    near.partition_entries = 150
    Pipeline([DedupStage(action="drop"), near], workers=1, batch_rows=97, keep_work=True).run(inputs, out)
    assert output_bytes(out) == reference["first"]
    assert all((fit / name).stat().st_mtime_ns == stamp for name, stamp in finished.items())
    assert len(list(fit.glob("r1-*.done.json"))) > len(finished)
