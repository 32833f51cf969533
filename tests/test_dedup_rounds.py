"""dedup fitted in hash-range rounds gives the in-driver fit's bytes and resumes a killed
round at the task. Real rows from tests/data (Alpaca repeats rows; glaive repeats
conversations with other tool lists)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stages.dedup import DedupStage
from dataguard.stages.dedup_rounds import FirstRowsTask


class DriverFitDedup(DedupStage):
    """Today's path: every batch's distinct hashes and first ids to the driver."""

    def fits_in_rounds(self) -> bool:
        return False


@pytest.fixture(scope="module")
def inputs(real_data: Path) -> list[InputSpec]:
    return [InputSpec(path=real_data / "alpaca_en_demo/alpaca_en_demo.json", name="alpaca"),
            InputSpec(path=real_data / "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json", name="glaive"),
            InputSpec(path=real_data / "alpaca_en_demo/alpaca_en_demo.json", name="again")]


def output_bytes(folder: Path) -> dict[str, bytes]:
    files = [folder / "manifest.json", *sorted((folder / "data").glob("*.arrow")),
             *sorted((folder / "rejected").glob("*.arrow"))]
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


def stage(cls: type[DedupStage], per_task: int | None = None, **params: Any) -> DedupStage:
    made = cls(**params)
    if per_task is not None:
        made.rows_per_task = per_task
    return made


@pytest.fixture(scope="module")
def reference(inputs: list[InputSpec], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("dedup_rounds_ref")
    out = {}
    for name, params in {"drop": {"action": "drop"}, "prompt": {"scope": "prompt"}}.items():
        Pipeline([stage(DriverFitDedup, **params)], workers=1, batch_rows=150).run(inputs, root / name)
        out[name] = output_bytes(root / name)
    return out


@pytest.mark.parametrize(("workers", "per_task", "name"), [(1, None, "drop"), (1, 300, "prompt"), (2, 500, "drop")])
def test_rounds_give_the_driver_fits_bytes(inputs: list[InputSpec], reference: dict[str, dict[str, bytes]],
                                           tmp_path: Path, workers: int, per_task: int | None, name: str) -> None:
    params = {"drop": {"action": "drop"}, "prompt": {"scope": "prompt"}}[name]
    result = Pipeline([stage(DedupStage, per_task, **params)], workers=workers, batch_rows=150,
                      keep_work=True).run(inputs, tmp_path / "out")
    assert output_bytes(tmp_path / "out") == reference[name]
    assert result.manifest["stages"][1]["description"]["summary"]["duplicates"] > 1000  # the input twice
    ranges = len(list((tmp_path / "out/_work/fit01").glob("r1-*.done.json")))
    assert ranges == (1 if per_task is None else -(-result.rows_in // per_task))


def test_a_killed_round_resumes_at_the_task(inputs: list[InputSpec], reference: dict[str, dict[str, bytes]],
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = FirstRowsTask.run
    ran: list[int] = []

    def dying(task: FirstRowsTask) -> dict[str, Any]:
        if len(ran) == 2:
            raise KeyboardInterrupt
        ran.append(task.lo)
        return real_run(task)

    monkeypatch.setattr(FirstRowsTask, "run", dying)
    with pytest.raises(KeyboardInterrupt):
        Pipeline([stage(DedupStage, 500, action="drop")], workers=1, batch_rows=150).run(inputs, tmp_path / "out")
    again: list[int] = []
    monkeypatch.setattr(FirstRowsTask, "run", lambda task: again.append(task.lo) or real_run(task))
    result = Pipeline([stage(DedupStage, 500, action="drop")], workers=1, batch_rows=150).run(inputs,
                                                                                              tmp_path / "out")
    assert output_bytes(tmp_path / "out") == reference["drop"]
    assert set(again).isdisjoint(ran) and len(again) + len(ran) == -(-result.rows_in // 500)


def test_many_small_ranges_count_each_content_once(real_data: Path, tmp_path: Path) -> None:
    """Ranges of ~30 hashes: every distinct content is counted once and is its own first row
    exactly once (glaive repeats 35 conversations with the same tools)."""
    src = real_data / "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json"
    result = Pipeline([stage(DedupStage, 30)], workers=1, batch_rows=40, keep_work=True).run(
        [InputSpec(path=src)], tmp_path / "o")
    table = result.kept_table()
    originals = table.num_rows - sum(table.column("is_duplicate").to_pylist())
    summary = result.manifest["stages"][1]["description"]["summary"]
    assert summary["distinct_contents"] == originals and summary["duplicates"] == table.num_rows - originals == 35
    assert len(list((tmp_path / "o/_work/fit01").glob("r1-*.repeated.arrow"))) == -(-table.num_rows // 30)
