"""`Encoded`: tokenized rows ready for batching, and `collate`, which pads a micro-batch
(right padding, attention mask 0 on padding, labels -100 on padding and on every
non-assistant token).

Apart from the encoders (`encode`) because the task seam (`tasks/base.py`) names this type
in its signatures while `encode` reads the shards' weight rule: beside the encoders it
closed a circle, data -> tasks -> data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dataguard.train.optim.losses import IGNORE_INDEX


@dataclass
class Encoded:
    """Tokenized rows ready for batching (one entry per kept row, or per pack)."""

    input_ids: list[list[int]]
    labels: list[list[int]] | list[int]
    row_ids: list[str]
    weights: np.ndarray
    class_ids: np.ndarray | None = None
    repeat: np.ndarray | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    packed_rows: list[list[str]] | None = None
    folded_system: int = 0  # rows whose system turns were folded into the first user turn

    def __post_init__(self) -> None:
        if self.repeat is None:
            self.repeat = np.ones(len(self.input_ids), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def per_token(self) -> bool:
        """Labels per token (a causal LM's examples) rather than one class id per row."""
        return self.class_ids is None

    def n_tokens(self, indices: Sequence[int] | None = None) -> int:
        idx = range(len(self)) if indices is None else indices
        return sum(len(self.input_ids[i]) for i in idx)

    def collate(self, indices: Sequence[int], pad_id: int,
                multipliers: Sequence[float] | np.ndarray | None = None) -> dict[str, torch.Tensor]:
        """Right-padded tensors for rows ``indices``: input_ids, attention_mask (0 on padding),
        labels (-100 on padding for SFT) and sample_weight (= weight x curriculum multiplier)."""
        idx = list(indices)
        if not idx:
            raise ValueError("collate needs at least one row")
        width = max(len(self.input_ids[i]) for i in idx)
        ids = torch.full((len(idx), width), int(pad_id), dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        sft = self.per_token
        labels = torch.full((len(idx), width), IGNORE_INDEX, dtype=torch.long) if sft else None
        for r, i in enumerate(idx):
            seq = self.input_ids[i]
            ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[r, : len(seq)] = 1
            if labels is not None:
                labels[r, : len(seq)] = torch.tensor(self.labels[i], dtype=torch.long)
        if not sft:
            labels = torch.tensor([self.labels[i] for i in idx], dtype=torch.long)
        w = self.weights[idx].astype(np.float64)
        if multipliers is not None:
            w = w * np.asarray(multipliers, dtype=np.float64)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels,
                "sample_weight": torch.tensor(w, dtype=torch.float32)}
