"""Deterministic per-row random numbers derived from row ids.

Row-local sampling decisions (resampling in `apply`) must not depend on how rows were
split into batches or on worker order. Hashing ``seed`` + id gives every row the same
uniform number wherever it is processed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

_SCALE = float(2**64)


def hash64(values: Iterable[str | None], seed: int, salt: str = "") -> np.ndarray:
    """64-bit blake2b hash of ``f"{seed}:{salt}:{value}"`` for each value (uint64)."""
    prefix = f"{seed}:{salt}:".encode()
    out = [
        int.from_bytes(hashlib.blake2b(prefix + ("" if v is None else v).encode(), digest_size=8).digest(), "little")
        for v in values
    ]
    return np.array(out, dtype=np.uint64)


def uniforms(values: Iterable[str | None], seed: int, salt: str = "") -> np.ndarray:
    """Uniform numbers in [0, 1) (float64), one per value, reproducible across runs."""
    return hash64(values, seed, salt).astype(np.float64) / _SCALE
