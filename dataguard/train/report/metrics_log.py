"""The per-step metrics: the step's line (`metrics_record`), its writer (``metrics.jsonl``,
TensorBoard when asked and installed, and progress lines on stderr when no terminal shows the
progress bar: CI, nohup, a pipe); and the run's closing verdict against its best evaluation
(`final_against_best`)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dataguard.io.safe_files import open_nofollow, write_atomic
from dataguard.train.report.jsonl_log import trim_jsonl
from dataguard.train.step import StepOutcome


def metrics_record(out: StepOutcome, seconds: float, scaler: Any) -> dict[str, Any]:
    """The step's metrics line (per-layer statistics on monitored steps)."""
    amp_scale = float(scaler.get_scale()) if scaler is not None else None
    record = {"step": out.step, "loss": out.loss, "lr": out.lr, "grad_norm": out.clip.total_norm,
              "clipped": out.clip.clipped, "skipped": not out.applied, "tokens": out.tokens,
              "tokens_per_s": out.tokens / max(seconds, 1e-9), "phase": out.phase,
              "amp_scale": amp_scale, "lr_groups": out.lr_groups}
    if scaler is not None:
        record["loss_scale"] = float(scaler.get_scale())
    if out.stats is not None:
        record.update(out.stats)
        record["update_ratios"] = out.ratios or {}
    return record


class MetricsLog:
    """metrics.jsonl (one object per line) and, when asked and installed, TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool, *, resume_step: int,
                 warn: Callable[[str], None], enabled: bool = True, total: int | None = None,
                 log_every: int | None = None) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.fh: Any = None
        self.tb = None
        self.lines: StepLines | None = None
        if not enabled:
            return
        if total is not None and log_every is not None and _LINES["on"] and not _is_tty(sys.stderr):
            self.lines = StepLines(total, log_every, resume_step)
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
        if self.lines is not None:
            self.lines.add(record)
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


class StepLines:
    """One line on stderr every ``log_every`` optimizer steps (and at the last): step/total,
    loss, lr, grad norm, tokens/s and ETA since the previous line; one per evaluation. For
    runs nobody watches on a terminal (CI logs, nohup.out), where a tqdm bar is one endless
    line of carriage returns."""

    def __init__(self, total: int, every: int, start_step: int) -> None:
        self.total, self.every, self.start_step = total, every, start_step
        self.started = self.last_time = time.perf_counter()
        self.tokens = 0

    def add(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        if "loss" not in record:  # an evaluation: its own line
            evals = "  ".join(f"{k[5:]} {v:.4f}" for k, v in record.items()
                              if k.startswith("eval_") and isinstance(v, int | float))
            if evals:
                _emit(f"eval  step {step}/{self.total}  {evals}")
            return
        self.tokens += int(record.get("tokens") or 0)
        if step % self.every and step != self.total:
            return
        now = time.perf_counter()
        rate = self.tokens / max(now - self.last_time, 1e-9)
        done = step - self.start_step
        eta = (now - self.started) / done * (self.total - step) if done > 0 else math.nan
        skipped = "  skipped" if record.get("skipped") else ""
        _emit(f"train step {step}/{self.total}  loss {_num(record.get('loss'), '.4f')}  "
              f"lr {_num(record.get('lr'), '.2e')}  grad-norm {_num(record.get('grad_norm'), '.3g')}  "
              f"tok/s {rate:,.0f}  eta {_duration(eta)}{skipped}")
        self.tokens, self.last_time = 0, now


_LINES = {"on": True}


@contextlib.contextmanager
def step_lines(enabled: bool) -> Iterator[None]:
    """Turn the stderr progress lines on or off for runs started inside (``--quiet``)."""
    before = _LINES["on"]
    _LINES["on"] = enabled
    try:
        yield
    finally:
        _LINES["on"] = before


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def _emit(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a closed or full stderr must not stop training
        print(line, file=sys.stderr, flush=True)


def _num(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _duration(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``42s``; ``?`` before anything was timed."""
    if not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def progress_bar(total: int, start: int) -> Any:
    """A tqdm bar over the optimizer steps, starting at ``start`` (a resume)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)


def advance_bar(bar: Any, record: dict[str, Any]) -> None:
    """One step more on the bar (None: no bar), with the step's loss, lr, grad norm and tokens/s."""
    if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}", gnorm=f"{record['grad_norm']:.3g}",
                        tok_s=f"{record['tokens_per_s']:.0f}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def final_against_best(cfg: Any, run_dir: Path, last_eval: dict[str, float] | None, best: dict[str, Any],
                       warn: Callable[[str], None]) -> None:
    """A run that ends more than ``worse_than_best`` worse than its best evaluation says so
    (terminal, run.json, page) and names the best checkpoint, which `convert` takes."""
    x = float((cfg.guard or {}).get("worse_than_best", 0.1))
    if not last_eval or best.get("metric") is None or not math.isfinite(float(best["metric"])):
        return
    final, top = float(last_eval["loss"]), float(best["metric"])
    if math.isfinite(final) and final <= top * (1.0 + x):
        return
    text = (f"the final eval loss {final:.4g} is more than {x:.0%} worse than the best {top:.4g} "
            f"({best.get('checkpoint')}); `dataguard convert` takes the best checkpoint")
    warn(text)
    path = run_dir / "run.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    summary["final_warning"] = text
    summary["notes"] = list(summary.get("notes") or []) + [text]
    write_atomic(path, json.dumps(summary, indent=1, default=str) + "\n")
