"""An exact, mergeable histogram of non-negative integers (token counts, lengths, ...).

Stored sparsely as sorted unique values with counts, so merging batch summaries is exact
(no binning error in a percentile) and the summary stays small: a batch of 10,000 rows
has at most a few thousand distinct lengths. Percentiles use numpy's default "linear"
definition over the expanded multiset, so ``IntHistogram.of(x).percentile(p) ==
np.percentile(x, p)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class IntHistogram:
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # sorted, unique
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def of(cls, x: Iterable[int] | np.ndarray) -> IntHistogram:
        arr = np.asarray(x if isinstance(x, np.ndarray) else list(x), dtype=np.int64)
        if arr.size and arr.min() < 0:
            raise ValueError("IntHistogram holds non-negative integers only")
        values, counts = np.unique(arr, return_counts=True)
        return cls(values.astype(np.int64), counts.astype(np.int64))

    @classmethod
    def merge(cls, parts: Iterable[IntHistogram]) -> IntHistogram:
        parts = [p for p in parts if p is not None and p.total]
        if not parts:
            return cls()
        values = np.concatenate([p.values for p in parts])
        counts = np.concatenate([p.counts for p in parts])
        uniq, inv = np.unique(values, return_inverse=True)
        return cls(uniq.astype(np.int64), np.bincount(inv, weights=counts).astype(np.int64))

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def sum(self) -> int:
        return int((self.values * self.counts).sum())

    def percentile(self, p: float) -> float:
        """numpy's linear-interpolation percentile of the expanded values."""
        n = self.total
        if n == 0:
            raise ValueError("percentile of an empty histogram")
        rank = (n - 1) * (p / 100.0)
        lo, hi = int(np.floor(rank)), int(np.ceil(rank))
        cum = np.cumsum(self.counts)
        v_lo = self.values[np.searchsorted(cum, lo, side="right")]
        v_hi = self.values[np.searchsorted(cum, hi, side="right")]
        return float(v_lo + (v_hi - v_lo) * (rank - lo))

    def binned(self, edges: np.ndarray) -> list[int]:
        """Counts per bin [edges[i], edges[i+1]) (last bin closed), for reports."""
        idx = np.searchsorted(edges, self.values, side="right") - 1
        idx = np.clip(idx, 0, len(edges) - 2)
        return np.bincount(idx, weights=self.counts, minlength=len(edges) - 1).astype(np.int64).tolist()

    def to_dict(self) -> dict[str, Any]:
        return {"values": self.values.tolist(), "counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IntHistogram:
        return cls(np.asarray(d["values"], dtype=np.int64), np.asarray(d["counts"], dtype=np.int64))


def report_edges(max_value: int, bins: int = 30) -> np.ndarray:
    """Integer bin edges from 0 to just above max_value, for report histograms."""
    step = max(1, int(np.ceil((max_value + 1) / bins)))
    return np.arange(0, step * bins + 1, step, dtype=np.int64)
