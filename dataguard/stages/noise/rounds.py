"""Iterative re-estimation: clean, refit on the kept rows, re-estimate issues for all rows.

Round 1 is plain confident learning on out-of-fold probabilities. Each further round drops
the rows the previous round flagged from *training* (never from scoring), refits the
cross-validated classifier on the rest (`refit_probs`: kept rows out-of-fold, flagged rows
by the mean of the fold models), and re-estimates the thresholds, confident joint, noise
matrix and issue mask for every row. The idea (Northcutt et al.'s "clean then retrain")
is that mislabelled rows bias the first model towards their wrong labels.

Measured, not assumed (benchmarks/bench_label_noise.py): on 20 Newsgroups (TF-IDF) a
second round found fewer confirmed errors (52 vs 59 of 82 in the worst 151 rows; 42 vs 53
among the rows flagged); on banking77 with 10% seeded noise (features auto) detection F1
went from 0.881 to 0.878. Each round also costs one more cross-validation, so the
default stays ``rounds: 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dataguard.stages.noise import views as views_mod
from dataguard.stages.noise.confident import NoiseEstimate, within_budget

if TYPE_CHECKING:  # the stage whose estimate this is; imported for its type only (no cycle at run time)
    from dataguard.stages.noise.stage import NoiseStage


def run_rounds(y: np.ndarray, probs: np.ndarray, first: NoiseEstimate,
               refit: Callable[[np.ndarray], np.ndarray], estimate_fn: Callable[[np.ndarray], NoiseEstimate], *,
               rounds: int) -> tuple[np.ndarray, NoiseEstimate, list[dict[str, Any]]]:
    """(final probabilities, final estimate, one log entry per round that ran).

    ``refit(keep)`` returns probabilities for all rows from models trained on ``keep`` rows
    (`dataguard.stages.noise.views.refit`); ``estimate_fn`` turns probabilities into an estimate.

    Stops early when a round flags nothing (there is nothing left to clean) or flags the
    same rows as the round before (a fixed point: further rounds would repeat it).
    """
    est = first
    log = [{"round": 1, "trained_on": int(len(y)), "issues": int(est.is_issue.sum()),
            "cv_accuracy": round(float((probs.argmax(axis=1) == y).mean()), 4) if len(y) else None}]
    for r in range(2, rounds + 1):
        keep = ~est.is_issue
        if keep.all():
            break
        probs = refit(keep)
        new = estimate_fn(probs)
        log.append({"round": r, "trained_on": int(keep.sum()), "issues": int(new.is_issue.sum()),
                    "cv_accuracy": round(float((probs.argmax(axis=1) == y).mean()), 4)})
        same = np.array_equal(new.is_issue, est.is_issue)
        est = new
        if same:
            break
    return probs, est, log


def estimate_issues(stage: NoiseStage, summaries: Sequence[Any], y: np.ndarray, k: int,
                    probs: np.ndarray | None) -> tuple[np.ndarray, NoiseEstimate]:
    """The noise stage's estimate: out-of-sample probabilities from its own feature views
    when none were given, confident learning on them, the extra rounds and the flag
    budget. Records ``chosen_C``, ``round_log`` and ``budget_log`` on the stage."""
    kind, views = "", {}
    if probs is None:
        if len(y):
            kind, views = views_mod.feature_views(stage, summaries)
            stage.chosen_C, probs = views_mod.first_probs(kind, views, y, k, C=stage.C, folds=stage.folds,
                                                          seed=stage.seed, classifier=stage.classifier)
        else:
            probs = np.zeros((0, k))
    est = stage._estimate(y, probs)
    if stage.rounds > 1 and views:
        chosen = stage.chosen_C

        def refit(keep: np.ndarray) -> np.ndarray:
            return views_mod.refit(kind, views, y, k, keep, chosen, folds=stage.folds, seed=stage.seed,
                                   classifier=stage.classifier)

        probs, est, stage.round_log = run_rounds(y, probs, est, refit, lambda p: stage._estimate(y, p),
                                                 rounds=stage.rounds)
    if stage.max_flagged is not None:
        est, stage.budget_log = within_budget(est, stage.max_flagged)
    return probs, est
