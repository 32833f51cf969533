"""The 160 real preference pairs of the DPO sample (sample_data/dpo_en_demo.head160.json),
normalised, and pairs planted beside them, for the tests of the stages that judge both
responses of a pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.records import CANONICAL_COLUMNS
from dataguard.stages.normalize import Normalizer

DPO_SAMPLE = Path(__file__).resolve().parent.parent / "sample_data" / "dpo_en_demo.head160.json"


def dpo_records() -> list[dict[str, Any]]:
    return json.loads(DPO_SAMPLE.read_text(encoding="utf-8"))


def normalised(records: list[Any], source: str = "dpo_demo") -> pa.Table:
    """The records as canonical rows (every one must pass normalisation)."""
    batch = RawBatch(source=source)
    for i, rec in enumerate(records):
        batch.add(i, rec)
    out = Normalizer().normalize(batch, SourceOptions(name=source))
    assert out.rejected.num_rows == 0, out.rejected.column("reason").to_pylist()
    return out.kept.select(list(CANONICAL_COLUMNS))


def pair(prompt: str, chosen: str, rejected: str) -> dict[str, Any]:
    """A record in the sample's own ShareGPT preference shape."""
    return {"conversations": [{"from": "human", "value": prompt}],
            "chosen": {"from": "gpt", "value": chosen}, "rejected": {"from": "gpt", "value": rejected}}
