"""The training data: everything between a pipeline's output folder and a collated micro-batch.

`shards` (`RunShards.open(folder)` reads ``manifest.json`` and the data shards it lists, sha256
checked; the row weights) with `manifest_schema` / `typed_json` (the manifest's typed schema),
`labels` (`LabelMap`, the longtail stage's per-class state), `split` (the validation split),
`encode` (rows -> token ids and labels), `encoded` (`Encoded`; its `collate` pads a micro-batch:
right padding, attention mask 0 on padding, labels -100 on padding and on every non-assistant
token for SFT),
`token_cache` (the encoding as memory-mapped Arrow beside the run) and `sampler` (the seeded,
resumable curriculum sampler). How a task turns rows into examples is its own
(`dataguard.train.tasks`); the names most callers need are gathered here.

THE WEIGHT RULE (how the pipeline's per-row columns become what the optimizer sees):

* ``sample_weight`` (longtail stage; default 1) and ``drift_weight`` (drift stage's
  importance weights; default 1) *multiply*: a row's base weight is
  ``sample_weight * drift_weight``. It scales the row's loss; how the scaled losses are
  normalised is the last rule below.
* ``repeat`` (resampling; int, default 1) is how many times the row is *drawn* per epoch:
  the sampler expands indices (row i appears ``repeat[i]`` times in the epoch's shuffled
  order); it never multiplies the weight, so a resampled row is not counted twice over.
  ``repeat = 0`` means the row is kept but never drawn.
* the curriculum multiplier of the row's class in the active phase (the manifest's
  ``phase_multipliers``; 0 = not yet admitted, ``tail_boost`` for the tail in the last phase)
  multiplies the base weight at collate time; rows at multiplier 0 are not drawn at all
  (`dataguard.train.data.sampler.CurriculumSampler`).
* null = the default (1): a stage writes null for rows it did not score. NaN, infinite or
  negative weights, and negative or fractional repeats, are errors at load
  (`TrainDataError` naming the row id): the run would otherwise train on garbage silently.
* the loss of an optimizer step is ``sum(w * loss) / sum(w)`` over the *whole step*: every
  micro-batch of the accumulation window on every process (classify: one term per row, w
  times the class weight of its target when ``class_balanced``; SFT: one term per
  supervised token, each carrying its row's weight, so the denominator is the weighted
  count of supervised tokens). The loop draws the step's micro-batches before the first
  backward, sums their weights (all-reduced across processes) and divides every micro-batch
  by that one total (`dataguard.train.step.draw_step`); each process's backward is scaled by
  ``grad_accum * processes`` to undo accelerate's and DDP's averaging, so unequal slices
  (``batch_size % processes != 0``) count by their size. A weight therefore means the same
  at any ``batch_size`` / ``grad_accum`` / process count: weight 10 is ten times weight 1
  (per token, for SFT), and equal weights give the plain mean of the step. The logged loss
  is this same weighted mean. A step whose weights are all 0 has loss 0 and zero gradient.

With ``packing`` (SFT only) rows are first expanded by ``repeat`` and packed in order; a pack
is one sample whose weight is the mean of its rows' weights (so every token of a pack carries
that mean: exact only when weights are uniform) and whose rows attend to each other (no
per-row attention reset).
"""

from __future__ import annotations

import importlib
from typing import Any

# Names the runner and the tests import from here, and the module of this package each lives
# in. Imported lazily: `dataguard.train.config` reads `manifest_schema` without torch.
_EXPORTS = {
    "IGNORE_INDEX": "encode", "Encoded": "encoded", "assistant_char_spans": "encode", "classify_text": "encode",
    "encode_classify": "encode", "encode_sft": "encode", "pack": "encode",
    "LabelMap": "labels", "class_vector": "labels", "curriculum_schedule": "labels", "curriculum_unit": "labels",
    "REPEAT_COLUMN": "shards", "WEIGHT_COLUMNS": "shards", "RunShards": "shards", "length_cap": "shards",
    "row_repeat": "shards", "row_weights": "shards", "tokenizer_mismatch": "shards",
    "run_split": "split", "split_validation": "split", "validation_sources": "shards",
}
__all__ = sorted([*_EXPORTS, "TrainDataError"])


def __getattr__(name: str) -> Any:
    if name == "TrainDataError":
        from dataguard.train.errors import TrainDataError

        return TrainDataError
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dataguard.train.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dataguard.train.data.{module}"), name)
