"""Class labels for classification runs: the label <-> id map and the longtail stage's
per-class state (priors, logit offsets, weights, curriculum) in label-map order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from dataguard.io.safe_files import write_atomic
from dataguard.train.errors import TrainDataError


@dataclass
class LabelMap:
    """Stable label <-> id map, saved next to every checkpoint."""

    classes: list[str]

    def __post_init__(self) -> None:
        if len(set(self.classes)) != len(self.classes):
            raise TrainDataError("duplicate class names in the label map")
        self._ids = {c: i for i, c in enumerate(self.classes)}

    @classmethod
    def from_run(cls, table: pa.Table, training: dict[str, Any] | None = None,
                 label_column: str = "label") -> LabelMap:
        """Classes in the longtail stage's order when the manifest has it (so the manifest's
        priors/offsets line up with the ids), then any other labels sorted."""
        ordered: list[str] = []
        for state in (training or {}).values():
            if isinstance(state, dict) and isinstance(state.get("classes"), list):
                ordered = [str(c) for c in state["classes"]]
                break
        seen = set(ordered)
        labels = table.column(label_column).drop_null().unique().to_pylist() if table.num_rows else []
        extra = sorted(str(x) for x in labels if str(x) not in seen)
        return cls(ordered + extra)

    def __len__(self) -> int:
        return len(self.classes)

    def id(self, label: str) -> int:
        return self._ids[label]

    def label(self, i: int) -> str:
        return self.classes[i]

    def to_json(self) -> dict[str, Any]:
        return {"classes": list(self.classes), "id2label": dict(enumerate(self.classes)),
                "label2id": dict(self._ids)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | str) -> LabelMap:
        if isinstance(data, str):
            data = json.loads(data)
        return cls([str(c) for c in data["classes"]])

    def save(self, path: str | Path) -> None:
        # a temp file opened O_EXCL | O_NOFOLLOW, then renamed: a link planted at a predictable
        # temp name in a run folder is never followed
        write_atomic(Path(path), json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> LabelMap:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))


def _longtail_state(training: dict[str, Any]) -> dict[str, Any] | None:
    for state in training.values():
        if isinstance(state, dict) and "logit_offsets" in state and "classes" in state:
            return state
    return None


def class_vector(training: dict[str, Any], label_map: LabelMap, key: str) -> list[float | None] | None:
    """A per-class list of the longtail state (``logit_offsets``, ``class_weights``,
    ``priors``) in label_map order; classes the state does not know get None."""
    state = _longtail_state(training)
    if state is None or not isinstance(state.get(key), list):
        return None
    by_class = dict(zip(state["classes"], state[key], strict=False))
    return [by_class.get(c) for c in label_map.classes]


def curriculum_schedule(training: dict[str, Any], label_map: LabelMap
                        ) -> tuple[list[list[float]], list[float]] | None:
    """(phase_multipliers in label_map order, boundaries) for the sampler, or None.
    A class unknown to the curriculum is admitted from the start (multiplier 1)."""
    state = _longtail_state(training)
    cur = (state or {}).get("curriculum")
    if not isinstance(cur, dict) or not cur.get("phase_multipliers"):
        return None
    index = {c: i for i, c in enumerate(state["classes"])}  # type: ignore[index]
    mult = [[float(phase[index[c]]) if c in index else 1.0 for c in label_map.classes]
            for phase in cur["phase_multipliers"]]
    return mult, [float(b) for b in cur.get("boundaries", [])]


def curriculum_unit(training: dict[str, Any]) -> str:
    """What the manifest's schedule boundaries count: ``steps`` (default) or ``epochs``."""
    cur = (_longtail_state(training) or {}).get("curriculum")
    unit = cur.get("unit") if isinstance(cur, dict) else None
    return unit if unit in ("steps", "epochs") else "steps"
