"""The long-tail stage's report: class counts before and after, weights, offsets, curriculum."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np


def describe_longtail(st: Any) -> dict[str, Any]:
    """``LongTailStage.describe``: blocks for the report (its full ``training_state()`` goes
    to the manifest's ``training`` section)."""
    if not st._fitted:
        return {"title": "Long-tail rebalancing", "summary": {"fitted": False}, "blocks": []}
    state = st.training_state()
    counts = st.counts
    after = st._after if st._after is not None else \
        Counter({c: float(e) for c, e in zip(st.classes, st.expected, strict=True)})
    after_counts = np.array([after.get(c, 0) for c in st.classes], dtype=np.float64)

    def ratio(x: np.ndarray) -> float | None:
        pos = x[x > 0]
        return float(pos.max() / pos.min()) if pos.size else None

    n_phases = len(st.phases) + 1
    phase_rows = [int(counts[st.class_phase == k].sum()) for k in range(1, n_phases + 1)]
    phase_text = "; ".join(
        f"phase {k}: {len(state['curriculum']['phase_classes'][k - 1])} new classes, "
        f"{phase_rows[k - 1]} rows" for k in range(1, n_phases + 1))
    summary = {
        "rows": int(counts.sum()) + st._unlabelled,
        "classes": len(st.classes),
        "unlabelled_rows": st._unlabelled,
        "imbalance_ratio_before": ratio(counts),
        "imbalance_ratio_after": ratio(after_counts),
        "tau": st.tau,
        "weighting": st.weighting,
        "resample": st.resample if st.resample is None or isinstance(st.resample, str) else "mapping",
        "rows_resampled_out": st.tally.get("resampled_out"),
        "rows_repeated": st.tally.get("repeated"),
        "min_weight": float(st.weights.min()) if len(st.weights) else None,
        "max_weight": float(st.weights.max()) if len(st.weights) else None,
    }
    labels = list(st.classes)
    blocks: list[dict[str, Any]] = [
        {"type": "bar", "title": "Rows per class (head first)", "labels": labels,
         "series": {"before": [int(c) for c in counts], "after": [float(c) for c in after_counts]}},
        {"type": "bar", "title": f"Per-class sample weight ({st.weighting})", "labels": labels,
         "series": {"weight": state["class_weights"]}},
        {"type": "bar", "title": f"Logit offsets tau*log(pi), tau={st.tau}", "labels": labels,
         "series": {"offset": state["logit_offsets"]}},
        {"type": "table", "title": "Classes",
         "columns": ["class", "rows", "prior", "logit_offset", "weight", "phase"],
         "rows": [[c, int(n), round(float(p), 6), None if o is None else round(o, 6), round(w, 6), int(ph)]
                  for c, n, p, o, w, ph in zip(labels, counts, state["priors"], state["logit_offsets"],
                                               state["class_weights"], state["curriculum"]["class_phase"],
                                               strict=True)]},
        {"type": "text", "title": "Curriculum",
         "text": (f"Phases by classes, most frequent first: phase 1 = the first {st.phases[0]:.0%} of "
                  f"classes with a share >= {st.head_share:g}, then the first "
                  f"{', '.join(f'{b:.0%}' for b in st.phases[1:]) or '-'}, then all; {phase_text}. "
                  f"Schedule: phase k ends at {list(st.schedule)} of the run ({st.schedule_unit}). "
                  f"In phase {n_phases} the tail classes are weighted x{st.tail_boost}. Each row's "
                  f"curriculum_phase column is the phase its class enters.")},
    ]
    # the full training_state() goes to the manifest's "training" section (see pipeline)
    return {"title": "Long-tail rebalancing", "summary": summary, "blocks": blocks}
