"""How the frozen base model is held in memory: fp32, bf16, or 4-bit (QLoRA).

Why it matters: under LoRA the base is most of the memory and none of the training. Holding it
in bf16 halves it with no loss of what is trained (the adapters stay fp32: peft casts them up,
and the optimizer only ever sees them); 4-bit NF4 (QLoRA, Dettmers et al. 2023) quarters it
again, through bitsandbytes' CUDA kernels.

The rule, one place:

- ``precision: bf16`` with LoRA loads the base in bf16. Without LoRA every weight trains, and
  a bf16 copy as the master weights would lose updates smaller than bf16's resolution (8 bits
  of mantissa), so full fine-tuning keeps fp32 weights under bf16 autocast, as HF Trainer's
  ``bf16=True`` does.
- ``lora.quantize: 4bit`` loads the base in 4-bit NF4 with bf16 compute (double
  quantisation on). It needs CUDA and bitsandbytes; anywhere else it is refused before the
  shards are read, with one line.
- ``dataguard convert`` writes the dtype the base was loaded in (bf16 for bf16 and for 4-bit
  runs, since a merged 4-bit model is not a plain checkpoint), unless told otherwise.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import torch

from dataguard.train.tasks import get_task

QUANTIZE_CHOICES = ("none", "4bit")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class BaseDtypeError(ValueError):
    """A base-model precision this machine or this config cannot use (one line: what to do)."""


def quantize_of(lora: Mapping[str, Any] | None) -> str:
    return str((lora or {}).get("quantize") or "none")


def base_dtype(precision: str, lora: Mapping[str, Any] | None) -> torch.dtype:
    """The dtype the base model is loaded in (module docstring)."""
    if lora and (precision == "bf16" or quantize_of(lora) == "4bit"):
        return torch.bfloat16
    return torch.float32


def check_quantize(lora: Mapping[str, Any] | None, *, on_cpu: bool, task: str) -> None:
    """Refuse 4-bit QLoRA where it cannot run: off CUDA, without bitsandbytes, or for a
    classifier whose new head would be quantised too."""
    if quantize_of(lora) != "4bit":
        return
    if on_cpu:
        raise BaseDtypeError("lora.quantize: 4bit (QLoRA) needs a CUDA GPU: bitsandbytes' 4-bit kernels do not "
                             "run on this CPU; use precision: bf16 with lora for a half-size base instead")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise BaseDtypeError("lora.quantize: 4bit (QLoRA) needs bitsandbytes (pip install bitsandbytes)")
    if not get_task(task).generates:
        raise BaseDtypeError("lora.quantize: 4bit is for causal LMs (task: sft); a classifier's new head "
                             "cannot start quantised")


def quantization_config(lora: Mapping[str, Any] | None) -> Any:
    """The transformers ``BitsAndBytesConfig`` for ``lora.quantize`` (None: not quantised)."""
    if quantize_of(lora) != "4bit":
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def convert_dtype(saved_config: Mapping[str, Any], wanted: str | None = None) -> torch.dtype:
    """The dtype `convert` writes: ``wanted`` ("fp32", "bf16", "fp16") when given, else the
    dtype the run's base was loaded in."""
    if wanted not in (None, "auto"):
        if wanted not in DTYPES:
            raise BaseDtypeError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {wanted!r}")
        return DTYPES[str(wanted)]
    return base_dtype(str(saved_config.get("precision", "fp32")), saved_config.get("lora"))
