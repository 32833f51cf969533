"""Every random generator's state, captured into a checkpoint and restored on resume.

Kept as tensors and plain values only, so ``torch.load(weights_only=True)`` reads it back.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch CPU (and CUDA when present) generator states, weights_only-safe."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Put back what `capture_rng` took."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # as many devices as both layouts have
        saved = list(state["cuda"])
        for device in range(min(len(saved), torch.cuda.device_count())):
            torch.cuda.set_rng_state(saved[device].cpu(), device)
