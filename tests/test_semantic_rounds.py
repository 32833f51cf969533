"""semantic_dedup fitted in rounds (embeddings on disk, k-means on a sample, top-k per
partition in its own task) gives the in-driver fit's bytes and resumes a killed round.
Real Alpaca rows (300, with their own repeats) and MiniLM, as tests/test_semantic_dedup.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stages.semantic_dedup import SemanticDedupStage
from dataguard.stages.semantic_dedup_rounds import AssignTask


class DriverFitSemantic(SemanticDedupStage):
    """Today's path: every embedding to the driver, the search there."""

    def fits_in_rounds(self) -> bool:
        return False


@pytest.fixture(scope="module")
def inputs(real_data: Path, tmp_path_factory: pytest.TempPathFactory) -> list[InputSpec]:
    rows = json.loads((real_data / "alpaca_en_demo/alpaca_en_demo.json").read_text(encoding="utf-8"))[:300]
    root = tmp_path_factory.mktemp("semantic_rounds")
    (root / "train.json").write_text(json.dumps(rows), encoding="utf-8")
    return [InputSpec(path=root / "train.json", name="train"),
            InputSpec(path=real_data / "alpaca_en_demo/identity.json", name="val")]


CONFIGS: dict[str, dict[str, Any]] = {
    "exact": {"action": "drop", "threshold": 0.6},
    "kmeans": {"exact_max_rows": 50, "partitions": 6, "keep": "longest", "validation_sources": ["val"],
               "threshold": 0.6},
}


def stage(cls: type[SemanticDedupStage], name: str, per_task: int | None = None) -> SemanticDedupStage:
    made = cls(threads=1, **CONFIGS[name])
    if per_task is not None:
        made.rows_per_task = per_task
    return made


def output_bytes(folder: Path) -> dict[str, bytes]:
    files = [folder / "manifest.json", *sorted((folder / "data").glob("*.arrow")),
             *sorted((folder / "rejected").glob("*.arrow"))]
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


@pytest.fixture(scope="module")
def reference(inputs: list[InputSpec], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("semantic_rounds_ref")
    for name in CONFIGS:
        Pipeline([stage(DriverFitSemantic, name)], workers=1, batch_rows=60).run(inputs, root / name)
    return {name: output_bytes(root / name) for name in CONFIGS}


@pytest.mark.parametrize(("name", "workers", "per_task"), [("exact", 1, None), ("kmeans", 1, 60),
                                                          ("kmeans", 2, None)])
def test_rounds_give_the_driver_fits_bytes(inputs: list[InputSpec], reference: dict[str, dict[str, bytes]],
                                           tmp_path: Path, name: str, workers: int, per_task: int | None) -> None:
    result = Pipeline([stage(SemanticDedupStage, name, per_task)], workers=workers, batch_rows=60,
                      keep_work=True).run(inputs, tmp_path / "out")
    assert output_bytes(tmp_path / "out") == reference[name]
    summary = result.manifest["stages"][1]["description"]["summary"]
    assert summary["semantic_duplicates"] > 10
    pair_tasks = len(list((tmp_path / "out/_work/fit01").glob("r3-*.done.json")))
    assert pair_tasks == (1 if per_task is None else 6)  # ~60 rows a task: one task per partition
    assert summary["method"] == ("exact" if name == "exact" else "k-means partitions")


def test_a_killed_assign_round_resumes_at_the_task(inputs: list[InputSpec], reference: dict[str, dict[str, bytes]],
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = AssignTask.run
    ran: list[str] = []

    def dying(task: AssignTask) -> dict[str, Any]:
        if len(ran) == 3:
            raise MemoryError("killed")
        ran.append(task.out.name)
        return real_run(task)

    monkeypatch.setattr(AssignTask, "run", dying)
    with pytest.raises(MemoryError):
        Pipeline([stage(SemanticDedupStage, "kmeans")], workers=1, batch_rows=60).run(inputs, tmp_path / "out")
    again: list[str] = []
    monkeypatch.setattr(AssignTask, "run", lambda task: again.append(task.out.name) or real_run(task))
    Pipeline([stage(SemanticDedupStage, "kmeans")], workers=1, batch_rows=60).run(inputs, tmp_path / "out")
    assert output_bytes(tmp_path / "out") == reference["kmeans"]
    assert len(ran) == 3 and set(again).isdisjoint(ran) and len(again) >= 3  # 7 units of 60 rows
