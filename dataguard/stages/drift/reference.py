"""The drift reference: loading it, and the small state kept of it (bins, counts, samples).

The reference (a validation split, a sample of production inputs) is loaded once when the
stage is built - through the same readers and normalizer as the pipeline's inputs, or from
a previous dataguard output folder (whose shards carry score columns) - and reduced to
small state: per numeric column the reference's quantile bin edges and bin counts, per
categorical column (and the label column) its value counts, a bottom-k sample of its texts
and one of its numeric feature vectors (for MMD). Nothing else of the reference is kept, so
the stage pickles small.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.records import SIDE_ROLES, message_texts
from dataguard.stats.features import has_feature, numeric_feature
from dataguard.stats.hashing import hash64
from dataguard.stats.psi import bin_counts, quantile_edges
from dataguard.stats.repeat import weighted_value_counts

TEXT_ROLES = SIDE_ROLES
Sample = list[tuple[float, Any]]


def load_reference(reference: Any) -> pa.Table:
    """The reference as a canonical table (plus any score columns it carries).

    Accepts a `pyarrow.Table`; a dataguard output folder (``data/*.arrow``) or a single
    ``.arrow`` stream file; any file the pipeline's readers handle, given as a path or as a
    mapping of `InputSpec` fields (``{"path": ..., "format": "labelled_text",
    "aliases": {"category": "label"}}``), normalized exactly like an input.
    """
    if isinstance(reference, pa.Table):
        return reference
    spec_fields: dict[str, Any] = dict(reference) if isinstance(reference, Mapping) else {"path": reference}
    path = Path(spec_fields.get("path", ""))
    if path.is_dir() and (path / "data").is_dir() and sorted((path / "data").glob("*.arrow")):
        from dataguard.io.writer import read_table

        return pa.concat_tables([read_table(p) for p in sorted((path / "data").glob("*.arrow"))],
                                promote_options="default")
    if path.is_file() and path.suffix == ".arrow":
        from dataguard.io.writer import read_table

        return read_table(path)
    from dataguard.io.readers import InputSpec, read_batches
    from dataguard.stages.normalize import Normalizer

    spec_fields.setdefault("name", "reference")
    spec = InputSpec(**spec_fields)
    options = spec.options()
    options.path = str(spec.path) if spec.path is not None else None
    normalizer = Normalizer()
    outcomes = [normalizer.normalize(rb, options) for rb in read_batches(spec)]
    normalizer.absorb([o.stats for o in outcomes])  # an alias that matched nothing is an InputError
    tables = [o.kept for o in outcomes]
    return pa.concat_tables(tables) if tables else normalizer.schema.empty_table()


def bottom_k(items: Sequence[tuple[float, Any]], k: int) -> Sample:
    return heapq.nsmallest(k, items)


def sample_keys(table: pa.Table, seed: int, salt: str, weights: np.ndarray | None = None) -> np.ndarray:
    """Per-row keys of a bottom-k sample that merges across batches (keep the k smallest).

    key = -ln(u) / w with u a uniform from hash(seed, id): exponential races, i.e.
    weighted sampling without replacement (Efraimidis-Spirakis); with w = 1 it is a uniform
    sample. Rows with weight <= 0 get an infinite key and are never sampled.
    """
    u = (hash64(table.column("id").to_pylist(), seed, salt).astype(np.float64) + 1.0) / 2.0**64
    w = np.ones(table.num_rows) if weights is None else np.asarray(weights, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(w > 0, -np.log(u) / np.where(w > 0, w, 1.0), np.inf)


def text_sample(table: pa.Table, roles: tuple[str, ...], seed: int, k: int,
                weights: np.ndarray | None = None) -> Sample:
    """Bottom-k sample of (key, text) (see `sample_keys`); empty texts are skipped."""
    if table.num_rows == 0:
        return []
    keys = sample_keys(table, seed, "drift-text", weights)
    texts = message_texts(table, roles)
    return bottom_k([(kk, t) for kk, t in zip(keys.tolist(), texts, strict=True) if t and kk < np.inf], k)


def feature_sample(table: pa.Table, columns: Sequence[str], seed: int, k: int,
                   weights: np.ndarray | None = None) -> Sample:
    """Bottom-k sample of (key, feature vector) over the numeric ``columns``, for MMD."""
    if table.num_rows == 0 or not columns or k == 0:
        return []
    keys = sample_keys(table, seed, "drift-mmd", weights)
    take = np.argsort(keys, kind="stable")[:k]
    take = take[np.isfinite(keys[take])]
    if take.size == 0:
        return []
    part = table.take(pa.array(take))
    matrix = np.column_stack([numeric_feature(part, c) for c in columns])
    return [(float(keys[i]), tuple(row)) for i, row in zip(take.tolist(), matrix.tolist(), strict=True)]


def categories(table: pa.Table, column: str) -> pa.Array:
    """The column as one string array (categories are compared as strings)."""
    return table.column(column).cast(pa.string()).combine_chunks()


@dataclass
class ReferenceState:
    """What the stage keeps of the reference."""

    rows: int
    edges: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    cats: dict[str, Counter] = field(default_factory=dict)
    labels: Counter | None = None  # the label column's counts, when the reference has it
    texts: Sample = field(default_factory=list)
    features: Sample = field(default_factory=list)


def reduce_reference(ref: pa.Table, columns: Sequence[str], categorical: Sequence[str], text: str | bool,
                     bins: int, seed: int, text_k: int, feature_k: int, label_column: str | None) -> ReferenceState:
    """The reference's bins, counts and samples; raises ValueError naming what is missing."""
    if ref.num_rows == 0:
        raise ValueError("reference has no rows")
    cols = ref.column_names
    missing = [c for c in columns if not has_feature(cols, c)]
    if missing:
        raise ValueError(f"columns {missing} are neither in the reference nor derivable from its "
                         f"messages (reference columns: {cols})")
    missing = [c for c in categorical if c not in cols]
    if missing:
        raise ValueError(f"categorical columns {missing} are not in the reference (columns: {cols})")
    if text and ("messages" not in cols or "id" not in cols):
        raise ValueError("text drift needs 'id' and 'messages' in the reference; set text: false")
    state = ReferenceState(rows=ref.num_rows)
    for c in columns:
        v = numeric_feature(ref, c)
        state.edges[c] = quantile_edges(v, bins)
        state.counts[c] = bin_counts(v, state.edges[c])
        finite = v[~np.isnan(v)]
        state.ranges[c] = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    state.cats = {c: weighted_value_counts(categories(ref, c), None) for c in categorical}
    if label_column is not None and label_column in cols:
        state.labels = weighted_value_counts(categories(ref, label_column), None)
    if text:
        state.texts = text_sample(ref, TEXT_ROLES[str(text)], seed, text_k)
    if "id" in cols:
        state.features = feature_sample(ref, columns, seed, feature_k)
    return state
