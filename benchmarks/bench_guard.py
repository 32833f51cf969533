"""What the stability guard and the monitor cost, and what they buy.

Run (from the repo root, offline; CPU by default, a few minutes on a shared 2-core machine):

    python benchmarks/bench_guard.py [--device cpu|cuda|auto] [--steps 40] [--div-steps 80]

Data: ``sample_data/alpaca_en_demo.json`` through an empty pipeline, model ``tiny-causal-lm``
(2 layers, hidden 64), fp32, batch 4, ``max_length`` 96, one torch thread (``--threads``). Everything goes under
``benchmarks/results/bench_guard/`` (git-ignored); the table is printed and written to
``benchmarks/results/bench_guard/results.md``.

1. Overhead per optimizer step (mean and median process CPU time of the steps after the first five,
   timed with the runner's ``on_step`` hook: CPU time, not wall time, because the wall time
   of a shared machine swings by 2x between runs; checkpoints and evaluation are off for the timed steps):
   ``plain`` = guard off and the monitor off (``monitor_every`` / ``histogram_every`` beyond
   the run), against ``monitor+guard`` = the defaults (``monitor_every: 10``, guard on). Run
   twice, interleaved, to show the noise of a shared machine. Goal: <= 5%.
2. Divergence: the lr is multiplied by 100 from step ``--spike-step`` on (the ``lr_spike``
   fault). ``clean`` = no fault; ``guarded`` = guard on (defaults except ``snapshot_every:
   10``, ``anomaly_window: 10``, ``recovery_steps: 20`` for a short run); ``clip only`` =
   guard off: the runner still clips (global max_norm 1.0 + the layer-wise rules) and skips
   non-finite steps, like an HF-style loop. The fault is the same in both faulty arms; only
   the guard's rollback can clear it (it restores the optimizer state the spike lives in).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dataguard.io.readers import InputSpec  # noqa: E402
from dataguard.pipeline import Pipeline  # noqa: E402
from dataguard.train.config import load_train_config  # noqa: E402
from dataguard.train.loop import Trainer, TrainError  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "bench_guard"


def _cfg(data: Path, out: Path, args: argparse.Namespace, **kw):
    values = {"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(out),
              "max_steps": args.steps, "batch_size": 4, "lr": 3e-3, "max_length": 96, "eval_every": 10 ** 6,
              "save_every": 10 ** 6, "tensorboard": False, "device": args.device, "eval_fraction": 0.1}
    values.update(kw)
    return load_train_config(values)


def _timed(cfg) -> tuple[float, float]:
    stamps: list[float] = []
    if Path(cfg.output).exists():
        shutil.rmtree(cfg.output)
    trainer = Trainer(cfg, progress=False, on_step=lambda step: stamps.append(time.process_time()))
    trainer.fit()
    times = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][5:-1]  # no warm-up, no final save
    return statistics.fmean(times), statistics.median(times)


def overhead(data: Path, args: argparse.Namespace) -> list[tuple[str, float, float]]:
    never = 10 ** 6
    arms = {"plain": {"guard": False, "monitor_every": never, "histogram_every": never},
            "monitor+guard (monitor_every 10)": {}}
    rows = []
    for rep in range(2):
        for name, kw in arms.items():
            mean, median = _timed(_cfg(data, OUT / f"overhead_{rep}_{len(rows)}", args, **kw))
            rows.append((f"{name} #{rep + 1}", mean * 1000, median * 1000))
            print(f"  {rows[-1][0]}: mean {rows[-1][1]:.2f}, median {rows[-1][2]:.2f} CPU ms/step", flush=True)
    return rows


def divergence(data: Path, args: argparse.Namespace) -> list[dict]:
    spike = [{"step": args.spike_step, "kind": "lr_spike", "factor": 100.0}]
    guard = {"snapshot_every": 10, "anomaly_window": 10, "recovery_steps": 20}
    arms = {"clean": {"guard": guard}, "guarded": {"guard": guard, "faults": spike},
            "clip only": {"guard": False, "faults": spike}}
    out = []
    for name, kw in arms.items():
        run = OUT / f"div_{name.replace(' ', '_')}"
        if run.exists():
            shutil.rmtree(run)
        cfg = _cfg(data, run, args, max_steps=args.div_steps, **kw)
        try:
            result = Trainer(cfg, progress=False).fit()
            losses = [h["loss"] for h in result.history]
            finite = [v for v in losses[-5:] if math.isfinite(v)]
            row = {"arm": name, "final_loss": sum(finite) / len(finite) if finite else math.nan,
                   "eval_loss": (result.last_eval or {}).get("loss", math.nan),
                   "max_loss_after_spike": max((v for v in losses[args.spike_step - 1:] if math.isfinite(v)),
                                               default=math.nan),
                   "skipped": result.skipped_steps, "rollbacks": result.rollbacks, "stopped": ""}
        except TrainError as exc:
            row = {"arm": name, "final_loss": math.nan, "eval_loss": math.nan, "max_loss_after_spike": math.nan,
                   "skipped": None, "rollbacks": None, "stopped": str(exc)[:80]}
        out.append(row)
        print(f"  {row}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    ap.add_argument("--steps", type=int, default=40, help="steps of each overhead run")
    ap.add_argument("--div-steps", type=int, default=80, help="steps of each divergence run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--spike-step", type=int, default=33, help="first step with the lr x100")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    OUT.mkdir(parents=True, exist_ok=True)
    data = OUT / "shards"
    if not (data / "manifest.json").is_file():
        if data.exists():
            shutil.rmtree(data)
        Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data" / "alpaca_en_demo.json"))], data)
    print("overhead per step:", flush=True)
    rows = overhead(data, args)
    print(f"divergence (lr x100 from step {args.spike_step}):", flush=True)
    div = divergence(data, args)
    plain = [ms for name, ms, _ in rows if name.startswith("plain")]
    guarded = [ms for name, ms, _ in rows if not name.startswith("plain")]
    lines = [f"# bench_guard ({args.device}, tiny-causal-lm, batch 4, {args.steps} steps per overhead run)", "",
             "| arm | mean CPU ms/step | median CPU ms/step |", "|---|---:|---:|"]
    lines += [f"| {name} | {mean:.2f} | {median:.2f} |" for name, mean, median in rows]
    ratio = statistics.fmean(guarded) / statistics.fmean(plain) - 1
    lines += ["", f"overhead of monitor+guard: {ratio * 100:+.1f}% (mean CPU time per step, both repeats; the "
              "mean carries the every-10th-step monitor cost, the median does not)", "",
              f"## divergence: lr x100 from step {args.spike_step} of {args.div_steps}", "",
              "| arm | final loss (mean of last 5) | eval loss | max loss after the spike | skipped | rollbacks "
              "| stopped |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in div:
        lines.append(f"| {r['arm']} | {r['final_loss']:.3f} | {r['eval_loss']:.3f} | "
                     f"{r['max_loss_after_spike']:.3f} | {r['skipped']} | {r['rollbacks']} | {r['stopped']} |")
    text = "\n".join(lines) + "\n"
    (OUT / "results.md").write_text(text)
    (OUT / "results.json").write_text(json.dumps({"overhead": rows, "divergence": div}, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
