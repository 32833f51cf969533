"""Semantic consistency: does the response talk about what the prompt asked?

``score`` embeds the prompt side (the user turns; system prompts are left out because a
long generic system prompt would fill the model's input window (128 word pieces by default) and say nothing about
the row) and the response side (the assistant turns) with a sentence-transformers model
and stores their cosine similarity as ``consistency_score`` (float32). Rows without user
text or without an assistant turn (e.g. labelled intents) get NaN and are never flagged.

``fit`` sees a mergeable histogram of all scores (2,000 bins over [-1, 1], so quantiles
are exact to 0.001) and sets the cut relative to the dataset's own distribution:

* ``method="mad"`` (default): cut = median - k * 1.4826 * MAD (a robust z-score of -k).
* ``method="percentile"``: cut = the given low percentile of the scores.
* ``threshold=<float>``: a fixed absolute cut, no fitting (for re-runs with a known value).

``apply`` adds ``consistency_flag`` (score < cut) and, with ``action="drop"``, rejects
flagged rows as ``low_consistency``. With ``keep_embeddings=True`` the prompt and response
vectors stay as ``prompt_embedding`` / ``response_embedding`` columns
(fixed_size_list<float32>[dim]) that later stages read back with
`dataguard.embed.embeddings_for` instead of running the model again. ``backend`` picks how
the model runs (``onnx-int8`` by default; ``torch``, ``onnx``, ``static``; see `dataguard.embed`
and the backend table of ``benchmarks/bench_consistency.py`` in the README) and
``max_seq_length`` how many tokens of each side it reads (default: the model's trained length).

Why median - 3 robust SDs: measured with all-MiniLM-L6-v2 (default backend onnx-int8, 128
tokens; fp32 torch flags 99.1 % of these pairs alike) on real rows of the project's
development data (the benchmark reads it; nothing at run time does), comparing each row's
real pair with a mismatched pair (every response shifted to the next row's prompt), via ``benchmarks/bench_consistency.py``:

    ==========================  ===  ======  =====  ==========  =====  ===========  ==========
    data                        n    real    real   mismatched  rank   real rows    mismatched
                                     median  RSD*   median      AUC    flagged k=3  flagged k=3
    ==========================  ===  ======  =====  ==========  =====  ===========  ==========
    alpaca_en_demo              999  0.709   0.156  0.039       0.998  2.2 %        97.7 %
    gpteacher toolformer 0.6    600  0.577   0.107  0.100       0.990  1.7 %        88.5 %
    glaive toolcall (ShareGPT)  300  0.677   0.121  0.051       0.994  2.0 %        95.7 %
    kto_en_demo (messages)      300  0.687   0.172  0.031       0.986  4.0 %        91.0 %
    dpo_en_demo (ShareGPT)      300  0.698   0.169  0.027       0.989  4.3 %        94.3 %
    fastchat dummy (identity)   500  0.260   0.077  0.198       0.715  0.0 %         1.2 %
    ==========================  ===  ======  =====  ==========  =====  ===========  ==========

    (* robust SD = 1.4826 x MAD; the cut is computed from the real rows' distribution.)
    Excluding FastChat, k = 2 / 2.5 flag 8-12 % / 4-7 % of the real rows for 97-100 % /
    94-99 % of the mismatched ones: k = 3 keeps the loss of real data at 2-4 % while still
    catching 89-98 % of mismatches.
    The FastChat identity set shows the limit: short canned answers ("I am Vicuna...") to
    "Who are you?" are barely closer to their own prompt than to another, so the check has
    no power there, and the relative cut then flags (almost) nothing rather than
    everything.

A fixed absolute threshold does not transfer between datasets (real pairs sit around a
median of ~0.27 in one set and ~0.7 in another), which is why the cut is relative.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.embed import DEFAULT_BACKEND, embedding_field, embeddings_for, stage_embedder, to_arrow
from dataguard.embed.settings import CONSTRAINTS as EMBEDDER
from dataguard.params import FLAG, Interval, Options
from dataguard.records import RESPONSE_ROLES, message_texts, reject_rows, set_column
from dataguard.stage import Outcome, Stage
from dataguard.tally import Tally

ACTIONS = ("flag", "drop")
METHODS = ("mad", "percentile")
REASON = "low_consistency"
N_BINS = 2000  # over [-1, 1]: bin width 0.001
EDGES = np.linspace(-1.0, 1.0, N_BINS + 1)
REPORT_BIN = 0.05
MAX_EXAMPLES = 20
SNIPPET_CHARS = 240
MAD_TO_SD = 1.4826  # MAD of a normal distribution times this is its standard deviation

PROMPT_COLUMN = "prompt_embedding"
RESPONSE_COLUMN = "response_embedding"


def score_histogram(scores: np.ndarray) -> np.ndarray:
    """Counts of the finite scores in the N_BINS fixed bins over [-1, 1]."""
    finite = scores[np.isfinite(scores)]
    idx = np.clip(((finite.astype(np.float64) + 1.0) * (N_BINS / 2.0)).astype(np.int64), 0, N_BINS - 1)
    return np.bincount(idx, minlength=N_BINS).astype(np.int64)


def histogram_quantile(counts: np.ndarray, q: float) -> float:
    """The q-quantile (0..1) of a histogram on EDGES, linear within the bin."""
    total = counts.sum()
    if total == 0:
        return math.nan
    target = q * total
    cum = np.cumsum(counts)
    b = int(np.searchsorted(cum, target, side="left"))
    b = min(b, N_BINS - 1)
    before = cum[b - 1] if b else 0
    frac = (target - before) / counts[b] if counts[b] else 0.0
    return float(EDGES[b] + frac * (EDGES[b + 1] - EDGES[b]))


def histogram_median_mad(counts: np.ndarray) -> tuple[float, float]:
    """Median and median absolute deviation from the histogram (bin centres, +-0.001)."""
    median = histogram_quantile(counts, 0.5)
    if math.isnan(median):
        return math.nan, math.nan
    centres = (EDGES[:-1] + EDGES[1:]) / 2
    dev = np.abs(centres - median)
    order = np.argsort(dev, kind="stable")
    cum = np.cumsum(counts[order])
    pos = int(np.searchsorted(cum, counts.sum() / 2.0, side="left"))
    return median, float(dev[order][min(pos, N_BINS - 1)])


class ConsistencyStage(Stage):
    """Flags rows whose response embedding is far from the prompt's, relative to the data."""

    name = "consistency"
    needs_fit = True
    constraints = {
        "action": [Options(*ACTIONS)],
        "method": [Options(*METHODS)],
        "k": [Interval(float, 0, closed="neither")],
        "percentile": [Interval(float, 0, 100, closed="neither")],
        "threshold": [Interval(float, -1, 1), None],
        "keep_embeddings": FLAG,
        **EMBEDDER,
    }
    reasons = {REASON: "the response's embedding is unusually far from its prompt's (below the fitted cut)"}

    def __init__(self, *, model: str | Path | None = None, batch_size: int = 64, action: str = "flag",
                 method: str = "mad", k: float = 3.0, percentile: float = 1.0, threshold: float | None = None,
                 keep_embeddings: bool = False, threads: int | None = None, device: str = "cpu",
                 backend: str = DEFAULT_BACKEND, max_seq_length: int | None = None) -> None:
        self.embedder = stage_embedder(model, batch_size=batch_size, threads=threads, device=device, backend=backend,
                                       max_seq_length=max_seq_length)
        self.action = action
        self.method = method
        self.k = float(k)
        self.percentile = float(percentile)
        self.threshold = None if threshold is None else float(threshold)
        self.keep_embeddings = keep_embeddings
        self.cut: float = -math.inf if threshold is None else float(threshold)
        self.median = math.nan
        self.mad = math.nan
        self._hist = np.zeros(N_BINS, dtype=np.int64)
        self._fitted = threshold is not None

    def output_columns(self) -> dict[str, pa.DataType]:
        cols: dict[str, pa.DataType] = {"consistency_score": pa.float32(), "consistency_flag": pa.bool_()}
        if self.keep_embeddings:
            dim = self.embedder.dimension
            cols[PROMPT_COLUMN] = pa.list_(pa.float32(), dim)
            cols[RESPONSE_COLUMN] = pa.list_(pa.float32(), dim)
        return cols

    def apply_adds(self) -> frozenset[str] | None:
        """``flag`` keeps every row and only adds ``consistency_flag``."""
        return frozenset(("consistency_flag",)) if self.action == "flag" else None

    def columns_read(self) -> frozenset[str]:
        return frozenset(("id", "messages", "consistency_score", PROMPT_COLUMN, RESPONSE_COLUMN))

    def score(self, batch: pa.Table) -> pa.Table:
        prompts = message_texts(batch, ("user",))
        responses = message_texts(batch, RESPONSE_ROLES)
        valid = np.array([bool(p.strip()) and bool(r.strip()) for p, r in zip(prompts, responses, strict=True)],
                         dtype=bool)
        dim = self.embedder.dimension
        n = batch.num_rows
        emb_p = np.full((n, dim), np.nan, dtype=np.float32)
        emb_r = np.full((n, dim), np.nan, dtype=np.float32)
        if valid.any():
            sub = batch.filter(pa.array(valid))
            idx = np.flatnonzero(valid)
            emb_p[idx] = embeddings_for(sub, PROMPT_COLUMN, [prompts[i] for i in idx], self.embedder)
            emb_r[idx] = embeddings_for(sub, RESPONSE_COLUMN, [responses[i] for i in idx], self.embedder)
        scores = np.einsum("ij,ij->i", emb_p, emb_r).astype(np.float32)
        scores[~valid] = np.nan
        out = set_column(batch, pa.field("consistency_score", pa.float32()), pa.array(scores, pa.float32()))
        if self.keep_embeddings:
            model_id = self.embedder.model_id
            out = set_column(out, embedding_field(PROMPT_COLUMN, dim, model_id), to_arrow(np.nan_to_num(emb_p), valid))
            out = set_column(out, embedding_field(RESPONSE_COLUMN, dim, model_id),
                              to_arrow(np.nan_to_num(emb_r), valid))
        return out

    def summarize(self, batch: pa.Table) -> np.ndarray:
        return score_histogram(_scores(batch))

    def fit(self, summaries: Sequence[np.ndarray]) -> None:
        hist = np.zeros(N_BINS, dtype=np.int64)
        for s in summaries:
            hist += s
        self._hist = hist
        self.median, self.mad = histogram_median_mad(hist)
        if self.threshold is not None:
            self.cut = self.threshold
        elif hist.sum() == 0:
            self.cut = -math.inf
        elif self.method == "mad":
            self.cut = self.median - self.k * MAD_TO_SD * self.mad
        else:
            self.cut = histogram_quantile(hist, self.percentile / 100.0)
        self._fitted = True

    def _rule(self) -> str:
        if self.threshold is not None:
            return "fixed threshold"
        if self.method == "mad":
            return f"median {self.median:.3f} - {self.k:g} x 1.4826 x MAD {self.mad:.3f}"
        return f"p{self.percentile:g} of scores"

    def apply(self, batch: pa.Table) -> Outcome:
        if not self._fitted:
            raise RuntimeError("ConsistencyStage.apply called before fit")
        scores = _scores(batch)
        with np.errstate(invalid="ignore"):
            flag = np.isfinite(scores) & (scores < self.cut)
        out = set_column(batch, pa.field("consistency_flag", pa.bool_()), pa.array(flag, pa.bool_()))
        stats = Tally(counts=Counter(rows=batch.num_rows, flagged=int(flag.sum()),
                                     no_score=int((~np.isfinite(scores)).sum())))
        stats.keep("examples", self._examples(batch, scores, flag), MAX_EXAMPLES, rank="score")
        if self.action == "drop" and flag.any():
            mask = pa.array(flag, pa.bool_())
            details = [f"prompt/response cosine {s:.3f} < cut {self.cut:.3f} ({self._rule()})" for s in scores[flag]]
            rejected = reject_rows(out, mask, self.name, REASON, details)
            return Outcome(kept=out.filter(pc.invert(mask)), rejected=rejected, stats=stats)
        return Outcome(kept=out, stats=stats)

    def _examples(self, batch: pa.Table, scores: np.ndarray, flag: np.ndarray) -> list[dict[str, Any]]:
        idx = np.flatnonzero(flag)
        idx = idx[np.argsort(scores[idx], kind="stable")][:MAX_EXAMPLES]
        if not len(idx):
            return []
        picked = batch.take(pa.array(idx))
        prompts = message_texts(picked, ("user",))
        responses = message_texts(picked, RESPONSE_ROLES)
        ids = picked.column("id").to_pylist()
        return [{"id": ids[j], "score": float(scores[i]), "text": _snippet(prompts[j]),
                 "reference": _snippet(responses[j])} for j, i in enumerate(idx.tolist())]

    def describe(self) -> dict[str, Any]:
        t = self.tally
        hist = self._hist
        nz = np.flatnonzero(hist)
        blocks: list[dict[str, Any]] = []
        if len(nz):
            per = int(round(REPORT_BIN * N_BINS / 2))
            lo = (nz[0] // per) * per
            hi = min(N_BINS, (nz[-1] // per + 1) * per)
            counts = hist[lo:hi].reshape(-1, per).sum(axis=1)
            markers = [{"label": "median", "value": round(self.median, 4)}]
            if math.isfinite(self.cut):
                markers.append({"label": "cut", "value": round(self.cut, 4)})
            blocks.append({"type": "histogram", "title": "Prompt/response cosine similarity",
                           "edges": [round(float(e), 4) for e in EDGES[lo:hi + 1:per]],
                           "series": {"rows": counts.tolist()}, "markers": markers, "x_label": "cosine"})
        if t.items("examples"):
            blocks.append({"type": "examples", "title": "Lowest-scoring flagged rows",
                           "items": [{"id": e["id"], "label": f"{e['score']:.3f}", "text": e["text"],
                                      "reference": e["reference"], "note": "prompt vs response"}
                                     for e in t.items("examples")]})
        summary = {"rows": t.get("rows"), "flagged": t.get("flagged"), "no_score": t.get("no_score"),
                   "cut": None if not math.isfinite(self.cut) else round(self.cut, 4),
                   "median": None if math.isnan(self.median) else round(self.median, 4),
                   "mad": None if math.isnan(self.mad) else round(self.mad, 4),
                   "rule": self._rule(), "action": self.action, "model": self.embedder.model_id}
        return {"title": "Prompt/response consistency", "summary": summary, "blocks": blocks}


def _scores(batch: pa.Table) -> np.ndarray:
    col = batch.column("consistency_score")
    if batch.num_rows == 0:
        return np.zeros(0, dtype=np.float32)
    return col.to_numpy().astype(np.float32, copy=False)


def _snippet(text: str) -> str:
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."


