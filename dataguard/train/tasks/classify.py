"""Sequence classification: one label per row, a new classifier head, logit adjustment."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
import torch.nn.functional as F

from dataguard.train.data.encode import encode_classify
from dataguard.train.data.encoded import Encoded
from dataguard.train.errors import TrainDataError
from dataguard.train.optim.forward import ForwardOut
from dataguard.train.optim.losses import (
    cross_entropy_weight_mass,
    logit_adjusted_cross_entropy,
    posthoc_adjust,
)
from dataguard.train.tasks.base import EvalTally, LossSettings, Task


class ClassifyTask(Task):
    """Rows' text -> a class id of the run's label map; the loss is the (logit-adjusted,
    class-weighted) cross-entropy per row, and evaluation counts rows and balanced accuracy."""

    name = "classify"
    lora_task_type = "SEQ_CLS"
    generates = False
    has_classes = True
    row_noun = "labelled"

    def check_table(self, table: pa.Table, folder: Path) -> None:
        if "label" not in table.column_names or table.column("label").null_count == table.num_rows:
            raise TrainDataError(f"{folder}: task classify needs a 'label' column with values "
                                 "(input format labelled_text, or aliases: {{your_column: label}})")

    def auto_model_class(self) -> Any:
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification

    def from_pretrained(self, path: str, *, dtype: torch.dtype, quantization: Any,
                        id2label: dict[int, str]) -> Any:
        with warnings.catch_warnings():  # "newly initialized" head: expected, it is what we train
            warnings.simplefilter("ignore")
            return self.auto_model_class().from_pretrained(
                path, local_files_only=True, dtype=dtype, num_labels=len(id2label), id2label=id2label,
                label2id={v: k for k, v in id2label.items()}, ignore_mismatched_sizes=True)

    def max_length(self, configured: int | None, manifest: dict[str, Any], tokenizer: Any,
                   warn: Callable[[str], None], context: int | None) -> int | None:
        return configured  # None: the encoder takes the tokenizer's limit, at most 512

    def encode(self, table: pa.Table, tokenizer: Any, *, max_length: int | None, label_map: Any,
               allow_empty: bool) -> Encoded:
        assert label_map is not None  # has_classes: the runner builds it from the shards
        return encode_classify(table, tokenizer, label_map, max_length, allow_empty=allow_empty)

    def weight_mass(self, batch: dict[str, torch.Tensor], class_weights: torch.Tensor | None) -> float:
        cw = class_weights.detach().cpu() if class_weights is not None else None
        return float(cross_entropy_weight_mass(batch["labels"], batch["sample_weight"], cw))

    def forward(self, model: Any, batch: dict[str, torch.Tensor], settings: LossSettings, *,
                denominator: float | torch.Tensor | None = None,
                autocast: Callable[[], AbstractContextManager[Any]] | None = None) -> ForwardOut:
        """The logit-adjusted cross-entropy (offsets only under ``logit_adjustment``), plus
        each row's plain cross-entropy and raw logits for the dynamics."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = logit_adjusted_cross_entropy(
            logits, batch["labels"], offsets=settings.offsets if settings.logit_adjustment else None,
            label_smoothing=settings.label_smoothing, class_weights=settings.class_weights,
            sample_weights=batch.get("sample_weight"), denominator=denominator)
        with torch.no_grad():
            row = F.cross_entropy(logits.detach().float(), batch["labels"], reduction="none")
        return ForwardOut(loss=loss, row_loss=row, logits=logits.detach().float())

    def eval_batch(self, model: Any, batch: dict[str, torch.Tensor], tally: EvalTally, settings: LossSettings) -> None:
        """Unweighted loss per row, and the accuracy of the balanced prediction: post-hoc
        adjusted when the model was trained without the offsets."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        rows = int(batch["labels"].shape[0])
        tally.loss_sum += float(logit_adjusted_cross_entropy(logits, batch["labels"])) * rows
        tally.items += rows
        scored = logits
        if settings.offsets is not None and not settings.logit_adjustment:
            scored = posthoc_adjust(logits, settings.offsets)
        for p, g in zip(scored.argmax(-1).tolist(), batch["labels"].tolist(), strict=True):
            tally.per_class.setdefault(g, [0, 0])
            tally.per_class[g][0] += int(p == g)
            tally.per_class[g][1] += 1
            tally.correct += int(p == g)
            tally.count += 1

    def dynamics_targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        return batch["labels"]
