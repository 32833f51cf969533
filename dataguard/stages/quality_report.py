"""The quality stage's report: rejections by first failing rule, every failure, score histograms."""

from __future__ import annotations

from collections import Counter
from typing import Any

from dataguard.stages.quality_rules import HIST_EDGES, HIST_SCORES, TOO_LONG


def describe_quality(stage: Any) -> dict[str, Any]:
    """``QualityStage.describe`` from the merged tally."""
    st = stage.tally
    rejected, failures = st.counters.get("rejected", Counter()), st.counters.get("failures", Counter())
    reasons = [r for r, *_ in stage._rules()]
    if failures.get(TOO_LONG):
        reasons.insert(0, TOO_LONG)  # only when it happened: ordinary reports stay the same
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
        series = {side: st.hists[f"{side}_{name}"].tolist() for side in stage.sides if f"{side}_{name}" in st.hists}
        if series:
            blocks.append({"type": "histogram", "title": name.replace("_", " "), "edges": HIST_EDGES.round(2).tolist(),
                           "series": series, "x_label": name,
                           "markers": ([{"label": "threshold", "value": rule_thr[name]}] if name in rule_thr else [])})
    if st.items("examples"):
        blocks.append({"type": "examples", "title": "Rejected rows (first 20)", "items": st.items("examples")})
    return {"title": "Repetition / URL quality filter", "summary": summary, "blocks": blocks}
