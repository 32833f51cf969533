"""Distribution shift between the training data and a reference set.

Measures (each with a verdict: stable / moderate / major, thresholds configurable):

* PSI per numeric column (reference quantile bins) and per categorical column;
* KL(training || reference) on the same bins;
* MMD, an RBF-kernel two-sample permutation test on bounded samples of the numeric columns
  (and of the text embeddings when ``text`` is on);
* a text domain classifier: MiniLM embeddings of bottom-k samples of training and reference
  texts, 5-fold out-of-fold ROC AUC of a logistic regression (0.5 = indistinguishable).

Because the reference's bin edges are known before the training data is read, each batch's
summary is the *exact* count of its rows per reference bin (plus min/max for the report),
which merges by addition: memory is bounded by columns x bins (x classes for resampling).

Correction (``correct``), only when the targeted column's PSI verdict is "major". One column
is corrected: ``target``, or by default the major column with the highest PSI (per-column
ratios would multiply only if the columns were independent; score columns rarely are).

- ``"importance_weights"``: column ``drift_weight`` = reference share / training share of the
  row's bin (or category) in the targeted column, clipped at ``max_weight``;
- ``"resample"``: the same ratio is the expected number of uses per row, drawn from a hash of
  (seed, id) so it is deterministic: rows drawing 0 are rejected with ``drift_resampled_out``,
  the others are kept once with an int32 ``repeat`` column (an incoming ``repeat`` is
  multiplied). With a label column (``label_column``, default the canonical ``label``) the
  draw is *within label strata*: the label distribution is kept and no class is lost (see
  `strata` for the rule). ``describe()`` reports the label PSI before and after.

``weight_column`` (e.g. ``sample_weight`` from the long-tail stage) makes the training side a
weighted distribution for every measure and for the correction ratios. Correction is skipped
(with a note) when fewer than half of the training rows fall in bins or categories that the
reference has. PSI after correction is measured on what ``apply`` emitted.

Modules: `reference` (loading, bins, samples), `params` (validation, `DriftSettings`), `state`
(what fit decides), `measure` (PSI/KL/MMD, label report), `correct` (the corrected column, its
ratios, the resampling draw), `strata` (stratified resampling), `emitted` (what apply emitted,
for PSI after correction), `describe` (report), `stage` (DriftStage, which holds the settings
and the fitted state and passes them to the helpers; no helper imports it).
"""

from __future__ import annotations

from dataguard.stages.drift.correct import MIN_SUPPORT, REASON_RESAMPLED_OUT
from dataguard.stages.drift.params import CORRECTIONS
from dataguard.stages.drift.reference import TEXT_ROLES, load_reference
from dataguard.stages.drift.stage import DriftStage

__all__ = ["CORRECTIONS", "MIN_SUPPORT", "REASON_RESAMPLED_OUT", "TEXT_ROLES", "DriftStage", "load_reference"]
