"""Fault injection: rehearse a divergence on purpose (config ``faults:`` or the API).

A fault fires once, at the optimizer step it names (1-based, the step being computed):

- ``nan_loss`` / ``inf_loss``: the loss of that step's micro-batches is multiplied by NaN /
  replaced by +inf before backward (so every gradient is non-finite too);
- ``nan_grad``: after backward, one layer's gradients (``layer``: a monitor layer name such
  as ``layers.0``; default: the first layer) are filled with NaN;
- ``lr_spike``: from that step on, every group's lr is multiplied by ``factor`` (default
  100) until the guard rolls back (a rollback restores the last good optimizer state, which
  clears the spike);
- ``garbage_batch``: the step's input ids are replaced by random tokens (a generator seeded
  by the step, so the run's own RNG is untouched).

Fired faults are part of the guard's state (saved with a checkpoint), so a resumed run or a
rolled-back one does not fire them again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

KINDS = ("nan_loss", "inf_loss", "nan_grad", "lr_spike", "garbage_batch")


@dataclass(frozen=True)
class Fault:
    step: int
    kind: str
    layer: str | None = None
    factor: float | None = None

    def key(self) -> str:
        return f"{self.step}:{self.kind}:{self.layer or ''}"

    def describe(self) -> str:
        extra = f" layer {self.layer}" if self.layer else ""
        if self.kind == "lr_spike":
            extra += f" x{self.factor or 100.0:g}"
        return f"injected {self.kind}{extra}"


class FaultPlan:
    """The faults of a run, by step; ``fired`` keys are not fired again. ``lr_spike`` is the lr
    factor of the spikes fired so far (until a rollback), saved with the fired keys."""

    def __init__(self, faults: Iterable[Mapping[str, Any] | Fault] = ()) -> None:
        self.faults: list[Fault] = []
        for f in faults:
            if isinstance(f, Fault):
                self.faults.append(f)
                continue
            if f["kind"] not in KINDS:
                raise ValueError(f"unknown fault kind {f['kind']!r} (expected one of: {', '.join(KINDS)})")
            self.faults.append(Fault(int(f["step"]), str(f["kind"]), f.get("layer"), f.get("factor")))
        self.fired: set[str] = set()
        self.lr_spike = 1.0

    def __bool__(self) -> bool:
        return bool(self.faults)

    def due(self, step: int) -> list[Fault]:
        """Faults for ``step`` not fired yet (marks them fired; a spike's factor takes effect)."""
        out = [f for f in self.faults if f.step == step and f.key() not in self.fired]
        self.fired.update(f.key() for f in out)
        for f in out:
            if f.kind == "lr_spike":
                self.lr_spike *= float(f.factor or 100.0)
        return out

    def rolled_back(self) -> None:
        """The spike lived in the optimizer state a rollback just replaced."""
        self.lr_spike = 1.0

    def state_dict(self) -> dict[str, Any]:
        return {"fired": sorted(self.fired), "lr_spike": self.lr_spike}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.fired = set(state.get("fired", []))
        self.lr_spike = float(state.get("lr_spike", 1.0))


def poison_loss(loss: torch.Tensor, faults: Sequence[Fault]) -> torch.Tensor:
    for f in faults:
        if f.kind == "nan_loss":
            loss = loss * float("nan")
        elif f.kind == "inf_loss":
            loss = loss + float("inf")
    return loss


def garbage_batch(batch: dict[str, torch.Tensor], vocab_size: int, step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1_000_003 * step + 17)
    ids = batch["input_ids"]
    noise = torch.randint(0, max(int(vocab_size), 2), tuple(ids.shape), generator=gen).to(ids.device)
    out = dict(batch)
    out["input_ids"] = torch.where(batch["attention_mask"].bool(), noise, ids)
    if "labels" in out and out["labels"].dim() == 2:  # sft: learn the garbage
        out["labels"] = torch.where(out["labels"] != -100, out["input_ids"], out["labels"])
    return out


def poison_grads(layers: Mapping[str, list[torch.nn.Parameter]], layer: str | None) -> str:
    """Fill ``layer``'s gradients with NaN; returns the layer name used."""
    name = layer if layer in layers else next(iter(layers))
    for p in layers[name]:
        if p.grad is not None:
            p.grad.fill_(float("nan"))
    return name
