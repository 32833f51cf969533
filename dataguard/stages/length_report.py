"""The length stage's report: the cap, tokens per record before and after, outcomes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dataguard.text.histogram import IntHistogram, report_edges

# What the stage's batches count (its Tally's counts).
COUNTS = ("rows_in", "too_short", "dropped", "untruncatable", "truncated", "tokens_in", "tokens_out",
          "tokens_removed_by_truncation")


def describe_length(stage: Any) -> dict[str, Any]:
    """``LengthStage.describe``: summary numbers and blocks from the merged tally."""
    t = stage.tally
    st = SimpleNamespace(**{k: t.get(k) for k in COUNTS}, after=t.parts.get("after", IntHistogram()),
                         examples=t.items("examples"))
    removed = st.tokens_in - st.tokens_out
    summary = {
        "tokenizer": stage.tokenizer_spec or "qwen2.5",
        "cap": stage.cap,
        "percentile": stage.percentile,
        "percentile_value": stage.percentile_value,
        "factor": stage.factor,
        "max_tokens": stage.max_tokens,
        "min_tokens": stage.min_tokens,
        "action": stage.action,
        "rows_in": st.rows_in,
        "rows_too_short": st.too_short,
        "rows_dropped_too_long": st.dropped,
        "rows_untruncatable": st.untruncatable,
        "rows_truncated": st.truncated,
        "tokens_in": st.tokens_in,
        "tokens_out": st.tokens_out,
        "share_tokens_removed": round(removed / st.tokens_in, 6) if st.tokens_in else 0.0,
        "share_tokens_removed_by_truncation": (round(st.tokens_removed_by_truncation / st.tokens_in, 6)
                                               if st.tokens_in else 0.0),
    }
    blocks: list[dict[str, Any]] = []
    if stage.before.total:
        top = int(stage.before.values.max())
        edges = report_edges(top)
        markers = [{"label": "cap", "value": stage.cap}] if stage.cap is not None else []
        if stage.percentile_value is not None:
            markers.append({"label": f"p{stage.percentile:g}", "value": stage.percentile_value})
        blocks.append({
            "type": "histogram", "title": "Tokens per record", "edges": edges.tolist(),
            "series": {"before": stage.before.binned(edges), "after": st.after.binned(edges)},
            "markers": markers, "x_label": "tokens",
        })
    blocks.append({
        "type": "bar", "title": "Rows by outcome",
        "labels": ["kept unchanged", "truncated", "too_short", "too_long", "too_long_untruncatable"],
        "series": {"rows": [st.rows_in - st.truncated - st.too_short - st.dropped - st.untruncatable,
                            st.truncated, st.too_short, st.dropped, st.untruncatable]},
    })
    if st.examples:
        blocks.append({
            "type": "table", "title": "Truncated or dropped records (first 20)",
            "columns": ["id", "tokens before", "tokens after", "turns before", "turns after", "outcome"],
            "rows": [[e["id"], e["before"], e["after"], e["turns_before"], e["turns_after"],
                      e.get("reason", "truncated")] for e in st.examples],
        })
    return {"title": "Length percentile truncation", "summary": summary, "blocks": blocks}
