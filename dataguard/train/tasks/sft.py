"""Supervised fine-tuning of a causal LM: loss on the assistant tokens of chat rows."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from dataguard.train.data.encode import encode_sft
from dataguard.train.data.encoded import Encoded
from dataguard.train.data.shards import length_cap, tokenizer_mismatch
from dataguard.train.optim.forward import ForwardOut, lean_parts, lm_loss_lean, sft_out
from dataguard.train.optim.losses import (
    IGNORE_INDEX,
    causal_lm_loss,
    causal_lm_loss_per_row,
    causal_lm_weight_mass,
)
from dataguard.train.tasks.base import EvalTally, LossSettings, Task


class SFTTask(Task):
    """Chat rows -> the tokenizer's own chat template; the loss is the weighted mean over every
    supervised (assistant) token of the step, and evaluation counts tokens."""

    name = "sft"
    lora_task_type = "CAUSAL_LM"
    generates = True
    has_classes = False
    row_noun = "SFT"

    def check_table(self, table: pa.Table, folder: Path) -> None:
        return None  # every kept row has messages (RunShards checks the column)

    def auto_model_class(self) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def from_pretrained(self, path: str, *, dtype: torch.dtype, quantization: Any,
                        id2label: dict[int, str]) -> Any:
        extra = {"quantization_config": quantization} if quantization is not None else {}
        return self.auto_model_class().from_pretrained(path, local_files_only=True, dtype=dtype, **extra)

    def max_length(self, configured: int | None, manifest: dict[str, Any], tokenizer: Any,
                   warn: Callable[[str], None], context: int | None) -> int | None:
        """The config's, else the length stage's cap (warning when another tokenizer counted
        it), else the model's context: a row longer than it is cut even when no stage ran."""
        if configured is not None:
            return configured
        cap, counted_by = length_cap(manifest)
        if cap is not None:
            mismatch = tokenizer_mismatch(counted_by, tokenizer)
            if mismatch:
                warn(mismatch)
            return cap
        if context:
            warn(f"max_length not set and no length stage ran: rows are cut at the model's context, "
                 f"{int(context)} tokens")
            return int(context)
        return None

    def encode(self, table: pa.Table, tokenizer: Any, *, max_length: int | None, label_map: Any,
               allow_empty: bool) -> Encoded:
        return encode_sft(table, tokenizer, max_length, allow_empty=allow_empty)

    def weight_mass(self, batch: dict[str, torch.Tensor], class_weights: torch.Tensor | None) -> float:
        return float(causal_lm_weight_mass(batch["labels"], batch["sample_weight"]))

    def forward(self, model: Any, batch: dict[str, torch.Tensor], settings: LossSettings, *,
                denominator: float | torch.Tensor | None = None,
                autocast: Callable[[], AbstractContextManager[Any]] | None = None) -> ForwardOut:
        """The lean chunked loss where it is exact for the model (`dataguard.train.optim.forward`),
        else the model's own forward and the plain per-token loss."""
        parts = lean_parts(model)
        if parts is not None:
            with autocast() if autocast is not None else contextlib.nullcontext():
                return lm_loss_lean(parts[0], parts[1], batch, denominator=denominator)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        tok, sup = causal_lm_loss_per_row(out.logits, batch["labels"])
        return sft_out(tok.sum(dim=1), sup.sum(dim=1), batch, denominator)

    def eval_batch(self, model: Any, batch: dict[str, torch.Tensor], tally: EvalTally, settings: LossSettings) -> None:
        """The sum of the batch's token losses and its next-token accuracy: the eval loss is
        the mean over every supervised token of the set, as the training loss is."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        pred, gold = logits[:, :-1].argmax(-1), batch["labels"][:, 1:]
        mask = gold != IGNORE_INDEX
        tally.loss_sum += float(causal_lm_loss(logits, batch["labels"], denominator=1.0))
        tally.correct += int((pred[mask] == gold[mask]).sum())
        tally.count += int(mask.sum())
        tally.items += int(mask.sum())
