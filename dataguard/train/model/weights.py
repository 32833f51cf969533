"""Load a state dict whatever its key layout: plain or PEFT-prefixed, into a plain or peft model.

Keys are either plain (``model.layers.0...``) or PEFT-prefixed
(``base_model.model.model.layers.0...``); whatever does not line up is one error naming the
keys. A leaf module: checkpoints load through it, conversion builds on checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping

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
