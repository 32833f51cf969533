"""Length balance of the preference pairs a run normalised: chosen vs rejected response.

Length is the known confound of preference data: when the chosen response is usually the
longer one, a DPO policy learns "longer is better" as much as the preference itself. The
normalizer counts, over every pair it keeps, the characters of both responses: the share of
pairs whose chosen response is longer, the length ratio chosen / rejected (its median, from
an exact histogram in thousandths, capped at 100), and the difference chosen - rejected in
signed bins. Characters, not tokens: the normalizer has no tokenizer, and the balance
should not depend on which one a later stage uses. Runs without pairs record nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.records import pair_responses
from dataguard.tally import Tally
from dataguard.text.histogram import IntHistogram

BIG = 10**12
DIFF_EDGES = np.array([-BIG, -4000, -2000, -1000, -500, -250, -100, -25, 0, 1, 26, 101, 251, 501, 1001, 2001, 4001,
                       BIG], dtype=np.int64)
DIFF_LABELS = ["< -4000", "-4000..-2001", "-2000..-1001", "-1000..-501", "-500..-251", "-250..-101", "-100..-26",
               "-25..-1", "0", "1..25", "26..100", "101..250", "251..500", "501..1000", "1001..2000", "2001..4000",
               "> 4000"]
RATIO_SCALE = 1000
RATIO_CAP = 100


def tally_pairs(kept: pa.Table, stats: Tally) -> None:
    """Count the length balance of the pairs among ``kept`` into ``stats``."""
    responses = [p for p in pair_responses(kept) if p is not None]
    if not responses:
        return
    chosen = np.array([len(c) for c, _ in responses], dtype=np.int64)
    rejected = np.array([len(r) for _, r in responses], dtype=np.int64)
    stats.add("pairs", len(responses))
    stats.add("pairs_chosen_longer", int((chosen > rejected).sum()))
    stats.add("pairs_same_length", int((chosen == rejected).sum()))
    stats.hist("pair_length_diff", np.histogram(chosen - rejected, DIFF_EDGES)[0].astype(np.int64))
    ratio = np.minimum(chosen / np.maximum(rejected, 1), RATIO_CAP)
    stats.put("pair_length_ratio", IntHistogram.of(np.round(ratio * RATIO_SCALE).astype(np.int64)))


def describe_balance(t: Tally) -> dict[str, Any] | None:
    """The pairs part of the normalizer's description (None in a run without pairs)."""
    n = t.get("pairs")
    if not n:
        return None
    ratio = t.parts["pair_length_ratio"]
    quantiles = {q: round(ratio.percentile(q) / RATIO_SCALE, 3) for q in (10, 25, 50, 75, 90)}
    summary = {"pairs": n, "chosen_longer": t.get("pairs_chosen_longer"),
               "share_chosen_longer": round(t.get("pairs_chosen_longer") / n, 4),
               "same_length": t.get("pairs_same_length"), "median_length_ratio": quantiles[50]}
    blocks: list[dict[str, Any]] = [
        {"type": "bar", "title": "Length of chosen - rejected response (characters), pairs per bin",
         "labels": DIFF_LABELS, "series": {"pairs": t.hists["pair_length_diff"].tolist()}},
        {"type": "table", "title": "Length ratio chosen / rejected (characters), quantiles",
         "columns": ["p10", "p25", "median", "p75", "p90"], "rows": [list(quantiles.values())]},
    ]
    return {"title": "Length: chosen vs rejected", "summary": summary, "blocks": blocks}
