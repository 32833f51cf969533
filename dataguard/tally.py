"""One mergeable shape for a stage's per-batch statistics.

``Stage.apply`` returns a `Tally` as ``Outcome.stats``; the pipeline hands the stage all
of them in input order and the base ``Stage.absorb`` merges them into ``stage.tally``, so
a stage never writes its own merge loop (nine hand-written ``absorb`` methods did the same
four things, each slightly differently). What a tally holds:

* ``counts`` - named integers, summed (``rows``, ``flagged``, ...);
* ``counters`` - named `Counter`s, summed key by key (rows per language, per class);
* ``hists`` - named fixed-edge histograms (the stage fixes the edges), summed bin by bin;
* ``examples`` - named lists capped at ``caps[name]`` items: the first ones in input order,
  or, with ``rank[name]`` naming item keys, the ones that sort lowest by them (ties in input
  order);
* ``lookup`` - named mappings merged by key (later batches win; for id -> snippet tables);
* ``parts`` - named objects whose class merges them (``cls.merge(items)``), for a summary
  no fixed shape fits (an exact integer histogram); `Best` is one for "per key, the value
  with the highest score" (per validation row, the training row that covers most of it).

Merging is associative and order-preserving, so results do not depend on how rows were
split into batches or which worker ran them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Tally:
    """A batch's (or, merged, a run's) statistics for one stage."""

    counts: Counter[str] = field(default_factory=Counter)
    counters: dict[str, Counter[Any]] = field(default_factory=dict)
    hists: dict[str, np.ndarray] = field(default_factory=dict)
    examples: dict[str, list[Any]] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)
    rank: dict[str, tuple[str, ...]] = field(default_factory=dict)
    per: dict[str, tuple[str, int]] = field(default_factory=dict)
    lookup: dict[str, dict[Any, Any]] = field(default_factory=dict)
    parts: dict[str, Any] = field(default_factory=dict)

    # -- recording (in a worker) -------------------------------------------------------------
    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += int(n)

    def count(self, name: str, keys: Iterable[Any]) -> None:
        self.counters.setdefault(name, Counter()).update(keys)

    def hist(self, name: str, counts: np.ndarray) -> None:
        """Add bin counts (integers, or floats for weighted rows) to histogram ``name``."""
        counts = np.asarray(counts)
        self.hists[name] = self.hists[name] + counts if name in self.hists else counts.copy()

    def keep(self, name: str, items: Iterable[Any], cap: int, rank: str | tuple[str, ...] | None = None,
             per: tuple[str, int] | None = None) -> None:
        """Keep ``items`` under ``name``: at most ``cap``, the first ones, or with ``rank``
        (an item key, or several) the ones that sort lowest by it; ``per=(key, n)`` keeps at
        most ``n`` items for each value of ``item[key]`` (first ones; not with ``rank``)."""
        self.caps[name] = cap
        if rank is not None:
            self.rank[name] = (rank,) if isinstance(rank, str) else tuple(rank)
        if per is not None:
            self.per[name] = per
        self.examples[name] = _trim(self.examples.get(name, []) + list(items), cap, self.rank.get(name),
                                    self.per.get(name))

    def note(self, name: str, key: Any, value: Any) -> None:
        self.lookup.setdefault(name, {})[key] = value

    def put(self, name: str, part: Any) -> None:
        """Record ``part`` (its class has a ``merge(items)`` classmethod) under ``name``."""
        self.parts[name] = type(part).merge([self.parts[name], part]) if name in self.parts else part

    # -- reading (in the driver) -------------------------------------------------------------
    def get(self, name: str) -> int:
        return int(self.counts.get(name, 0))

    def items(self, name: str) -> list[Any]:
        return list(self.examples.get(name, []))

    @classmethod
    def merge(cls, tallies: Iterable[Tally | None]) -> Tally:
        """All tallies in the order given (None, for a batch with nothing to say, is skipped)."""
        out = cls()
        parts: dict[str, list[Any]] = {}
        for t in tallies:
            if t is None:
                continue
            for name, part in t.parts.items():
                parts.setdefault(name, []).append(part)
            out.counts.update(t.counts)
            for name, c in t.counters.items():
                out.counters.setdefault(name, Counter()).update(c)
            for name, h in t.hists.items():
                out.hist(name, h)
            out.caps.update(t.caps)
            out.rank.update(t.rank)
            out.per.update(t.per)
            for name, items in t.examples.items():
                merged = out.examples.get(name, []) + list(items)
                out.examples[name] = _trim(merged, out.caps.get(name, len(merged)), out.rank.get(name),
                                           out.per.get(name))
            for name, table in t.lookup.items():
                out.lookup.setdefault(name, {}).update(table)
        out.parts = {name: type(items[0]).merge(items) for name, items in parts.items()}
        return out


def _trim(items: list[Any], cap: int, rank: tuple[str, ...] | None, per: tuple[str, int] | None) -> list[Any]:
    if rank is not None:
        items = sorted(items, key=lambda e: tuple(e[k] for k in rank))  # stable: ties keep input order
    if per is not None:
        key, most = per
        seen: Counter[Any] = Counter()
        kept = []
        for item in items:
            if seen[item[key]] < most:
                seen[item[key]] += 1
                kept.append(item)
        items = kept
    return items[:cap]


@dataclass
class Best:
    """Per key, the value offered with the highest score; on a tie the earlier one stays.

    A `Tally` part (``tally.put(name, best)``): a maximum per key over all rows cannot be a
    histogram or a capped list, and keys keep the order in which they were first offered,
    so a merged `Best` is the same however the rows were split into batches.
    """

    entries: dict[Any, tuple[Any, Any]] = field(default_factory=dict)  # key -> (score, value)

    def offer(self, key: Any, score: Any, value: Any) -> None:
        cur = self.entries.get(key)
        if cur is None or score > cur[0]:
            self.entries[key] = (score, value)

    @classmethod
    def merge(cls, parts: Iterable[Best]) -> Best:
        """The parts in the order given (earlier parts win ties)."""
        out = cls()
        for part in parts:
            for key, (score, value) in part.entries.items():
                out.offer(key, score, value)
        return out
