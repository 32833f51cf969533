"""Direct preference optimisation on preference pairs (Rafailov et al. 2023; TRL's DPOTrainer).

A pair is a row whose final assistant turn is the chosen response and whose ``meta`` holds
the rejected one (``meta["rejected"]``: where the normaliser keeps it for ShareGPT's DPO
shape, TRL's ``prompt``/``chosen``/``rejected`` columns and ``messages`` + ``rejected``).
Both responses are rendered after the same prompt with the tokenizer's chat template and
scored on the final assistant turn's tokens only (`encode_sft`'s ``final_turn_only``).
Earlier assistant turns are context both sides share: scoring them adds nothing to the
margin. A pair longer than ``max_length`` keeps its response and loses the start of its
prompt, the same cut on both sides (`pair_window`); SFT's keep-the-start cut left a third of
the demo's pairs at 256 tokens with no response token, a margin of zero, counted as a wrong
ranking.

The reference model is the base with the LoRA adapter switched off (peft's
``disable_adapter``), so it costs no second copy of the weights and is the same model on
resume; ``task: dpo`` therefore needs ``lora:`` (the config says so in one line). The loss of
a pair is ``-log sigmoid(beta * ((log pi(c) - log ref(c)) - (log pi(r) - log ref(r))))``
(``dpo_beta``, default 0.1 as in TRL), weighted per pair by the row weight (THE WEIGHT RULE:
one term per pair). Evaluation reports the pair loss, the reward accuracy (the share of pairs
whose chosen reward is higher) and the mean chosen / rejected rewards and their margin.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from dataguard.records import rejected_of
from dataguard.train.data.encode import encode_sft
from dataguard.train.data.encoded import Encoded
from dataguard.train.data.pair_window import fit_windows
from dataguard.train.errors import TrainDataError, TrainError
from dataguard.train.optim.forward import ForwardOut
from dataguard.train.optim.losses import IGNORE_INDEX, causal_lm_loss_per_row, normalised_share
from dataguard.train.tasks.base import EvalTally, LossSettings, Task
from dataguard.train.tasks.sft import SFTTask

log = logging.getLogger(__name__)


@dataclass
class PairEncoded:
    """Encoded preference pairs: ``chosen[i]`` and ``rejected[i]`` are the two sides of row
    ``row_ids[i]``. It offers what the runner reads of an `Encoded` (length, ids, weights,
    repeat, dropped counts, collate), so the sampler, the guard and the checkpoints need
    nothing new."""

    chosen: Encoded
    rejected: Encoded
    dropped: dict[str, int] = field(default_factory=dict)
    folded_system: int = 0
    class_ids: None = None
    packed_rows: None = None
    per_token: bool = True

    def __len__(self) -> int:
        return len(self.chosen)

    @property
    def row_ids(self) -> list[str]:
        return self.chosen.row_ids

    @property
    def weights(self) -> np.ndarray:
        return self.chosen.weights

    @property
    def repeat(self) -> np.ndarray:
        assert self.chosen.repeat is not None
        return self.chosen.repeat

    def n_tokens(self, indices: Sequence[int] | None = None) -> int:
        return self.chosen.n_tokens(indices) + self.rejected.n_tokens(indices)

    def collate(self, indices: Sequence[int], pad_id: int,
                multipliers: Sequence[float] | np.ndarray | None = None) -> dict[str, torch.Tensor]:
        """The chosen rows, then the rejected rows, right-padded to one width: ``input_ids``,
        ``attention_mask`` and ``labels`` are (2 x pairs, width); ``sample_weight`` is per pair."""
        c = self.chosen.collate(indices, pad_id, multipliers)
        r = self.rejected.collate(indices, pad_id, multipliers)
        width = max(c["input_ids"].shape[1], r["input_ids"].shape[1])
        fill = {"input_ids": int(pad_id), "attention_mask": 0, "labels": IGNORE_INDEX}
        out = {k: torch.cat([F.pad(c[k], (0, width - c[k].shape[1]), value=v),
                             F.pad(r[k], (0, width - r[k].shape[1]), value=v)]) for k, v in fill.items()}
        out["sample_weight"] = c["sample_weight"]
        return out


class DPOTask(Task):
    """Preference pairs -> the DPO loss against the adapter-free base (module docstring)."""

    name = "dpo"
    lora_task_type = "CAUSAL_LM"
    generates = True
    has_classes = False
    row_noun = "preference-pair"
    token_cache = False  # two sequences per row; the cache stores one

    def check_table(self, table: pa.Table, folder: Path) -> None:
        if "meta" not in table.column_names or not any(
                rejected_of(m) is not None for m in table.column("meta").to_pylist()):
            raise TrainDataError(f"{folder}: task dpo needs preference pairs (a rejected response per row, "
                                 "e.g. ShareGPT's chosen/rejected or TRL's prompt/chosen/rejected columns); "
                                 "these shards have none")

    def auto_model_class(self) -> Any:
        return SFTTask().auto_model_class()

    def from_pretrained(self, path: str, *, dtype: torch.dtype, quantization: Any,
                        id2label: dict[int, str]) -> Any:
        return SFTTask().from_pretrained(path, dtype=dtype, quantization=quantization, id2label=id2label)

    def max_length(self, configured: int | None, manifest: dict[str, Any], tokenizer: Any,
                   warn: Callable[[str], None], context: int | None) -> int | None:
        return SFTTask().max_length(configured, manifest, tokenizer, warn, context)

    def encode(self, table: pa.Table, tokenizer: Any, *, max_length: int | None, label_map: Any,
               allow_empty: bool) -> PairEncoded:
        """Both sides of every usable pair. Left out, and counted in ``dropped``: rows with no
        rejected response (``no_rejected_response``), an empty one (``empty_rejected``), one
        equal to the chosen response after whitespace normalisation (``identical_pair``: it
        carries no preference), and pairs one side of which SFT encoding drops (the reason,
        prefixed ``chosen_`` or ``rejected_``)."""
        dropped: Counter[str] = Counter()
        messages = table.column("messages").to_pylist()
        metas = table.column("meta").to_pylist() if "meta" in table.column_names else [None] * table.num_rows
        keep, rejected_turns = [], []
        for i, (turns, meta) in enumerate(zip(messages, metas, strict=True)):
            rejected = rejected_of(meta)
            if not turns or turns[-1].get("role") != "assistant":
                dropped["no_assistant_message"] += 1
            elif rejected is None:
                dropped["no_rejected_response"] += 1
            elif not rejected.strip():
                dropped["empty_rejected"] += 1
            elif " ".join(rejected.split()) == " ".join(str(turns[-1].get("content") or "").split()):
                dropped["identical_pair"] += 1
            else:
                keep.append(i)
                rejected_turns.append([*turns[:-1], {"role": "assistant", "content": rejected}])
        kept = table.take(pa.array(keep, pa.int64()))
        # both sides whole first: the window is fitted per pair (`pair_window`), the same for both
        chosen = encode_sft(kept, tokenizer, None, allow_empty=True, final_turn_only=True)
        # the rejected side of the pairs whose chosen side encoded: each lost pair counted once
        ids = [str(x) for x in kept.column("id").to_pylist()]
        survived = set(chosen.row_ids)
        still = [i for i, row_id in enumerate(ids) if row_id in survived]
        kept = kept.take(pa.array(still, pa.int64()))
        swapped = kept.set_column(kept.schema.get_field_index("messages"), "messages",
                                  pa.array([rejected_turns[i] for i in still], type=kept.schema.field("messages").type))
        rejected_enc = encode_sft(swapped, tokenizer, None, allow_empty=True, final_turn_only=True)
        for side, enc in (("chosen", chosen), ("rejected", rejected_enc)):
            for reason, n in enc.dropped.items():
                dropped[f"{side}_{reason}"] += n
        both = set(rejected_enc.row_ids)
        chosen, rejected_enc = _subset(chosen, both), _subset(rejected_enc, both)
        if max_length is not None:
            chosen, rejected_enc, cut = fit_windows(chosen, rejected_enc, max_length, dropped)
            if cut:
                log.info("dpo: %d pairs longer than max_length %d kept their response and lost the start of "
                         "their prompt", cut, max_length)
        pairs = PairEncoded(chosen, rejected_enc, dict(dropped), folded_system=chosen.folded_system)
        if not len(pairs) and not allow_empty:
            raise TrainDataError(f"no preference pair left to train on (dropped: {dict(dropped)})")
        return pairs

    def weight_mass(self, batch: dict[str, torch.Tensor], class_weights: torch.Tensor | None) -> float:
        return float(batch["sample_weight"].double().sum())

    def forward(self, model: Any, batch: dict[str, torch.Tensor], settings: LossSettings, *,
                denominator: float | torch.Tensor | None = None,
                autocast: Callable[[], AbstractContextManager[Any]] | None = None) -> ForwardOut:
        """The pairs' DPO loss (their share of the step's weighted mean) and each pair's loss."""
        per, _, _ = self._pair_terms(model, batch, settings.beta)
        weights = batch["sample_weight"].to(device=per.device, dtype=per.dtype)
        mass = denominator if denominator is not None else float(weights.double().sum())
        return ForwardOut(loss=normalised_share((per * weights).sum(), mass), row_loss=per.detach().float())

    def eval_batch(self, model: Any, batch: dict[str, torch.Tensor], tally: EvalTally, settings: LossSettings) -> None:
        per, chosen, rejected = self._pair_terms(model, batch, settings.beta)
        pairs = int(per.shape[0])
        tally.loss_sum += float(per.sum())
        tally.items += pairs
        tally.correct += int((chosen > rejected).sum())
        tally.count += pairs
        for key, values in (("reward_chosen", chosen), ("reward_rejected", rejected),
                            ("reward_margin", chosen - rejected)):
            tally.sums[key] = tally.sums.get(key, 0.0) + float(values.sum())

    def _pair_terms(self, model: Any, batch: dict[str, torch.Tensor], beta: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss per pair, chosen reward, rejected reward): rewards are ``beta x`` the log-ratio
        of policy to reference, detached."""
        policy = _sequence_logps(model, batch)
        with torch.no_grad(), _reference(model):
            reference = _sequence_logps(model, batch)
        ratio = policy - reference
        pairs = ratio.shape[0] // 2
        margin = beta * (ratio[:pairs] - ratio[pairs:])
        per = -F.logsigmoid(margin)
        detached = beta * ratio.detach()
        return per, detached[:pairs], detached[pairs:]


def _sequence_logps(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed log-probability of each sequence's assistant tokens, (2 x pairs,) float32."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    token_loss, _ = causal_lm_loss_per_row(logits, batch["labels"])
    return -token_loss.sum(dim=1)


@contextlib.contextmanager
def _reference(model: Any) -> Iterator[None]:
    """The reference model: the same network with the LoRA adapter switched off."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if not hasattr(inner, "disable_adapter"):
        raise TrainError("task dpo needs lora: the base with the adapter disabled is the reference model")
    with inner.disable_adapter():
        yield




def _subset(enc: Encoded, row_ids: set[str]) -> Encoded:
    """The rows of ``enc`` whose id is in ``row_ids``, in order."""
    idx = [i for i, r in enumerate(enc.row_ids) if r in row_ids]
    repeat = enc.repeat if enc.repeat is not None else np.ones(len(enc), dtype=np.int64)
    return Encoded(input_ids=[enc.input_ids[i] for i in idx], labels=[enc.labels[i] for i in idx],
                   row_ids=[enc.row_ids[i] for i in idx], weights=enc.weights[idx], repeat=repeat[idx],
                   folded_system=enc.folded_system)
