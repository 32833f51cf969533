"""The quality stage's report: rejections by first failing rule, every failure, score histograms."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.stages.quality_pairs import REASON as PAIR_REASON
from dataguard.stages.quality_pairs import SIDE as PAIR_SIDE
from dataguard.stages.quality_pairs import describe_pairs
from dataguard.stages.quality_rules import HIST_EDGES, HIST_SCORES, MAX_EXAMPLES, SIDES, SNIPPET, TOO_LONG
from dataguard.tally import Tally
from dataguard.text.message_pieces import side_bytes, side_texts


def describe_quality(stage: Any) -> dict[str, Any]:
    """``QualityStage.describe`` from the merged tally."""
    st = stage.tally
    rejected, failures = st.counters.get("rejected", Counter()), st.counters.get("failures", Counter())
    reasons = [r for r, *_ in stage._rules()]
    if failures.get(TOO_LONG):
        reasons.insert(0, TOO_LONG)  # only when it happened: ordinary reports stay the same
    if rejected.get(PAIR_REASON):
        reasons.append(PAIR_REASON)
    reasons = list(dict.fromkeys(reasons))
    summary: dict[str, Any] = {"rows_in": st.get("rows_in"), "rows_rejected": sum(rejected.values()),
                               "gopher_min_words": stage.gopher_min_words, "sides": ",".join(stage.sides)}
    summary.update({f"rejected_{r}": rejected.get(r, 0) for r in reasons})
    blocks: list[dict[str, Any]] = [
        {"type": "bar", "title": "Rows rejected by reason (first failing rule) and rule failures",
         "labels": reasons,
         "series": {"rejected": [rejected.get(r, 0) for r in reasons],
                    "failures": [failures.get(r, 0) for r in reasons]}},
        {"type": "table", "title": "Rules", "columns": ["reason", "score", "reject if", "threshold"],
         "rows": [[r, s, op, t] for r, s, t, op, _ in stage._rules()]},
    ]
    rule_thr = {score: thr for _, score, thr, _, _ in stage._rules()}
    for name in HIST_SCORES:
        series = {side: st.hists[f"{side}_{name}"].tolist() for side in (*stage.sides, PAIR_SIDE)
                  if f"{side}_{name}" in st.hists}
        if series:
            blocks.append({"type": "histogram", "title": name.replace("_", " "), "edges": HIST_EDGES.round(2).tolist(),
                           "series": series, "x_label": name,
                           "markers": ([{"label": "threshold", "value": rule_thr[name]}] if name in rule_thr else [])})
    if st.items("examples"):
        blocks.append({"type": "examples", "title": "Rejected rows (first 20)", "items": st.items("examples")})
    out: dict[str, Any] = {"title": "Repetition / URL quality filter", "summary": summary, "blocks": blocks}
    pairs = describe_pairs(stage)
    if pairs is not None:  # preference runs only: other reports stay the same
        out["pairs"] = pairs
    return out


def reject_unscored(batch: pa.Table, sides: Sequence[str], max_text_bytes: int, first_reason: list[str | None],
                    details: list[list[str]], stats: Tally) -> None:
    """Rows with a side that was not scored (null scores: too long, or out of memory) fail
    first, as ``text_too_long``; the rules cannot judge them."""
    for side in sides:
        unscored = np.isnan(batch.column(f"{side}_char_repeat_ratio").to_numpy(zero_copy_only=False))
        rows = np.flatnonzero(unscored).tolist()
        if not rows:
            continue
        sizes = side_bytes(batch.take(rows), SIDES[side])
        for i, size in zip(rows, sizes.tolist(), strict=True):
            why = (f"{size} bytes > max_text_bytes {max_text_bytes}" if size > max_text_bytes
                   else f"{size} bytes, out of memory")
            details[i].append(f"{side} text not scored: {why}")
            stats.count("failures", (TOO_LONG,))
            if first_reason[i] is None:
                first_reason[i] = TOO_LONG


def reject_examples(batch: pa.Table, idx: list[int], first_reason: list[str | None], details: list[list[str]],
                    sides: Sequence[str]) -> list[dict[str, Any]]:
    """The first rejected rows, with the side that failed first as their text."""
    texts = {side: side_texts(batch.take(idx[:MAX_EXAMPLES]), SIDES[side]).to_pylist() for side in sides}
    ids = batch.column("id").take(idx[:MAX_EXAMPLES]).to_pylist()
    examples = []
    for j, i in enumerate(idx[:MAX_EXAMPLES]):
        side = details[i][0].split(" ", 1)[0]
        examples.append({"id": ids[j], "label": first_reason[i],
                         "text": (texts.get(side) or [""] * len(ids))[j][:SNIPPET],
                         "note": "; ".join(details[i])})
    return examples
