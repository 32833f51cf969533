"""Near-duplicate detection across all sources: MinHash + LSH banding, union-find clusters.

``summarize`` (row-local, in workers) turns each row's text (its message contents joined by
newlines; ``scope="prompt"``: only system/user/tool turns) into a shingle set (words or
characters, `dataguard.text.minhash`) and a ``num_perm`` MinHash signature; the summary holds
ids, signatures (4 bytes x num_perm per row), text lengths and, with ``verify``, the shingle
sets (4 bytes per distinct shingle).

In a pipeline run this material goes to the work folder and the fit below runs as two
distributed rounds (`near_dedup_rounds`: bucket ranges, then clusters), with the same result;
``summarize``/``fit`` as described are the in-memory path (and the reference).
``fit`` bands the signatures (``bands x rows``, derived from ``threshold``
unless given), pairs every row sharing a band bucket with the bucket's first row, and accepts
a pair when its exact shingle-set Jaccard (``verify=True``, default: LSH false positives are
dropped) or its MinHash estimate (``verify=False``: no shingle sets shipped) is >= threshold.
Bucket members that fail against the bucket's first row are re-paired among themselves (up
to ``near_dedup_buckets.MAX_ROUNDS`` rounds), so one stray row in a bucket does not hide real duplicates.
Accepted pairs are joined into clusters by union-find (transitively: A~B and B~C puts A, B, C
together, as in datatrove and data-juicer). One row per cluster is kept:

1. a row from ``validation_sources`` if the cluster has one (a validation row is never
   dropped in favour of a training row),
2. then ``keep="first"`` (default): the first row in input order (the order summaries reach
   ``fit``, which does not depend on the number of workers); ``keep="longest"``: the row
   with the most characters, ties to the first.

``apply`` adds ``near_dup_cluster`` (int64, dense cluster number in order of first member;
null for rows with no near duplicate), ``near_dup_of`` (the kept row's id, null for kept
rows) and ``near_dup_jaccard`` (the row's Jaccard to the kept row: exact with ``verify``, else
estimated) and, with ``action="drop"`` (default), rejects the rows not kept as
``near_duplicate``. Ids must be unique across the run (normalization guarantees it).

Defaults (word 5-shingles, threshold 0.7, 128 permutations) follow data-juicer's (5 words,
0.7) and datatrove's (5-grams, 14 x 8 ~ 0.72) MinHash defaults, so results are comparable;
the bands lean towards recall (20 x 6, see ``LSH_FP_WEIGHT``) because candidates are checked.
See ``benchmarks/bench_near_dedup.py`` for recall, precision and throughput against both.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.params import FLAG, SEED, SOURCES, Interval, Options
from dataguard.records import PROMPT_ROLES, ROLES, message_texts, set_column
from dataguard.rounds.tasks import Answers, example_index
from dataguard.stage import Outcome, Stage, StageConfigError, drop_or_keep
from dataguard.stages.dedup import tools_key
from dataguard.stages.near_dedup_buckets import bucket_entries, bucket_pairs, shared_buckets
from dataguard.stages.near_dedup_files import NearDedupUnitSummary, write_unit
from dataguard.stages.near_dedup_rounds import Measure, plan_and_run
from dataguard.stats.clusters import connected_components, pick_kept
from dataguard.tally import Tally
from dataguard.text import minhash

if TYPE_CHECKING:
    from dataguard.rounds.tasks import RoundContext, UnitFitFiles

ACTIONS = ("drop", "flag")
KEEPS = ("first", "longest")
SCOPES = ("messages", "prompt")
REASON = "near_duplicate"
SCOPE_ROLES = {"messages": ROLES, "prompt": PROMPT_ROLES}
# Weight of the false-positive area when bands x rows are derived: every candidate pair is
# checked (exact or estimated Jaccard) before it links rows, so a false candidate only costs
# a check while a missed one costs recall. At threshold 0.7 / 128 permutations this gives
# 20 bands x 6 rows: a pair at Jaccard 0.7 becomes a candidate with p = 0.92 (0.44 with
# the even weighting's 14 x 9), at 0.75 with p = 0.98.
LSH_FP_WEIGHT = 0.1
MAX_EXAMPLES = 20
SNIPPET_CHARS = 240
SIZE_BINS = ((2, 2), (3, 3), (4, 5), (6, 10), (11, None))
PARTITION_ENTRIES = 1 << 21  # band entries per round-1 task (~100k rows at 20 bands; ~100 MB)


@dataclass
class NearDedupSummary:
    """Per-row MinHash material of one batch (row order = batch order)."""

    ids: list[str]
    signatures: np.ndarray  # (n, num_perm) uint32
    lengths: np.ndarray  # int64 characters of the text
    preferred: np.ndarray  # bool: from a validation source
    values: np.ndarray  # uint32 shingle ids (empty without verify)
    offsets: np.ndarray  # int64 (n + 1,)
    tools: np.ndarray | None = None  # uint64 hash of meta["tools"] (0: none); rows differing here never link


def source_names(value: str | Sequence[str]) -> tuple[str, ...]:
    """validation_sources as a tuple (a single name is accepted; `params.SOURCES` checked it)."""
    return (value,) if isinstance(value, str) else tuple(value)


def is_validation(batch: pa.Table, sources: tuple[str, ...]) -> np.ndarray:
    """Per row: does it come from one of the validation ``sources``."""
    if not sources or batch.num_rows == 0:
        return np.zeros(batch.num_rows, dtype=bool)
    hit = pc.is_in(batch.column("source"), value_set=pa.array(sources, pa.string()))
    return pc.fill_null(hit, False).to_numpy(zero_copy_only=False).astype(bool)


class NearDedupStage(Stage):
    """Clusters rows whose shingle sets overlap (Jaccard >= threshold); keeps one per cluster."""

    name = "near_dedup"
    needs_fit = True
    constraints = {
        "threshold": [Interval(float, 0, 1, closed="right")],
        "shingle": [Options(*minhash.SHINGLE_KINDS)],
        "shingle_size": [Interval(int, 1, 64)],
        "num_perm": [Interval(int, 1, 1024)],
        "bands": [Interval(int, 1), None],
        "rows": [Interval(int, 1), None],
        "verify": FLAG,
        "keep": [Options(*KEEPS)],
        "scope": [Options(*SCOPES)],
        "action": [Options(*ACTIONS)],
        "validation_sources": SOURCES,
        "seed": SEED,
    }
    reasons = {REASON: "a near copy (MinHash, Jaccard >= threshold) of a kept row"}
    partition_entries = PARTITION_ENTRIES  # an instance may set fewer (tests: several ranges on small data)

    def __init__(self, *, threshold: float = 0.7, shingle: str = "word", shingle_size: int = 5,
                 num_perm: int = 128, bands: int | None = None, rows: int | None = None, verify: bool = True,
                 keep: str = "first", scope: str = "messages", action: str = "drop",
                 validation_sources: Sequence[str] = (), seed: int = 1) -> None:
        self.shingle_size = shingle_size
        self.num_perm = num_perm
        if (bands is None) != (rows is None):
            missing = "rows" if rows is None else "bands"
            raise StageConfigError(f"{missing}: give both bands and rows, or neither (derived from threshold)",
                                   param=missing)
        if bands is not None and bands * rows > num_perm:
            raise StageConfigError(f"bands x rows ({bands} x {rows}) must be <= num_perm ({num_perm})",
                                   param="bands")
        self.seed = seed
        self.validation_sources = source_names(validation_sources)
        self.threshold = float(threshold)
        self.shingle = shingle
        self.bands, self.rows = (bands, rows) if bands is not None else \
            minhash.lsh_params(self.threshold, num_perm, LSH_FP_WEIGHT)
        self.verify = verify
        self.keep = keep
        self.scope = scope
        self.action = action
        # fit state, kept small: one entry per row that has a near duplicate
        self._decision: dict[str, tuple[int, str | None, float]] = {}
        self._example_ids: dict[str, int] = {}
        self._fitted = False
        self._fit_stats: dict[str, Any] = {}
        self._answers: Answers | None = None  # fitted in rounds: where the units' keep decisions are

    def output_columns(self) -> dict[str, pa.DataType]:
        return {"near_dup_cluster": pa.int64(), "near_dup_of": pa.string(), "near_dup_jaccard": pa.float32()}

    def _texts(self, batch: pa.Table) -> list[str]:
        return message_texts(batch, SCOPE_ROLES[self.scope])

    def summarize(self, batch: pa.Table) -> NearDedupSummary:
        texts = self._texts(batch)
        values, offsets = minhash.shingle_sets(texts, self.shingle, self.shingle_size)
        sig = minhash.signatures(values, offsets, self.num_perm, self.seed)
        preferred = is_validation(batch, self.validation_sources)
        if not self.verify:  # the sets are only needed for exact Jaccard
            values, offsets = np.zeros(0, np.uint32), np.zeros(len(texts) + 1, np.int64)
        return NearDedupSummary(ids=batch.column("id").to_pylist(), signatures=sig,
                                lengths=np.fromiter(map(len, texts), np.int64, count=len(texts)),
                                preferred=preferred, values=values, offsets=offsets, tools=tools_keys(batch))

    def fit(self, summaries: Sequence[NearDedupSummary]) -> None:
        ids = [i for s in summaries for i in s.ids]
        n = len(ids)
        sig = np.concatenate([s.signatures for s in summaries]) if summaries else \
            np.zeros((0, self.num_perm), np.uint32)
        lengths = np.concatenate([s.lengths for s in summaries]) if summaries else np.zeros(0, np.int64)
        preferred = np.concatenate([s.preferred for s in summaries]) if summaries else np.zeros(0, bool)
        values, offsets = _concat_sets(summaries)
        valid = (sig != np.uint32(0xFFFFFFFF)).any(axis=1) if n else np.zeros(0, bool)

        tools = np.concatenate([s.tools if s.tools is not None else np.zeros(len(s.ids), np.uint64)
                                for s in summaries]) if summaries else np.zeros(0, np.uint64)

        def similarity(pairs: np.ndarray) -> np.ndarray:
            sim = minhash.exact_jaccard(values, offsets, pairs) if self.verify else minhash.estimated_jaccard(sig, pairs)
            # the same conversation offered other tools is another training example (as in dedup)
            return np.where(tools[pairs[:, 0]] == tools[pairs[:, 1]], sim, 0.0) if len(pairs) else sim

        keys = minhash.band_keys(sig, self.bands, self.rows)
        edges, candidates = _linked_pairs(keys, valid, similarity, self.threshold)
        labels = connected_components(n, edges)
        kept = pick_kept(labels, preferred, lengths if self.keep == "longest" else None)
        size = np.bincount(labels, minlength=n)
        clustered = np.flatnonzero(size[labels] > 1)
        cluster_no = np.full(n, -1, dtype=np.int64)
        roots = np.unique(labels[clustered])  # smallest member index: numbered in input order
        cluster_no[clustered] = np.searchsorted(roots, labels[clustered])
        dropped = clustered[kept[clustered] != clustered]
        jac = similarity(np.stack([kept[dropped], dropped], axis=1)) if len(dropped) else np.zeros(0)
        self._decision = {ids[i]: (int(cluster_no[i]), None, 1.0) for i in clustered.tolist()}
        for i, k, j in zip(dropped.tolist(), kept[dropped].tolist(), jac.tolist(), strict=True):
            self._decision[ids[i]] = (int(cluster_no[i]), ids[k], float(j))
        self._example_ids = {}
        for e, (i, k) in enumerate(zip(dropped[:MAX_EXAMPLES].tolist(), kept[dropped][:MAX_EXAMPLES].tolist(),
                                       strict=True)):
            self._example_ids.setdefault(ids[i], e)
            self._example_ids.setdefault(ids[k], e)
        sizes = size[roots] if len(roots) else np.zeros(0, np.int64)
        self._fit_stats = {
            "rows": n, "rows_without_text": int((~valid).sum()), "candidate_pairs": candidates,
            "accepted_pairs": int(len(edges)), "clusters": int(len(roots)),
            "rows_in_clusters": int(len(clustered)), "largest_cluster": int(sizes.max()) if len(sizes) else 0,
            "size_counts": [int(((sizes >= lo) & (sizes <= (hi or sizes.max(initial=0)))).sum())
                            for lo, hi in SIZE_BINS],
            "examples": [(ids[i], ids[k], float(j)) for i, k, j in
                         zip(dropped[:MAX_EXAMPLES].tolist(), kept[dropped][:MAX_EXAMPLES].tolist(),
                             jac[:MAX_EXAMPLES].tolist(), strict=True)],
        }
        self._fitted = True

    def fits_in_rounds(self) -> bool:
        """In a pipeline run the fit is two rounds of tasks (`near_dedup_rounds`): the driver
        never holds signatures or shingle sets."""
        return True

    def summarize_unit(self, batch: pa.Table, files: UnitFitFiles) -> NearDedupUnitSummary:
        s = self.summarize(batch)
        n = len(s.ids)
        material = (s.values, s.offsets) if self.verify else \
            (s.signatures.reshape(-1), np.arange(n + 1, dtype=np.int64) * self.num_perm)
        return write_unit(files.path("bands"), files.path("rows"), s.ids, s.signatures, s.lengths, s.preferred,
                          s.tools if s.tools is not None else np.zeros(n, np.uint64), material, self.bands, self.rows)

    def fit_rounds(self, summaries: Sequence[NearDedupUnitSummary], ctx: RoundContext) -> None:
        self._fit_stats, answered = plan_and_run(summaries, ctx, Measure(self.threshold, self.verify, self.num_perm),
                                                 self.keep == "longest", self.partition_entries)
        self._answers, self._decision = Answers(ctx.folder, frozenset(answered)), {}
        self._example_ids = example_index(self._fit_stats["examples"])
        self._fitted = True

    def apply_unit(self, batch: pa.Table, unit: int) -> Outcome:
        return self.apply(batch) if self._answers is None else self._apply(batch, self._answers.for_unit(unit))

    def apply(self, batch: pa.Table) -> Outcome:
        return self._apply(batch, self._decision)

    def _apply(self, batch: pa.Table, decision: dict[str, tuple[int, str | None, float]]) -> Outcome:
        if not self._fitted:
            raise RuntimeError("NearDedupStage.apply called before fit")
        out, got, dup = cluster_columns(batch, decision, "near_dup", "jaccard")
        snippets = example_snippets(batch, self._example_ids, SCOPE_ROLES[self.scope]) if self._example_ids else {}
        stats = Tally(counts=Counter(rows=batch.num_rows, near_duplicates=int(dup.sum())), lookup={"snippets": snippets})
        kind = "exact" if self.verify else "MinHash-estimated"
        return drop_or_keep(out, dup, action=self.action, stage=self.name, reason=REASON, stats=stats,
                            details=lambda: [f"near duplicate of {got[p][1]} ({kind} Jaccard {got[p][2]:.3f} of "
                                             f"{self.shingle} {self.shingle_size}-shingles; cluster {got[p][0]})"
                                             for p in np.flatnonzero(dup).tolist()])

    def describe(self) -> dict[str, Any]:
        f, t = self._fit_stats, self.tally
        blocks: list[dict[str, Any]] = []
        if f.get("clusters"):
            blocks.append({"type": "bar", "title": "Near-duplicate clusters by size",
                           "labels": [f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi else f">={lo}")
                                      for lo, hi in SIZE_BINS], "series": {"clusters": f["size_counts"]}})
        snip = t.lookup.get("snippets", {})
        items = [{"id": i, "label": f"Jaccard {j:.3f}", "text": snip.get(i, ""), "reference": snip.get(k, ""),
                  "reference_id": k, "note": f"kept: {k}"} for i, k, j in f.get("examples", [])]
        if items:
            blocks.append({"type": "examples", "title": "Near duplicates (dropped row vs kept row)", "items": items})
        summary = {"rows": t.get("rows"), "near_duplicates": t.get("near_duplicates"), "clusters": f.get("clusters", 0),
                   "rows_in_clusters": f.get("rows_in_clusters", 0), "largest_cluster": f.get("largest_cluster", 0),
                   "candidate_pairs": f.get("candidate_pairs", 0), "accepted_pairs": f.get("accepted_pairs", 0),
                   "rows_without_text": f.get("rows_without_text", 0), "threshold": self.threshold,
                   "shingle": f"{self.shingle} x {self.shingle_size}", "num_perm": self.num_perm,
                   "bands": self.bands, "rows_per_band": self.rows, "verify": self.verify, "keep": self.keep,
                   "scope": self.scope, "action": self.action}
        return {"title": "Near duplicates (MinHash LSH)", "summary": summary, "blocks": blocks}


def _concat_sets(summaries: Sequence[NearDedupSummary]) -> tuple[np.ndarray, np.ndarray]:
    """All batches' shingle sets as one (values, offsets) pair."""
    if not summaries:
        return np.zeros(0, np.uint32), np.zeros(1, np.int64)
    values = np.concatenate([s.values for s in summaries])
    sizes = np.concatenate([np.diff(s.offsets) for s in summaries])
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return values, offsets


def _linked_pairs(keys: np.ndarray, valid: np.ndarray, similarity: Any, threshold: float) -> tuple[np.ndarray, int]:
    """(accepted pairs, number of candidate pairs checked) from the LSH band buckets
    (`dataguard.stages.near_dedup_buckets`)."""
    group, rows = shared_buckets(*bucket_entries(keys, valid))
    pairs, checked, _ = bucket_pairs(group, rows, keys.shape[0], similarity, threshold)
    return pairs, len(checked)


def snippet(text: str) -> str:
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."


def cluster_columns(batch: pa.Table, decision: dict[str, tuple[int, str | None, float]], prefix: str,
                    score: str) -> tuple[pa.Table, list[tuple[int, str | None, float] | None], np.ndarray]:
    """Add ``<prefix>_cluster``, ``<prefix>_of`` and ``<prefix>_<score>`` from the fit's
    per-id decisions (cluster, kept row or None for the kept one, similarity); returns the
    table, the decisions in row order and the mask of rows that duplicate another."""
    got = [decision.get(i) for i in batch.column("id").to_pylist()]
    of = [g[1] if g else None for g in got]
    out = set_column(batch, f"{prefix}_cluster", pa.array([g[0] if g else None for g in got], pa.int64()))
    out = set_column(out, f"{prefix}_of", pa.array(of, pa.string()))
    out = set_column(out, f"{prefix}_{score}",
                     pa.array([g[2] if g and g[1] is not None else None for g in got], pa.float32()))
    return out, got, np.array([o is not None for o in of], dtype=bool)


def example_snippets(batch: pa.Table, example_ids: dict[str, int], roles: Sequence[str]) -> dict[str, str]:
    """Short texts of the batch rows the report shows as example pairs."""
    ids = batch.column("id").to_pylist()
    wanted = [p for p, i in enumerate(ids) if i in example_ids]
    if not wanted:
        return {}
    texts = message_texts(batch.take(pa.array(wanted, pa.int64())), roles)
    return {ids[p]: snippet(t) for p, t in zip(wanted, texts, strict=True)}


def tools_keys(batch: pa.Table) -> np.ndarray:
    """Per row, a 64-bit hash of its canonical ``meta["tools"]`` (0 when it has none)."""
    metas = batch.column("meta").to_pylist() if "meta" in batch.column_names else [None] * batch.num_rows
    out = np.zeros(len(metas), np.uint64)
    for i, meta in enumerate(metas):
        key = tools_key(meta)
        if key:
            out[i] = int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                    "little") or 1
    return out
