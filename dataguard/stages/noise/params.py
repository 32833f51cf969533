"""Validation of the noise stage's parameters: one place, one message per mistake.

Each parameter's allowed values are declared once in ``CONSTRAINTS`` (checked generically
before ``__init__``); ``check_together`` holds the rules that relate parameters. Every
error names its parameter (``param``), so a YAML config error points at that key's line.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

from dataguard.embed.settings import CONSTRAINTS as EMBEDDER
from dataguard.params import (
    NAME,
    OPTIONAL_NAME,
    SEED,
    Allowed,
    Interval,
    ListOf,
    Options,
    Satisfies,
    Text,
)
from dataguard.stage import StageConfigError
from dataguard.stages.noise.confident import FILTERS, METHODS, RANKINGS
from dataguard.stages.noise.crossval import CLASSIFIERS
from dataguard.stages.noise.dynamics import SCORES as DYNAMICS_SCORES
from dataguard.stages.noise.dynamics import check_run
from dataguard.stages.noise.probs import INPUTS
from dataguard.text.features import FEATURE_CHOICES

ACTIONS = ("flag", "drop", "relabel")
TEXT_SIDES = ("prompt", "response", "full")
_CLASSIFIER = Satisfies(lambda c: hasattr(c, "fit") and hasattr(c, "predict_proba") and not isinstance(c, str),
                        "a scikit-learn estimator with fit() and predict_proba()")
_PROBABILITIES = Satisfies(lambda v: isinstance(v, str | os.PathLike) and bool(str(v)), "a column name or a .npy path")

# What each parameter may be (checked generically by `Stage.__new__`); the checks below
# only relate parameters to each other or look at files.
CONSTRAINTS: dict[str, Allowed] = {
    "features": [Options(*FEATURE_CHOICES)],
    "classifier": [Options(*CLASSIFIERS), _CLASSIFIER],
    "C": [Interval(float, 0, closed="neither"), None],
    "folds": [Interval(int, 2)],
    "seed": SEED,
    "method": [Options(*METHODS)],
    "filter_by": [Options(*FILTERS)],
    "threshold": [Interval(float, 0, 1, closed="right")],
    "rank_by": [Options(*RANKINGS)],
    "probabilities": [_PROBABILITIES, None],
    "inputs": [Options(*INPUTS, "dynamics")],
    "dynamics": [Satisfies(lambda v: isinstance(v, str | os.PathLike) and bool(str(v)), "a training run folder"),
                 ListOf(Text(blank=False), min_len=1, unique=True), None],
    "dynamics_score": [Options(*DYNAMICS_SCORES)],
    "dynamics_cut": [Options("auto"), Interval(float)],
    "temperature": [Interval(float, 0, closed="neither")],
    "classes": [ListOf(Text(), min_len=2, unique=True), None],
    "action": [Options(*ACTIONS)],
    "relabel_min_confidence": [Interval(float, 0, 1, closed="right")],
    "min_rows_per_class": [Interval(int, 0)],
    "max_flagged": [Interval(int, 0), Satisfies(lambda v: isinstance(v, float) and 0.0 < v < 1.0,
                                                "a fraction in (0, 1) of the labelled rows"), None],
    "rounds": [Interval(int, 1, 10)],
    "label_column": NAME,
    "text": [Options(*TEXT_SIDES)],
    "embedding_column": OPTIONAL_NAME,
    "embedding_weight": [Interval(float, 0, closed="neither")],
    **{k: v for k, v in EMBEDDER.items() if k != "device"},
}


def _fail(param: str, message: str) -> NoReturn:
    raise StageConfigError(f"{param}: {message}", param=param)


def _checked_run(dynamics: Any) -> dict[str, Any]:
    """The runs' dynamics metadata (`check_run`), its complaint as an error naming ``dynamics``."""
    try:
        return check_run(dynamics)
    except ValueError as exc:
        _fail("dynamics", str(exc))


def check_together(method: str, threshold: float, probabilities: Any, inputs: str, temperature: float,
                   rounds: int, dynamics: Any = None, dynamics_cut: Any = "auto") -> dict[str, Any] | None:
    """Rules between parameters, and the probabilities file's existence; with ``dynamics``
    the runs' dynamics metadata (their files are read and checked now)."""
    if inputs == "dynamics":
        if dynamics is None:
            _fail("inputs", "dynamics needs `dynamics: <training run folder>` beside it")
        if probabilities is not None:
            _fail("probabilities", "inputs: dynamics reads the run's dynamics.arrow, not probabilities")
        if rounds > 1:
            _fail("rounds", "rounds > 1 refits a cross-validated classifier; inputs: dynamics has none")
        return _checked_run(dynamics)
    meta = None
    if dynamics is not None:  # a second view beside the cross-validated one (two_views)
        if rounds > 1:
            _fail("rounds", "rounds > 1 refits the cross-validated classifier; beside a training run's dynamics "
                            "use rounds: 1")
        if dynamics_cut != "auto":
            _fail("dynamics_cut", "applies only with inputs: dynamics; beside cross-validated inputs the method "
                                  "decides how many rows are flagged")
        meta = _checked_run(dynamics)
        if meta["task"] != "classify":
            _fail("dynamics", f"beside cross-validated inputs the run must be a classify run (this one is "
                              f"{meta['task']}); an sft run goes with inputs: dynamics")
    if method == "confidence" and threshold >= 1.0:
        _fail("threshold", "must be < 1 with method: confidence (it flags max probability > threshold)")
    if probabilities is not None and str(probabilities).endswith(".npy") and not os.path.isfile(probabilities):
        _fail("probabilities", f"file not found: {probabilities!r}")
    if inputs == "logits" and probabilities is None:
        _fail("inputs", "logits needs probabilities: <column or .npy> holding the logits")
    if temperature != 1.0 and inputs != "logits":
        _fail("temperature", "applies only to logits (set inputs: logits)")
    if rounds > 1 and probabilities is not None:
        _fail("rounds", "rounds > 1 refits the cross-validated classifier, which given probabilities do not "
                        "have; use rounds: 1 with probabilities")
    return meta
