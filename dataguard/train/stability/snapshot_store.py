"""Where the guard's snapshots live: host memory, or a file in the run folder.

Why it matters: a rollback target is a full copy of what the optimizer can change. Under LoRA
that is the adapter (a few MB), but a full fine-tune copies every weight: 540 MB for
SmolLM2-135M, 2 GB for a 0.5B model, once per held snapshot (the verified target and up to two
pending ones). The tool a user would otherwise pick keeps none, so the copies would be the
whole difference in peak memory.

- On a GPU, snapshots never take device memory: they are host copies, in pinned memory so the
  copy is a fast DMA.
- On a CPU the device memory *is* host memory. A snapshot larger than ``SPILL_BYTES`` goes to
  ``RUN/_guard/snapshot-<rank>-<step>.pt`` (written once, read back memory-mapped, so it sits
  in the page cache, which the kernel reclaims, not in the process). Rolling back reads it.
  Writing 540 MB every ``snapshot_every`` steps costs ~1% of a full fine-tune's step time on
  one core (`benchmarks/bench_runner.py`).
- ``guard.snapshot_in: memory | disk`` forces either.

The files are the run's own: written with ``O_EXCL | O_NOFOLLOW`` and renamed into place,
removed when their snapshot is let go, and the folder is left only when a file in it is not
one of ours.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from dataguard.io.safe_files import atomic_writer

SPILL_BYTES = 256 * 2 ** 20
SNAPSHOT_IN = ("auto", "memory", "disk")
_OURS = re.compile(r"^snapshot-\d+-\d+\.pt$")


def live_trainable(model: Any) -> dict[str, torch.Tensor]:
    """What an optimizer step can change, as the live tensors (no copies): trainable parameters
    and buffers, a tied matrix once (embed_tokens = lm_head: one copy restores both names), and
    for LoRA the adapter, not the frozen base."""
    live: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for key, value in model.state_dict(keep_vars=True).items():
        if isinstance(value, torch.nn.Parameter) and not value.requires_grad:
            continue
        where = (value.untyped_storage().data_ptr(), value.storage_offset())
        if where in seen:
            continue
        seen.add(where)
        live[key] = value.detach()
    return live


def host_copy(live: dict[str, torch.Tensor], into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Host copies of ``live`` (pinned when the tensors are on a GPU), written into ``into`` (a
    dropped snapshot's tensors) when shapes and dtypes still match."""
    if into is not None and into.keys() == live.keys() and all(
            into[k].shape == v.shape and into[k].dtype == v.dtype and into[k].device.type == "cpu"
            for k, v in live.items()):
        torch._foreach_copy_([into[k] for k in live], list(live.values()))
        return into
    out = {}
    for key, value in live.items():
        if value.device.type == "cpu":
            out[key] = value.clone()
        else:
            out[key] = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=True)
            out[key].copy_(value)
    return out


class SpillFolder:
    """Snapshot files of one process in ``RUN/_guard`` (module docstring)."""

    def __init__(self, run_dir: Path, rank: int = 0) -> None:
        self.folder = Path(run_dir) / "_guard"
        self.rank = int(rank)

    def path(self, step: int) -> Path:
        return self.folder / f"snapshot-{self.rank}-{int(step)}.pt"

    def write(self, step: int, live: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Write ``live`` for ``step`` and return it read back memory-mapped."""
        self.folder.mkdir(exist_ok=True)
        target = self.path(step)
        with atomic_writer(target, durable=False) as handle:  # scratch: a crash clears them anyway
            torch.save({k: v.contiguous() for k, v in live.items()}, handle)  # CPU storages: no copy
        return torch.load(target, mmap=True, weights_only=True, map_location="cpu")

    def release(self, step: int) -> None:
        self.path(step).unlink(missing_ok=True)  # mapped tensors stay readable until dropped

    def clear(self) -> None:
        """Remove this process's snapshot files (left by a killed run, or at the end)."""
        if not self.folder.is_dir() or self.folder.is_symlink():
            return
        for item in self.folder.iterdir():
            if _OURS.match(item.name) and item.name.startswith(f"snapshot-{self.rank}-") and not item.is_symlink():
                item.unlink(missing_ok=True)
        try:
            self.folder.rmdir()  # only when empty: anything else in it is not ours to delete
        except OSError:
            pass


def choose_place(knob: str, live: dict[str, torch.Tensor]) -> str:
    """"memory" or "disk" for ``guard.snapshot_in`` = ``knob`` and this trainable state."""
    if knob in ("memory", "disk"):
        return knob
    on_gpu = any(v.device.type != "cpu" for v in live.values())
    size = sum(v.numel() * v.element_size() for v in live.values())
    return "memory" if on_gpu or size <= SPILL_BYTES else "disk"
