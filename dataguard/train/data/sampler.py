"""Which rows each micro-batch trains on: seeded shuffle, ``repeat``, curriculum phases.

One *epoch* is one pass over the expanded index list (row i appears ``repeat[i]`` times),
shuffled with a generator seeded by ``(seed, epoch)``. The order of an epoch is therefore a
pure function of the seed and the epoch number, so the sampler's whole position is
``(epoch, offset, micro_step)``: `state_dict` captures it, and a resumed run draws exactly
the batches the uninterrupted run would have drawn (no RNG object has to be pickled).

Curriculum: ``phase_multipliers[k][c]`` is the factor for class c while phase k is active;
phase k is active while progress < ``boundaries[k]`` (the last phase runs to the end).
Progress is ``optimizer_step / total_steps`` (``unit="steps"``, optimizer step =
``micro_step // grad_accum``, so a phase never changes inside an accumulation window) or
``epoch / epochs`` (``unit="epochs"``). A row whose class multiplier is 0 in the current
phase is skipped (not drawn) when the walk reaches it; other rows are drawn and their
multiplier (``last_multipliers``) multiplies their loss weight. Rows with class id < 0
(unknown class) always have multiplier 1.

Batches are always full: a batch that reaches the end of an epoch continues with the next
epoch. Iteration ends after ``total_steps * grad_accum`` micro-batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np


class SamplerError(ValueError):
    """The sampler cannot draw (no drawable rows, inconsistent curriculum)."""


class CurriculumSampler:
    """Seeded, resumable micro-batch sampler honouring ``repeat`` and a class curriculum."""

    def __init__(self, n_rows: int, repeat: Sequence[int] | np.ndarray | None = None,
                 class_ids: Sequence[int] | np.ndarray | None = None,
                 phase_multipliers: Sequence[Sequence[float]] | None = None,
                 boundaries: Sequence[float] | None = None, total_steps: int | None = None,
                 batch_size: int = 8, seed: int = 0, unit: str = "steps", *,
                 grad_accum: int = 1, epochs: int | None = None) -> None:
        if n_rows < 0 or batch_size < 1 or grad_accum < 1:
            raise SamplerError("n_rows >= 0, batch_size >= 1 and grad_accum >= 1 are required")
        if unit not in ("steps", "epochs"):
            raise SamplerError(f"unit must be 'steps' or 'epochs', got {unit!r}")
        self.n_rows = n_rows
        self.repeat = (np.ones(n_rows, dtype=np.int64) if repeat is None
                       else np.asarray(repeat, dtype=np.int64))
        if self.repeat.shape != (n_rows,) or (self.repeat < 0).any():
            raise SamplerError("repeat must hold one integer >= 0 per row")
        self.expanded = np.repeat(np.arange(n_rows, dtype=np.int64), self.repeat)
        if not len(self.expanded):
            raise SamplerError("no rows to draw (no rows, or every repeat is 0)")
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.seed = int(seed)
        self.unit = unit
        self.total_steps = total_steps
        self.epochs = epochs
        if unit == "epochs" and phase_multipliers and not epochs:
            raise SamplerError("unit='epochs' needs epochs")
        self.class_ids = None if class_ids is None else np.asarray(class_ids, dtype=np.int64)
        if self.class_ids is not None and self.class_ids.shape != (n_rows,):
            raise SamplerError("class_ids must hold one id per row")
        self.multipliers = (None if not phase_multipliers or self.class_ids is None
                            else np.asarray(phase_multipliers, dtype=np.float64))
        n_phases = 0 if self.multipliers is None else self.multipliers.shape[0]
        self.boundaries = [float(b) for b in (boundaries or [])][: max(n_phases - 1, 0)]
        if self.multipliers is not None:
            if len(self.boundaries) != n_phases - 1 or self.boundaries != sorted(self.boundaries):
                raise SamplerError(f"{n_phases} phases need {n_phases - 1} increasing boundaries, "
                                   f"got {list(boundaries or [])}")
            if self.class_ids.max(initial=-1) >= self.multipliers.shape[1]:
                raise SamplerError("a class id is beyond the curriculum's classes")
            if unit == "steps" and not total_steps:
                raise SamplerError("a curriculum in steps needs total_steps")
        self.epoch = 0
        self.offset = 0
        self.micro_step = 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1
        self.last_multipliers = np.ones(0, dtype=np.float64)
        self._row_cache: dict[int, np.ndarray] = {}

    # -- schedule -------------------------------------------------------------------------
    @property
    def epoch_size(self) -> int:
        """Draws in one full pass without curriculum filtering (= sum of repeat)."""
        return int(len(self.expanded))

    def progress(self) -> float:
        """Training progress in [0, 1] that decides the curriculum phase."""
        if self.unit == "epochs":
            return self.epoch / self.epochs if self.epochs else 0.0
        if not self.total_steps:
            return 0.0
        return (self.micro_step // self.grad_accum) / self.total_steps

    @property
    def phase(self) -> int:
        """The active curriculum phase, 0-based (0 without a curriculum)."""
        if self.multipliers is None:
            return 0
        p = self.progress()
        return next((k for k, b in enumerate(self.boundaries) if p < b), len(self.boundaries))

    def row_multipliers(self, indices: Sequence[int] | np.ndarray, phase: int | None = None) -> np.ndarray:
        """Per-row curriculum multiplier in ``phase`` (default: the active one)."""
        idx = np.asarray(indices, dtype=np.int64)
        if self.multipliers is None:
            return np.ones(len(idx), dtype=np.float64)
        row = self.multipliers[self.phase if phase is None else phase]
        cls = self.class_ids[idx]
        return np.where(cls >= 0, row[np.clip(cls, 0, None)], 1.0)

    def _phase_rows(self, phase: int) -> np.ndarray:
        """Every row's multiplier in ``phase`` (cached: the draw loop reads it per row)."""
        if phase not in self._row_cache:
            self._row_cache[phase] = self.row_multipliers(np.arange(self.n_rows), phase)
        return self._row_cache[phase]

    # -- drawing --------------------------------------------------------------------------
    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._order = self.expanded[rng.permutation(len(self.expanded))]
            self._order_epoch = self.epoch
        return self._order  # type: ignore[return-value]

    def _draw_one(self) -> tuple[int, float]:
        skipped = 0
        while True:
            order = self._epoch_order()
            if self.offset >= len(order):
                self.epoch += 1
                self.offset = 0
                continue
            i = int(order[self.offset])
            self.offset += 1
            m = 1.0 if self.multipliers is None else float(self._phase_rows(self.phase)[i])
            if m > 0.0:
                return i, m
            skipped += 1
            if skipped > 2 * len(order):
                raise SamplerError(f"no row can be drawn in curriculum phase {self.phase + 1}")

    def next_batch(self) -> tuple[list[int], np.ndarray]:
        """The next micro-batch: row indices and their curriculum multipliers."""
        drawn = [self._draw_one() for _ in range(self.batch_size)]
        self.micro_step += 1
        self.last_multipliers = np.array([m for _, m in drawn], dtype=np.float64)
        return [i for i, _ in drawn], self.last_multipliers

    def __len__(self) -> int:
        """Micro-batches left (needs total_steps)."""
        if self.total_steps is None:
            raise TypeError("a sampler without total_steps has no length")
        return max(self.total_steps * self.grad_accum - self.micro_step, 0)

    def __iter__(self) -> Iterator[list[int]]:
        while self.total_steps is None or self.micro_step < self.total_steps * self.grad_accum:
            if (self.total_steps is None and self.unit == "epochs" and self.epochs
                    and self.epoch >= self.epochs):
                return
            yield self.next_batch()[0]

    # -- resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The exact position: enough to continue with the very same batches."""
        return {"seed": self.seed, "epoch": self.epoch, "offset": self.offset, "micro_step": self.micro_step,
                "epoch_size": self.epoch_size, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, mine in (("seed", self.seed), ("epoch_size", self.epoch_size), ("batch_size", self.batch_size)):
            if key in state and state[key] != mine:
                raise SamplerError(f"cannot resume: the checkpoint's sampler has {key}={state[key]}, "
                                   f"this run has {mine} (different data or settings)")
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self.micro_step = int(state["micro_step"])


def steps_per_epoch(n_draws: int, batch_size: int, grad_accum: int = 1) -> int:
    """Optimizer steps in one epoch of ``n_draws`` draws (at least 1)."""
    return max(1, -(-n_draws // (batch_size * grad_accum)))
