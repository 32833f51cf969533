"""Consecutive fit stages share one boundary only where declared and safe; output unchanged."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline, plan_segments
from dataguard.records import set_column
from dataguard.run import segment as segment_mod
from dataguard.stage import Outcome, Stage
from dataguard.stages.dedup import DedupStage
from dataguard.stages.drift import DriftStage
from dataguard.stages.longtail import LongTailStage
from dataguard.stages.noise.stage import NoiseStage
from dataguard.stages.normalize import Normalizer

DATA = Path(__file__).resolve().parent / "data"


class Fit(Stage):
    """A fit stage whose declarations the test chooses."""

    name = "fit"
    needs_fit = True

    def __init__(self, *, adds: Sequence[str] | None = None, reads: Sequence[str] | None = None,
                 writes: Sequence[str] = ()) -> None:
        self._adds = None if adds is None else frozenset(adds)
        self._reads = None if reads is None else frozenset(reads)
        self._writes = tuple(writes)

    def apply_adds(self) -> frozenset[str] | None:
        return self._adds

    def columns_read(self) -> frozenset[str] | None:
        return self._reads

    def output_columns(self) -> dict[str, pa.DataType]:
        return {c: pa.int8() for c in (*self._writes, *(self._adds or ()))}


class Local(Stage):
    name = "local"


def _fits(*stages: Stage) -> list[tuple[int, ...]]:
    return [s.fit_steps for s in plan_segments([Normalizer(), *stages])]


def test_declared_consecutive_fits_share_one_boundary() -> None:
    a, b = Fit(adds=["a_flag"], reads=["id"]), Fit(reads=["id", "messages"])
    segments = plan_segments([Normalizer(), a, b])
    assert [s.ops for s in segments] == [
        [("source", 0), ("score", 1), ("summarize", 1), ("mark", 2), ("score", 2), ("summarize", 2)],
        [("apply", 1), ("place", 2), ("apply", 2)],
    ]
    assert [s.fit_steps for s in segments] == [(1, 2), ()]
    # three in a row share when every pair allows it
    assert _fits(a, Fit(adds=["b_flag"], reads=["id"]), Fit(reads=["id"])) == [(1, 2, 3), ()]


@pytest.mark.parametrize("first, second", [
    (Fit(), Fit(reads=["id"])),                                  # nothing declared: as before
    (Fit(adds=None, reads=["id"]), Fit(reads=["id"])),           # apply may drop rows / change columns
    (Fit(adds=["a_flag"], reads=["id"]), Fit()),                 # the later stage's reads unknown
    (Fit(adds=["a_flag"], reads=["id"]), Fit(reads=["a_flag"])),  # B reads A's apply column
    (Fit(adds=["a_flag"], reads=["id"]), Fit(reads=["id"], writes=["a_flag"])),  # B writes it
    (Fit(adds=["a_flag"], reads=["b_score"]), Fit(reads=["id"], writes=["b_score"])),  # A reads B's column
])
def test_no_sharing_unless_declared_and_safe(first: Stage, second: Stage) -> None:
    assert _fits(first, second) == [(1,), (2,), ()]


def test_row_local_stage_between_fits_closes_the_boundary() -> None:
    assert _fits(Fit(adds=["a"], reads=["id"]), Local(), Fit(reads=["id"])) == [(1,), (3,), ()]


def test_later_member_checked_against_every_earlier_one() -> None:
    # C reads what A's apply adds: B joins A, C starts a new boundary
    assert _fits(Fit(adds=["a"], reads=["id"]), Fit(adds=["b"], reads=["id"]), Fit(reads=["a"])) == \
        [(1, 2), (3,), ()]


def test_stage_declarations_follow_their_parameters() -> None:
    assert NoiseStage(action="flag").apply_adds() == {"label_quality", "suggested_label", "is_label_issue"}
    assert NoiseStage(action="drop").apply_adds() is None
    assert NoiseStage(action="relabel").apply_adds() is None
    assert LongTailStage().apply_adds() == {"sample_weight", "curriculum_phase"}
    assert LongTailStage(resample="balanced").apply_adds() is None
    assert DedupStage(action="drop").apply_adds() is None
    ref = DATA / "banking77/test.csv"
    assert DriftStage(reference=str(ref), correct="resample").apply_adds() is None
    # drift weighted by longtail's sample_weight reads longtail's apply column: no sharing
    weighted = DriftStage(reference=str(ref), weight_column="sample_weight")
    assert _fits(LongTailStage(), weighted) == [(1,), (2,), ()]
    assert _fits(NoiseStage(action="flag"), LongTailStage()) == [(1, 2), ()]
    assert _fits(NoiseStage(action="drop"), LongTailStage()) == [(1,), (2,), ()]


class Adds(Stage):
    """Flag-style fit stage that appends one column in apply (checks the column order)."""

    name = "adds"
    needs_fit = True

    def __init__(self, *, column: str = "x") -> None:
        self.column = column

    def score(self, batch: pa.Table) -> pa.Table:
        return set_column(batch, f"{self.column}_score", pa.array([1] * batch.num_rows, pa.int32()))

    def summarize(self, batch: pa.Table) -> Any:
        return batch.num_rows

    def fit(self, summaries: Sequence[Any]) -> None:
        self.total = sum(summaries)

    def apply(self, batch: pa.Table) -> Outcome:
        return Outcome(kept=set_column(batch, f"{self.column}_flag", pa.array([self.total] * batch.num_rows)))

    def apply_adds(self) -> frozenset[str]:
        return frozenset((f"{self.column}_flag",))

    def columns_read(self) -> frozenset[str]:
        return frozenset((f"{self.column}_score",))

    def output_columns(self) -> dict[str, pa.DataType]:
        return {f"{self.column}_score": pa.int32(), f"{self.column}_flag": pa.int64()}


def _digests(folder: Path) -> dict[str, str]:
    paths = [folder / "manifest.json", *sorted(folder.glob("data/*.arrow")), *sorted(folder.glob("rejected/*.arrow"))]
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def _stages() -> list[Stage]:
    ref = {"path": str(DATA / "banking77/test.csv"), "format": "labelled_text", "aliases": {"category": "label"}}
    # the shared boundary's last member rejects rows (resampling): fine, its apply runs last
    return [DedupStage(action="flag"), Adds(column="a"), Adds(column="b"), LongTailStage(resample="balanced"),
            DriftStage(reference=ref, columns=["prompt_chars", "prompt_words"], text=False, mmd_sample=50)]


@pytest.mark.parametrize("workers", [1, 2])
def test_shared_boundary_output_is_byte_identical(tmp_path: Path, workers: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = [InputSpec(path=DATA / "banking77/train.csv", name="banking", format="labelled_text",
                        aliases={"category": "label"})]
    shared = Pipeline(_stages(), workers=workers, batch_rows=300)
    assert [s.fit_steps for s in plan_segments(shared.steps)] == [(1, 2, 3, 4), (5,), ()]
    assert shared.run(inputs, tmp_path / "shared").rows_rejected > 0
    with monkeypatch.context() as m:
        m.setattr(segment_mod, "can_share", lambda group, later: False)
        plain = Pipeline(_stages(), workers=1, batch_rows=300)
        assert len(plan_segments(plain.steps)) == 6
        plain.run(inputs, tmp_path / "plain")
    assert _digests(tmp_path / "shared") == _digests(tmp_path / "plain")
    names = Pipeline(_stages(), workers=1).run(inputs, tmp_path / "again").kept_table().column_names
    assert names.index("a_flag") < names.index("b_score") < names.index("b_flag") < names.index("sample_weight")


class Lies(Adds):
    """Declares an apply that only adds one column, but adds another too."""

    def apply(self, batch: pa.Table) -> Outcome:
        out = super().apply(batch).kept
        return Outcome(kept=set_column(out, "extra", pa.array(["x"] * batch.num_rows)))


def test_undeclared_apply_change_is_caught(tmp_path: Path) -> None:
    inputs = [InputSpec(path=DATA / "banking77/train.csv", name="banking", format="labelled_text",
                        aliases={"category": "label"})]
    with pytest.raises(Exception, match="shares a fit boundary"):
        Pipeline([Lies(column="a"), Adds(column="b")], workers=1, batch_rows=500).run(inputs, tmp_path / "out")
