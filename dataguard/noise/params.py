"""Validation of the noise stage's parameters: one place, one message per mistake.

Every check raises `StageConfigError` whose message starts with the parameter's name (and
whose ``param`` names it), so a YAML config error points at the offending key's line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from dataguard.noise.confident import FILTERS, METHODS, RANKINGS
from dataguard.noise.crossval import CLASSIFIERS
from dataguard.noise.probs import INPUTS
from dataguard.stage import StageConfigError
from dataguard.text.features import FEATURE_CHOICES

ACTIONS = ("flag", "drop", "relabel")
TEXT_SIDES = ("prompt", "response", "full")


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _fail(param: str, message: str) -> None:
    raise StageConfigError(f"{param}: {message}" if not message.startswith(param) else message, param=param)


def check_model(features: str, classifier: Any, C: Any, folds: Any, seed: Any) -> None:
    """How out-of-sample probabilities are made."""
    if features not in FEATURE_CHOICES:
        _fail("features", f"features must be one of {FEATURE_CHOICES}, got {features!r}")
    if isinstance(classifier, str):
        if classifier not in CLASSIFIERS:
            _fail("classifier", f"classifier must be one of {CLASSIFIERS} or a scikit-learn "
                                f"estimator with predict_proba, got {classifier!r}")
    elif not (hasattr(classifier, "fit") and hasattr(classifier, "predict_proba")):
        _fail("classifier", f"classifier must have fit() and predict_proba(), got {classifier!r}")
    if C is not None and (not is_number(C) or C <= 0):
        _fail("C", f"C must be a positive number or None (choose by CV), got {C!r}")
    if not is_int(folds) or folds < 2:
        _fail("folds", f"folds must be an integer >= 2, got {folds!r}")
    if not is_int(seed) or seed < 0:
        _fail("seed", f"seed must be a non-negative integer, got {seed!r}")


def check_rule(method: str, filter_by: str, threshold: Any, rank_by: str, rounds: Any,
               max_flagged: Any, min_rows_per_class: Any) -> None:
    """Which rows are issues, how many rounds, how many may be flagged."""
    if method not in METHODS:
        _fail("method", f"method must be one of {METHODS}, got {method!r}")
    if filter_by not in FILTERS:
        _fail("filter_by", f"filter_by must be one of {FILTERS}, got {filter_by!r}")
    if not is_number(threshold) or not 0.0 < threshold <= 1.0:
        _fail("threshold", f"threshold must be in (0, 1], got {threshold!r}")
    if method == "confidence" and threshold >= 1.0:
        _fail("threshold", "threshold must be < 1 with method: confidence (it flags max probability > threshold)")
    if rank_by not in RANKINGS:
        _fail("rank_by", f"rank_by must be one of {RANKINGS}, got {rank_by!r}")
    if not is_int(rounds) or not 1 <= rounds <= 10:
        _fail("rounds", f"rounds must be an integer in [1, 10], got {rounds!r}")
    if max_flagged is not None:
        ok_int = is_int(max_flagged) and max_flagged >= 0
        ok_frac = isinstance(max_flagged, float) and math.isfinite(max_flagged) and 0.0 < max_flagged < 1.0
        if not (ok_int or ok_frac):
            _fail("max_flagged", "max_flagged must be a row count (integer >= 0), a fraction in (0, 1) of the "
                                 f"labelled rows, or None (no budget), got {max_flagged!r}")
    if not is_int(min_rows_per_class) or min_rows_per_class < 0:
        _fail("min_rows_per_class", f"min_rows_per_class must be an integer >= 0, got {min_rows_per_class!r}")


def check_inputs(probabilities: Any, inputs: Any, temperature: Any, classes: Sequence[str] | None,
                 rounds: int) -> None:
    """User-supplied probabilities or logits (a column or a .npy file)."""
    if probabilities is not None and (not isinstance(probabilities, str | os.PathLike) or not str(probabilities)):
        _fail("probabilities", f"probabilities must be a column name or a .npy path, got {probabilities!r}")
    if probabilities is not None and str(probabilities).endswith(".npy") and not os.path.isfile(probabilities):
        _fail("probabilities", f"probabilities file not found: {probabilities!r}")
    if inputs not in INPUTS:
        _fail("inputs", f"inputs must be one of {INPUTS}, got {inputs!r}")
    if inputs == "logits" and probabilities is None:
        _fail("inputs", "inputs: logits needs probabilities: <column or .npy> holding the logits")
    if not is_number(temperature) or temperature <= 0:
        _fail("temperature", f"temperature must be a positive number, got {temperature!r}")
    if temperature != 1.0 and inputs != "logits":
        _fail("temperature", "temperature applies only to logits (set inputs: logits)")
    if rounds > 1 and probabilities is not None:
        _fail("rounds", "rounds > 1 refits the cross-validated classifier, which given probabilities do not "
                        "have; use rounds: 1 with probabilities")
    if classes is not None:
        if isinstance(classes, str) or not all(isinstance(c, str) for c in classes) or len(classes) < 2:
            _fail("classes", f"classes must be a list of at least two label strings, got {classes!r}")
        if len(set(classes)) != len(classes):
            _fail("classes", "classes must not repeat a label")


def check_output(action: str, relabel_min_confidence: Any, label_column: Any, text: str,
                 embedding_column: Any, embedding_weight: Any) -> None:
    """What happens to issues, and where the stage reads its inputs."""
    if action not in ACTIONS:
        _fail("action", f"action must be one of {ACTIONS}, got {action!r}")
    if not is_number(relabel_min_confidence) or not 0.0 < relabel_min_confidence <= 1.0:
        _fail("relabel_min_confidence", f"relabel_min_confidence must be in (0, 1], got {relabel_min_confidence!r}")
    if not isinstance(label_column, str) or not label_column:
        _fail("label_column", f"label_column must be a column name, got {label_column!r}")
    if text not in TEXT_SIDES:
        _fail("text", f"text must be one of {TEXT_SIDES}, got {text!r}")
    if embedding_column is not None and not isinstance(embedding_column, str):
        _fail("embedding_column", f"embedding_column must be a column name or None, got {embedding_column!r}")
    if not is_number(embedding_weight) or embedding_weight <= 0:
        _fail("embedding_weight", f"embedding_weight must be a positive number, got {embedding_weight!r}")
