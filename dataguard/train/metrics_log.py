"""The per-step metrics writer: ``metrics.jsonl`` and, when asked and installed, TensorBoard."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dataguard.io.safe_files import open_nofollow
from dataguard.train.jsonl_log import trim_jsonl


class MetricsLog:
    """metrics.jsonl (one object per line) and, when asked and installed, TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool, *, resume_step: int,
                 warn: Callable[[str], None], enabled: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.fh: Any = None
        self.tb = None
        if not enabled:
            return
        trim_jsonl(self.path, resume_step)  # drop what a killed run logged after its last checkpoint
        self.fh = open_nofollow(self.path, "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)
            except ImportError:
                warn("tensorboard is not installed; metrics go to metrics.jsonl only")

    def write(self, record: dict[str, Any]) -> None:
        if self.fh is None:
            return
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()
        if self.tb is not None:
            step = record["step"]
            for key, value in record.items():
                tag = f"train/{key}" if not key.startswith("eval_") else f"eval/{key[5:]}"
                if key != "step" and _is_number(value):
                    self.tb.add_scalar(tag, value, step)
                elif isinstance(value, dict):  # per-layer / per-group values: one curve each
                    for sub, x in value.items():
                        if _is_number(x):
                            self.tb.add_scalar(f"{tag}/{sub}", x, step)

    def write_histograms(self, step: int, layers: dict[str, dict[str, list[float]]]) -> None:
        """Per-layer log10 |grad| histograms to TensorBoard (the JSONL copy is written elsewhere)."""
        if self.tb is None:
            return
        for layer, hist in layers.items():
            edges, counts = hist.get("edges") or [], hist.get("counts") or []
            total = float(sum(counts))
            if len(edges) != len(counts) + 1 or total <= 0:
                continue
            centers = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
            self.tb.add_histogram_raw(
                f"grad_log10/{layer}", min=float(edges[0]), max=float(edges[-1]), num=total,
                sum=sum(c * n for c, n in zip(centers, counts, strict=True)),
                sum_squares=sum(c * c * n for c, n in zip(centers, counts, strict=True)),
                bucket_limits=[float(e) for e in edges[1:]], bucket_counts=[float(n) for n in counts],
                global_step=step)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
        if self.tb is not None:
            self.tb.close()


def progress_bar(total: int, start: int) -> Any:
    """A tqdm bar over the optimizer steps, starting at ``start`` (a resume)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
