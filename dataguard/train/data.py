"""Shards -> tokenized training examples, reading only what a pipeline wrote.

One module per job, gathered here (the runner's `dataguard.train.prepare.encode_split` encodes
through the task, `dataguard.train.tasks`):
`dataguard.train.shards` (`RunShards.open(folder)` reads ``manifest.json`` and the data
shards it lists, sha256 checked; the row weights), `dataguard.train.labels` (`LabelMap`,
the longtail stage's per-class state), `dataguard.train.encode` (`encode_sft` /
`encode_classify` turn rows into token ids and labels; `Encoded.collate` pads a micro-batch:
right padding, attention mask 0 on padding, labels -100 on padding and on every
non-assistant token for SFT). This module splits validation rows.

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
  (`dataguard.train.sampler.CurriculumSampler`).
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

import math
from typing import Any

import numpy as np

from dataguard.train.encode import (
    IGNORE_INDEX,
    Encoded,
    assistant_char_spans,
    classify_text,
    encode_classify,
    encode_sft,
    pack,
)
from dataguard.train.errors import TrainDataError
from dataguard.train.labels import LabelMap, class_vector, curriculum_schedule, curriculum_unit
from dataguard.train.shards import (
    REPEAT_COLUMN,
    WEIGHT_COLUMNS,
    RunShards,
    length_cap,
    row_repeat,
    row_weights,
    tokenizer_mismatch,
)

# Names the runner and the tests import from here; they live in the modules above.
__all__ = [
    "IGNORE_INDEX", "REPEAT_COLUMN", "WEIGHT_COLUMNS", "Encoded", "LabelMap", "RunShards",
    "TrainDataError", "assistant_char_spans", "class_vector", "classify_text", "curriculum_schedule",
    "curriculum_unit", "encode_classify", "encode_sft", "length_cap", "pack", "row_repeat",
    "row_weights", "run_split", "split_validation", "tokenizer_mismatch", "validation_sources",
]


# ------------------------------------------------------------------ validation split
def split_validation(n_rows: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded held-out split: (train indices, validation indices), both sorted. At least one
    validation row when fraction > 0 and n_rows >= 2; never every row."""
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    n_val = 0 if fraction == 0 or n_rows < 2 else min(max(1, math.floor(n_rows * fraction + 0.5)), n_rows - 1)
    perm = np.random.default_rng([seed, 0x5A11]).permutation(n_rows)
    return np.sort(perm[n_val:]).astype(np.int64), np.sort(perm[:n_val]).astype(np.int64)


def validation_sources(manifest: dict[str, Any]) -> list[str]:
    """Input (source) names the pipeline set aside for validation: a ``splits.validation``
    list in any training section, or an overlap stage's ``validation_sources``."""
    names: list[str] = []
    for state in (manifest.get("training") or {}).values():
        splits = state.get("splits") if isinstance(state, dict) else None
        if isinstance(splits, dict) and isinstance(splits.get("validation"), list):
            names += [str(s) for s in splits["validation"]]
    for stage in (manifest.get("config") or {}).get("stages") or []:
        params = stage.get("overlap") if isinstance(stage, dict) else None
        if isinstance(params, dict):
            vs = params.get("validation_sources") or []
            names += [vs] if isinstance(vs, str) else [str(s) for s in vs]
    return sorted(set(names))


def run_split(run: RunShards, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Row indices (train, validation) of a run and where the split came from: the
    pipeline's own validation sources when the manifest names some, else a seeded fraction."""
    names = validation_sources(run.manifest)
    if names and "source" in run.table.column_names:
        src = np.array([str(s) for s in run.table.column("source").to_pylist()], dtype=object)
        is_val = np.isin(src, names)
        if is_val.any() and not is_val.all():
            return (np.flatnonzero(~is_val).astype(np.int64), np.flatnonzero(is_val).astype(np.int64),
                    f"pipeline validation sources {names}")
    train, val = split_validation(run.table.num_rows, fraction, seed)
    return train, val, f"seeded held-out fraction {fraction:g} (seed {seed})"
