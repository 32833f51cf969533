"""Threshold rows (Pleiss et al. 2020, "Identifying Mislabeled Data using the Area Under the
Margin Ranking"): a random ``1/(c+1)`` of the training rows trained under an extra, fake class.

No row truly belongs to the fake class, so the model can fit those rows only by memorising
them, which is exactly how it fits a mislabelled row. Their AUM therefore shows what a wrong
label looks like *in this run*, and the noise stage takes the 99th percentile of it as its cut
(``dataguard.stages.noise.dynamics``) instead of guessing one.

A run sets ``threshold_rows: 1`` or ``2``: the first or the second of two disjoint sets, so two
runs judge every row (a row is judged only by a run where it kept its own label). The set is
drawn from a seeded hash of each row's id, so it does not depend on the order of the shards or
on the number of workers that wrote them. Such a run is a diagnostic: its head has one extra
output, and its model is not one to ship.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from dataguard.train.data.encoded import Encoded
from dataguard.train.data.labels import LabelMap
from dataguard.train.errors import TrainDataError

THRESHOLD_CLASS = "__threshold__"
PARTS = (1, 2)


def threshold_count(n_rows: int, n_classes: int) -> int:
    """``n / (c + 1)`` rows, as Pleiss et al. size the fake class: about one real class's share."""
    return n_rows // (n_classes + 1)


def threshold_positions(row_ids: Sequence[str], n_classes: int, part: int, seed: int) -> np.ndarray:
    """Positions into ``row_ids`` (sorted) of set ``part`` (1 or 2) of the threshold rows."""
    if part not in PARTS:
        raise ValueError(f"threshold_rows part must be one of {PARTS}, got {part!r}")
    m = threshold_count(len(row_ids), n_classes)
    order = sorted(range(len(row_ids)),
                   key=lambda i: (hashlib.blake2b(f"{seed}\x00{row_ids[i]}".encode(), digest_size=8).digest(), i))
    return np.sort(np.asarray(order[(part - 1) * m: part * m], dtype=np.int64))


def threshold_ids(row_ids: Sequence[str], n_classes: int, part: int, seed: int) -> list[str]:
    """The ids of set ``part``, sorted: what the run's dynamics file records."""
    return sorted(row_ids[int(i)] for i in threshold_positions(row_ids, n_classes, part, seed))


def add_threshold_class(label_map: LabelMap) -> LabelMap:
    """The run's label map with the fake class last (already there when resuming)."""
    if label_map.classes and label_map.classes[-1] == THRESHOLD_CLASS:
        return label_map
    if THRESHOLD_CLASS in label_map.classes:
        raise TrainDataError(f"threshold_rows: the data has a class named {THRESHOLD_CLASS!r}, the name the "
                             "fake class needs; rename it")
    return LabelMap([*label_map.classes, THRESHOLD_CLASS])


def relabel_threshold_rows(enc: Encoded, label_map: LabelMap, part: int, seed: int) -> int:
    """Give set ``part`` of the training rows ``enc`` the fake class (the label map's last);
    returns how many. The relabelled encoding is then the one record of which rows they are."""
    fake = len(label_map) - 1
    assert enc.class_ids is not None and label_map.classes[fake] == THRESHOLD_CLASS
    pos = threshold_positions(enc.row_ids, fake, part, seed)
    cls = np.array(enc.class_ids, dtype=np.int64, copy=True)
    cls[pos] = fake
    enc.class_ids, enc.labels = cls, cls.tolist()
    return len(pos)
