"""A few banking77 intents from tests/data as pipeline shards: the classify runner tests' data."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline

BANKING = Path(__file__).resolve().parent / "data" / "banking77" / "train.csv"


def banking_rows(classes: Sequence[str], per_class: int) -> list[dict[str, str]]:
    """The first ``per_class`` rows of each intent in ``classes``, class by class."""
    with BANKING.open(encoding="utf-8", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["category"] in classes]
    return [r for c in classes for r in [x for x in rows if x["category"] == c][:per_class]]


def banking_shards(folder: Path, rows: list[dict[str, str]]) -> Path:
    """``rows`` (text, category) through an empty pipeline; the shards' folder."""
    with (folder / "bank.csv").open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["text", "category"])
        w.writeheader()
        w.writerows(rows)
    data = folder / "shards"
    Pipeline([], workers=1).run([InputSpec(path=str(folder / "bank.csv"), format="labelled_text",
                                           aliases={"category": "label"})], data)
    return data
