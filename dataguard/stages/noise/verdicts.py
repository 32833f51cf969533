"""The noise stage's fitted verdict per labelled row, and how ``apply`` judges a batch by them.

Split from `dataguard.stages.noise.stage` so the stage keeps its options, summarize and fit.
``fit`` (cross-validated, or from a run's dynamics in `dataguard.stages.noise.dynamics_stage`)
builds one `Verdicts`, which travels to the workers with the stage; `judge` looks each row
of a batch up by id and writes the verdict columns, the relabelled labels, the batch's
worst examples for the audit and, with ``drop``, the rejected rows and why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import reject_rows, set_column
from dataguard.stage import Outcome
from dataguard.tally import Tally

REASON = "label_issue"
MAX_EXAMPLES = 20
EXAMPLE_CHARS = 400


@dataclass(frozen=True)
class Verdicts:
    """Per labelled row, in fit order: what fit decided (rows apply does not find get nulls)."""

    ids: pa.Array                # string row ids: apply's lookup key
    given: pa.Array              # string, the label fit saw
    quality: pa.Array            # float32 label quality (low = suspicious)
    suggested: pa.Array          # string, the model's top class
    suggested_prob: np.ndarray   # float64, the model's probability of ``suggested``
    issue: pa.Array              # bool, a label issue
    relabel: pa.Array            # bool, an issue ``relabel`` would rewrite (confident enough)


def judge(v: Verdicts, batch: pa.Table, labels: pa.Array, *, action: str, label_column: str, stage: str,
          texts_of: Callable[[pa.Table], list[str]], rule: str, rank: str) -> Outcome:
    """``batch`` with the verdict columns (``labels``: its label column as strings); ``rule``
    and ``rank`` name the flagging rule and the score in rejected rows' details."""
    n = batch.num_rows
    pos = pc.index_in(batch.column("id"), value_set=v.ids) if n else pa.array([], pa.int32())
    pos = pc.if_else(pc.is_valid(labels), pos, pa.scalar(None, pa.int32()))
    quality = v.quality.take(pos)
    suggested = v.suggested.take(pos)
    issue = v.issue.take(pos)
    out = set_column(batch, "label_quality", quality)
    out = set_column(out, "suggested_label", suggested)
    out = set_column(out, "is_label_issue", issue)
    issue_np = pc.fill_null(issue, False).to_numpy(zero_copy_only=False).astype(bool)
    stats = Tally(counts=Counter(rows_in=n, labelled=int(pc.sum(pc.is_valid(pos)).as_py() or 0),
                                 issues=int(issue_np.sum())))
    if action == "relabel":
        change = pc.fill_null(v.relabel.take(pos), False)
        out = set_column(out, label_column, pc.if_else(change, suggested, labels))
        out = set_column(out, "original_label", pc.if_else(change, labels, pa.scalar(None, pa.string())))
        stats.add("relabelled", int(pc.sum(change).as_py() or 0))
    examples = worst_examples(v, batch, issue_np, pos, texts_of)
    stats.keep("examples", examples, MAX_EXAMPLES, rank=("quality", "id"))
    if action == "drop" and issue_np.any():
        picked = np.flatnonzero(issue_np)
        q = quality.to_numpy(zero_copy_only=False)[picked]
        sug = [suggested[int(i)].as_py() for i in picked]
        prob = v.suggested_prob[pos.to_numpy(zero_copy_only=False)[picked].astype(np.int64)]
        given = [labels[int(i)].as_py() for i in picked]
        details = [f"given label {g!r} has label quality {qq:.4f} ({rank}); model suggests {s!r} "
                   f"(p={p:.3f}); flagged by {rule}" for g, qq, s, p in zip(given, q, sug, prob, strict=True)]
        rejected = reject_rows(out, issue_np, stage, REASON, details)
        stats.add("dropped", len(picked))
        return Outcome(kept=out.filter(pa.array(~issue_np)), rejected=rejected, stats=stats)
    return Outcome(kept=out, stats=stats)


def worst_examples(v: Verdicts, batch: pa.Table, issue: np.ndarray, pos: pa.Array,
                   texts_of: Callable[[pa.Table], list[str]]) -> list[dict[str, Any]]:
    """A batch's worst flagged rows (lowest label quality first, then position), with text."""
    picked = np.flatnonzero(issue)
    if picked.size == 0:
        return []
    idx = pos.to_numpy(zero_copy_only=False)[picked].astype(np.int64)
    q = v.quality.to_numpy(zero_copy_only=False)[idx]
    order = np.lexsort((idx, q))[:MAX_EXAMPLES]
    rows = picked[order]
    texts = texts_of(batch.take(pa.array(rows, pa.int64())))
    out = []
    for r, i, t in zip(rows, idx[order], texts, strict=True):
        quality = v.quality[int(i)].as_py()
        out.append({"id": batch.column("id")[int(r)].as_py(), "label": v.given[int(i)].as_py(),
                    "text": t[:EXAMPLE_CHARS] + ("…" if len(t) > EXAMPLE_CHARS else ""), "quality": float(quality),
                    "note": f"suggested {v.suggested[int(i)].as_py()!r} "
                            f"(p={v.suggested_prob[int(i)]:.3f}); label quality {quality:.4f}"})
    return out
