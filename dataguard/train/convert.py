"""Move weights between layouts: PEFT-prefixed or plain keys, LoRA merged into the base.

``load_state_into`` loads a state dict whose keys are either plain (``model.layers.0...``)
or PEFT-prefixed (``base_model.model.model.layers.0...``) into either a plain or a peft model;
whatever does not line up is one error naming the keys. ``convert_checkpoint`` turns a LoRA
run or checkpoint into a plain Hugging Face folder (adapter merged with ``merge_and_unload``)
that ``from_pretrained`` loads without peft.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

PEFT_PREFIX = "base_model.model."


class ConvertError(ValueError):
    """Weights that do not fit the model (the message names the keys)."""


def _strip(key: str) -> str:
    return key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key


def _canonical(key: str) -> str:
    """Key without the PEFT prefix and without peft's ``.base_layer`` indirection."""
    return _strip(key).replace(".base_layer.", ".")


def _tied_missing(model: torch.nn.Module, missing: list[str]) -> list[str]:
    """Missing keys that are not just the second name of a tied (shared) tensor."""
    params = dict(model.named_parameters(remove_duplicate=False))
    seen: dict[int, str] = {}
    for name, p in model.named_parameters():
        seen[p.data_ptr()] = name
    return [k for k in missing if not (k in params and params[k].data_ptr() in seen and seen[params[k].data_ptr()] != k)]


def load_state_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor], *, source: str = "weights",
                    strict: bool = True) -> None:
    """Load ``state`` (either key layout) into ``model`` (plain or peft), copying values."""
    target = model.state_dict()
    by_canonical = {_canonical(k): k for k in target}
    mapped: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    shape_errors: list[str] = []
    for key, value in state.items():
        dest = key if key in target else by_canonical.get(_canonical(key))
        if dest is None:
            unexpected.append(key)
            continue
        if tuple(target[dest].shape) != tuple(value.shape):
            shape_errors.append(f"{key} {tuple(value.shape)} vs {tuple(target[dest].shape)}")
            continue
        mapped[dest] = value
    missing = [k for k in target if k not in mapped]
    if hasattr(model, "peft_config") and not strict:
        missing = []
    missing = _tied_missing(model, missing)
    problems = []
    if shape_errors:
        problems.append("shape mismatch: " + ", ".join(shape_errors[:8]))
    if unexpected:
        problems.append(f"{len(unexpected)} key(s) not in the model: " + ", ".join(unexpected[:8]))
    if missing and strict:
        problems.append(f"{len(missing)} model key(s) missing from {source}: " + ", ".join(missing[:8]))
    if problems:
        raise ConvertError(f"{source} does not fit {type(model).__name__}: " + "; ".join(problems))
    with torch.no_grad():
        for dest, value in mapped.items():
            target[dest].copy_(value.to(target[dest].dtype))


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder itself, or the newest complete one of a run folder."""
    from dataguard.train.checkpoint import COMPLETE, latest_checkpoint

    path = Path(path)
    if (path / COMPLETE).is_file():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise ConvertError(f"{path}: neither a checkpoint nor a run folder with a complete checkpoint")
    return latest


def convert_checkpoint(source: str | Path, out: str | Path) -> Path:
    """Write a plain HF model folder (LoRA merged) from a run or checkpoint folder."""
    ckpt = find_checkpoint(source)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConvertError(f"{out}: exists and is not empty")
    state = json.loads((ckpt / "state.json").read_text())
    config = state.get("config", {})
    task = config.get("task", "sft")
    model = load_run_model(ckpt, task=task, model_spec=config.get("model"))
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    from dataguard.train.model import quiet_transformers

    with quiet_transformers():
        model.save_pretrained(str(out))
    tok = _tokenizer(ckpt)
    if tok is not None:
        tok.save_pretrained(str(out))
    for extra in ("label_map.json",):
        if (ckpt / extra).is_file():
            (out / extra).write_bytes((ckpt / extra).read_bytes())
    return out


def _tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        return None
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_run_model(ckpt: str | Path, *, task: str, model_spec: str | None = None) -> Any:
    """The trained model of a checkpoint: the base (rebuilt from ``model_spec`` or read from the
    adapter config) with the adapter loaded, or the full model."""
    from dataguard.train.checkpoint import load_weights
    from dataguard.train.model import apply_lora, load_model

    ckpt = Path(ckpt)
    label_map = json.loads((ckpt / "label_map.json").read_text()) if (ckpt / "label_map.json").is_file() else None
    labels = (label_map or {}).get("classes")
    if (ckpt / "adapter_config.json").is_file():
        adapter = json.loads((ckpt / "adapter_config.json").read_text())
        spec = model_spec or adapter.get("base_model_name_or_path")
        if not spec:
            raise ConvertError(f"{ckpt}: the adapter does not say which base model it belongs to")
        model, _ = load_model(task, spec, label_map=labels, num_labels=len(labels) if labels else None)
        targets = adapter.get("target_modules")
        model, _ = apply_lora(model, {"r": adapter["r"], "alpha": adapter["lora_alpha"], "dropout": 0.0,
                                      "targets": sorted(targets) if isinstance(targets, list | set) else targets},
                              task)
        load_weights(model, ckpt)
        return model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForCausalLM if task == "sft" else AutoModelForSequenceClassification
    return auto.from_pretrained(str(ckpt), local_files_only=True)
