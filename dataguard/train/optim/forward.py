"""A causal LM's SFT loss without the full logits, and what a forward returns (`ForwardOut`).

Why a module of its own: the memory of a language model's step is decided here; the tasks
(`dataguard.train.tasks`) call it from their ``forward``.

The SFT loss of a causal LM is the largest tensor of a step: (tokens x vocabulary) logits,
plus the log-softmax that cross-entropy keeps for its backward and the logits' gradient, each
~200 MB for SmolLM2 (49k vocabulary) at batch 4 x 256. `lm_loss_lean` never builds them:

- it runs the decoder for hidden states, keeps only the positions that are scored (the
  assistant tokens; a masked prompt costs nothing), and
- applies the output head and cross-entropy to ``CHUNK_TOKENS`` of them at a time under
  activation checkpointing, so the backward recomputes one chunk's logits instead of keeping
  every chunk's.

Peak memory for the loss is one chunk's logits (fp32 upcast included) instead of three full
copies; the result is the same loss and gradients as the plain path up to float rounding
(tests/test_train_forward.py). The lean path is taken only for architectures whose
``forward`` is exactly ``lm_head(decoder(...))`` (`LEAN_ARCHITECTURES`; Gemma 2/3 soft-cap
their logits, MoE models add a router loss) and only outside DistributedDataParallel, whose
gradient hooks need its own ``forward``; everything else takes the plain path, which is what
`transformers` computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from dataguard.train.optim.losses import (
    IGNORE_INDEX,
    causal_lm_weight_mass,
    normalised_share,
)

CHUNK_TOKENS = 256
# Causal LMs whose forward is logits = lm_head(decoder(...).last_hidden_state), nothing more.
LEAN_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                                "Phi3ForCausalLM", "GemmaForCausalLM", "SmolLM3ForCausalLM", "OlmoForCausalLM",
                                "Olmo2ForCausalLM", "GraniteForCausalLM"})


@dataclass
class ForwardOut:
    """``loss``: the micro-batch's share of the step loss (backward this). ``row_loss``:
    (batch,) float32, detached: classify the row's cross-entropy, sft its mean assistant-token
    loss (NaN where a row has no scored token). ``logits``: classify only, detached raw
    logits (no offsets)."""

    loss: torch.Tensor
    row_loss: torch.Tensor
    logits: torch.Tensor | None = None


def lean_parts(model: Any) -> tuple[Any, Any] | None:
    """(decoder, output head) of ``model`` when the lean loss is exact for it, else None."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper
    if type(base).__name__ not in LEAN_ARCHITECTURES:
        return None
    config = getattr(base, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    decoder = getattr(base, "model", None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if decoder is None or head is None:
        return None
    return decoder, head


def lm_loss_lean(decoder: Any, head: Any, batch: dict[str, torch.Tensor], *,
                 denominator: float | torch.Tensor | None = None,
                 chunk_tokens: int = CHUNK_TOKENS) -> ForwardOut:
    """The SFT loss from hidden states, the head applied to scored positions in checkpointed
    chunks (module docstring). Same weighting as `losses.causal_lm_loss`."""
    labels = batch["labels"]
    hidden = decoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    shift = F.pad(labels[:, 1:].to(hidden.device), (0, 1), value=IGNORE_INDEX)  # position t scores labels[t+1]
    scored = shift != IGNORE_INDEX
    rows = torch.arange(labels.shape[0], device=hidden.device).unsqueeze(1).expand_as(shift)[scored]
    targets = shift[scored]
    picked = hidden[scored]  # (scored tokens, hidden): the prompt's positions never reach the head
    token_loss = []
    for start in range(0, targets.shape[0], chunk_tokens):
        h = picked[start:start + chunk_tokens]
        t = targets[start:start + chunk_tokens]
        if torch.is_grad_enabled() and h.requires_grad:
            token_loss.append(checkpoint(_chunk_loss, head, h, t, use_reentrant=False))
        else:
            token_loss.append(_chunk_loss(head, h, t))
    tok = torch.cat(token_loss) if token_loss else hidden.new_zeros(0, dtype=torch.float32)
    n_rows = labels.shape[0]
    per_row = torch.zeros(n_rows, dtype=tok.dtype, device=tok.device).index_add(0, rows, tok)
    counts = torch.zeros(n_rows, dtype=torch.float32, device=tok.device).index_add(
        0, rows, torch.ones_like(tok, dtype=torch.float32))
    if tok.numel() == 0:  # no scored token: keep the graph so backward still runs (zero grads)
        per_row = per_row + hidden.sum().float() * 0.0
    return sft_out(per_row, counts, batch, denominator)


def _chunk_loss(head: Any, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden)
    return F.cross_entropy(logits.float(), targets, reduction="none")


def sft_out(per_row: torch.Tensor, counts: torch.Tensor, batch: dict[str, torch.Tensor],
             denominator: float | torch.Tensor | None) -> ForwardOut:
    weights = batch.get("sample_weight")
    if weights is not None:
        weights = weights.to(device=per_row.device, dtype=per_row.dtype)
    weighted = (per_row * weights).sum() if weights is not None else per_row.sum()
    if denominator is None:
        denominator = causal_lm_weight_mass(batch["labels"], batch.get("sample_weight"))
    with torch.no_grad():
        mean = per_row.detach().float() / counts.float()
        mean = torch.where(counts > 0, mean, torch.full_like(mean, math.nan))
    return ForwardOut(loss=normalised_share(weighted, denominator), row_loss=mean)
