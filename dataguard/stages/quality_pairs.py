"""The quality stage on preference pairs: the rejected response is judged by the same rules.

For a pair, the ``rejected`` side is the response side of the rejected conversation (the
assistant turns of the shared history, then the rejected response), so it compares like
for like with the ``response`` side (the chosen conversation's). It is scored only in
batches that hold pairs, into ``rejected_{score}`` columns (null for other rows), and only
when the stage scores the ``response`` side.

Outcomes of a pair whose prompt side passes:

* the chosen side fails a rule and the rejected side passes them all: ``chosen_fails_quality``
  (the pair would teach the model to prefer the worse answer);
* both sides fail: the existing reason of the chosen side's first failing rule (the pair is
  bad whichever way it is read), with the rejected side's failures added to the detail;
* only the rejected side fails: kept, and counted (``pairs_rejected_fails``). A rejected
  response that repeats itself or is stuffed with links is still an informative negative:
  it shows the model what not to produce, and dropping such pairs would remove exactly the
  preferences that are easiest to learn.

A rejected side too long to score is ``text_too_long``, as any other side.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.records import rejected_texts, set_column
from dataguard.stages.quality_rules import HIST_EDGES, HIST_SCORES, TOO_LONG
from dataguard.tally import Tally

SIDE = "rejected"
REASON = "chosen_fails_quality"
MEANING = "a preference pair whose chosen response fails a quality rule that its rejected response passes"
OUTCOMES = ("both pass", "only rejected fails", "only chosen fails", "both fail")
BALANCE = {1: "chosen", 0: "tie", -1: "rejected"}


def rejected_side(batch: pa.Table) -> tuple[list[int], list[str]]:
    """(rows that are pairs, the response side of each one's rejected conversation)."""
    rejected = rejected_texts(batch)
    rows = [i for i, r in enumerate(rejected) if r is not None]
    if not rows:
        return [], []
    texts = []
    for i, msgs in zip(rows, batch.column("messages").take(pa.array(rows)).to_pylist(), strict=True):
        history = [m["content"] for m in (msgs or [])[:-1] if m["role"] == "assistant" and m["content"]]
        texts.append("\n".join(history + ([rejected[i]] if rejected[i] else [])))
    return rows, texts


def score_rejected(stage: Any, batch: pa.Table) -> pa.Table:
    """``batch`` with the ``rejected_{score}`` columns, when it holds pairs (else unchanged)."""
    rows, texts = rejected_side(batch) if "response" in stage.sides else ([], [])
    if not rows:
        return batch
    scores = stage.side_scores(texts)
    scored = np.zeros(batch.num_rows, dtype=bool)
    scored[rows] = ~np.isnan(scores["char_repeat_ratio"])
    for name, typ in stage._score_names():
        full = np.zeros(batch.num_rows, dtype=typ.to_pandas_dtype())
        full[rows] = np.nan_to_num(scores[name]).astype(full.dtype, copy=False)
        batch = set_column(batch, pa.field(f"{SIDE}_{name}", typ), pa.array(full, typ, mask=~scored))
    return batch


def judge_pairs(stage: Any, batch: pa.Table, first_reason: list[str | None], details: list[list[str]],
                stats: Tally) -> None:
    """Apply the rules to the rejected side of every pair and settle each pair's outcome
    (module docstring) in ``first_reason``/``details``; count the outcomes in ``stats``."""
    if f"{SIDE}_char_repeat_ratio" not in batch.column_names:
        return
    rows, _ = rejected_side(batch)
    if not rows:
        return
    fails: dict[int, list[str]] = {i: [] for i in rows}
    scored = ~np.isnan(batch.column(f"{SIDE}_char_repeat_ratio").to_numpy(zero_copy_only=False).astype(float))
    gate = batch.column(f"{SIDE}_gopher_words").to_numpy(zero_copy_only=False).astype(float) >= stage.gopher_min_words
    for _, score, thr, op, gated in stage._rules():
        vals = batch.column(f"{SIDE}_{score}").to_numpy(zero_copy_only=False).astype(float)
        fail = (vals >= thr) if op == ">=" else (vals > thr)
        if gated:
            fail &= gate
        for i in np.flatnonzero(fail).tolist():
            shown = f"{int(vals[i])}" if score == "url_count" else f"{float(vals[i]):.3f}"
            fails[i].append(f"{SIDE} {score}={shown} {op} {thr:g}")
    outcomes = []
    for i in rows:
        if not scored[i]:
            details[i].append(f"{SIDE} text not scored: over max_text_bytes {stage.max_text_bytes} or out of memory")
            first_reason[i] = first_reason[i] or TOO_LONG
            outcomes.append("not scored")
            continue
        chosen_fails = any(d.startswith("response ") for d in details[i])
        prompt_fails = any(d.startswith("prompt ") for d in details[i])
        outcomes.append(OUTCOMES[2 * chosen_fails + bool(fails[i])] if not prompt_fails else "prompt fails")
        if chosen_fails and not fails[i] and not prompt_fails and first_reason[i] != TOO_LONG:
            first_reason[i] = REASON
        details[i].extend(fails[i])
    stats.count("pair_outcomes", outcomes)
    for name in HIST_SCORES:
        col = f"{SIDE}_{name}"
        if col not in batch.column_names:
            continue
        vals = batch.column(col).to_numpy(zero_copy_only=False).astype(float)[rows]
        stats.hist(col, np.histogram(np.clip(vals[~np.isnan(vals)], 0, 1), HIST_EDGES)[0].astype(np.int64))
        chosen = batch.column(f"response_{name}").to_numpy(zero_copy_only=False).astype(float)[rows]
        both = ~np.isnan(vals) & ~np.isnan(chosen)
        diff = np.sign(chosen[both] - vals[both]).astype(np.int64)  # a higher score is worse for every one
        stats.count(f"pair_higher:{name}", [BALANCE[d] for d in diff.tolist()])


def describe_pairs(stage: Any) -> dict[str, Any] | None:
    """The pairs part of the stage's description (None in a run without pairs): outcomes of
    the pairs, and per score which side of the pairs scores higher (worse)."""
    st = stage.tally
    outcomes = st.counters.get("pair_outcomes")
    if not outcomes:
        return None
    labels = [o for o in (*OUTCOMES, "prompt fails", "not scored") if outcomes.get(o) or o in OUTCOMES]
    higher = [[name, *(st.counters.get(f"pair_higher:{name}", {}).get(k, 0) for k in BALANCE.values())]
              for name in HIST_SCORES if f"pair_higher:{name}" in st.counters]
    summary = {"pairs": sum(outcomes.values()), f"rejected_{REASON}": outcomes.get("only chosen fails", 0),
               "pairs_rejected_fails_kept": outcomes.get("only rejected fails", 0),
               "pairs_both_fail": outcomes.get("both fail", 0)}
    blocks: list[dict[str, Any]] = [
        {"type": "bar", "title": "Quality rules on both responses of each pair", "labels": labels,
         "series": {"pairs": [outcomes.get(o, 0) for o in labels]}},
        {"type": "table", "title": "Which response scores higher (worse), pair by pair",
         "columns": ["score", "chosen higher", "tie", "rejected higher"], "rows": higher},
    ]
    for name in HIST_SCORES[:4]:
        key = f"{SIDE}_{name}"
        if key in st.hists and f"response_{name}" in st.hists:
            blocks.append({"type": "histogram", "title": f"{name.replace('_', ' ')}: chosen vs rejected side",
                           "edges": HIST_EDGES.round(2).tolist(), "x_label": name,
                           "series": {"chosen (all rows)": st.hists[f"response_{name}"].tolist(),
                                      "rejected": st.hists[key].tolist()}})
    return {"title": "Quality: chosen vs rejected", "summary": summary, "blocks": blocks}
