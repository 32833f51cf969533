"""What the stability guard and the monitor cost, and what they buy.

Run (from the repo root, offline; CPU by default, a few minutes on a shared 2-core machine):

    python benchmarks/bench_guard.py [--device cpu|cuda|auto] [--steps 40] [--div-steps 60] [--overhead-model minilm]

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
2. Faults: each fault kind (``nan_loss``, ``inf_loss``, ``nan_grad``, ``lr_spike`` x100 / x1000 /
   x1e20, ``garbage_batch``) at ``--fault-step`` (31: one step after the checkpoint of step 30),
   guard defaults, checkpoints and evaluation every 10 steps. Per arm: completed or stopped,
   the final eval loss against the clean run (goal: within 10%, or a stop with a diagnosis),
   rollbacks, and whether any checkpoint on disk holds a non-finite weight or one above the
   guard's bound (goal: never). ``clip only`` = guard off with the x100 spike: the runner
   still clips and skips non-finite steps, like an HF-style loop.
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
              "save_every": 10 ** 6, "tensorboard": False, "device": args.device, "eval_fraction": 0.1,
              "threads": args.threads}
    values.update(kw)
    return load_train_config(values)


def _timed(cfg) -> tuple[float, float, float]:
    """(mean, median, p95) process CPU seconds per optimizer step, warm-up and final save left out."""
    stamps: list[float] = []
    if Path(cfg.output).exists():
        shutil.rmtree(cfg.output)
    trainer = Trainer(cfg, progress=False, on_step=lambda step: stamps.append(time.process_time()))
    trainer.fit()
    times = sorted([b - a for a, b in zip(stamps, stamps[1:], strict=False)][5:-1])
    return statistics.fmean(times), statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))]


def _minilm_data() -> Path:
    """banking77's sample through an empty pipeline: the classify shards MiniLM trains on."""
    from dataguard.config import load_config

    out = OUT / "minilm_shards"
    if not (out / "manifest.json").is_file():
        spec = OUT / "minilm.yaml"
        spec.write_text(f"inputs:\n  - {{path: {REPO / 'sample_data/banking77/train.csv'}, format: labelled_text, "
                        f"aliases: {{category: label}}}}\noutput: {out}\nstages: []\n")
        config = load_config(spec)
        config.pipeline(progress=False, workers=1).run(config.inputs, config.output)
    return out


def overhead(data: Path, args: argparse.Namespace) -> list[tuple[str, float, float, float]]:
    never = 10 ** 6
    arms = {"plain": {"guard": False, "monitor_every": never, "histogram_every": never},
            "monitor+guard (monitor_every 10)": {}}
    model = {}
    if args.overhead_model == "minilm":
        data = _minilm_data()
        model = {"task": "classify", "model": "minilm", "batch_size": 16, "lr": 5e-5, "max_length": 48}
    rows = []
    for rep in range(2):
        for name, kw in arms.items():
            mean, median, p95 = _timed(_cfg(data, OUT / f"overhead_{rep}_{len(rows)}", args, **{**model, **kw}))
            rows.append((f"{name} #{rep + 1}", mean * 1000, median * 1000, p95 * 1000))
            print(f"  {rows[-1][0]}: mean {rows[-1][1]:.2f}, median {rows[-1][2]:.2f}, p95 {rows[-1][3]:.2f} "
                  "CPU ms/step", flush=True)
    return rows


FAULTS = {
    "nan_loss": {"kind": "nan_loss"}, "inf_loss": {"kind": "inf_loss"}, "nan_grad": {"kind": "nan_grad"},
    "lr_spike x100": {"kind": "lr_spike", "factor": 100.0}, "lr_spike x1000": {"kind": "lr_spike", "factor": 1000.0},
    "lr_spike x1e20": {"kind": "lr_spike", "factor": 1e20}, "garbage_batch": {"kind": "garbage_batch"},
}


def _bad_state_saved(run: Path, bound: float) -> bool:
    """Whether any checkpoint on disk holds a non-finite weight or one above the bound."""
    from dataguard.train.checkpoint import complete_checkpoints, read_weights

    for ckpt in complete_checkpoints(run):
        for tensor in read_weights(ckpt).values():
            if not bool(tensor.isfinite().all()) or float(tensor.abs().max()) > bound:
                return True
    return False


def divergence(data: Path, args: argparse.Namespace) -> list[dict]:
    """Each fault kind one step after a checkpoint (save_every 10), guard defaults, checkpoints on."""
    arms: dict[str, list] = {"clean": []}
    arms.update({name: [{"step": args.fault_step, **fault}] for name, fault in FAULTS.items()})
    arms["clip only: lr_spike x100"] = [{"step": args.fault_step, **FAULTS["lr_spike x100"]}]
    out = []
    clean_eval = math.nan
    for name, faults in arms.items():
        run = OUT / f"div_{name.replace(' ', '_').replace(':', '')}"
        if run.exists():
            shutil.rmtree(run)
        kw = {"guard": False} if name.startswith("clip only") else {}
        cfg = _cfg(data, run, args, max_steps=args.div_steps, save_every=10, eval_every=10, keep_checkpoints=20,
                   faults=faults, **kw)
        row = {"arm": name, "outcome": "", "eval_loss": math.nan, "vs_clean": math.nan, "rollbacks": None,
               "bad_state_saved": None, "best_eval": math.nan}
        try:
            result = Trainer(cfg, progress=False).fit()
            row.update(outcome="completed", eval_loss=(result.last_eval or {}).get("loss", math.nan),
                       rollbacks=result.rollbacks, best_eval=result.best_metric if result.best_metric else math.nan)
        except TrainError as exc:
            row.update(outcome=f"stopped ({str(exc).split(':')[1].strip()[:40]})")
        if name == "clean":
            clean_eval = row["eval_loss"]
        row["vs_clean"] = row["eval_loss"] / clean_eval - 1 if math.isfinite(row["eval_loss"]) else math.nan
        row["bad_state_saved"] = _bad_state_saved(run, 1e6)
        out.append(row)
        print(f"  {row}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    ap.add_argument("--steps", type=int, default=40, help="steps of each overhead run")
    ap.add_argument("--div-steps", type=int, default=80, help="steps of each divergence run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--fault-step", type=int, default=31, help="the step each fault is injected at")
    ap.add_argument("--overhead-model", default="minilm", choices=("minilm", "tiny-causal-lm"),
                    help="the model of the overhead runs (the fault runs use tiny-causal-lm)")
    ap.add_argument("--skip-faults", action="store_true", help="only the overhead table")
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
    print(f"faults at step {args.fault_step}:", flush=True)
    div = [] if args.skip_faults else divergence(data, args)
    plain = [r for r in rows if r[0].startswith("plain")]
    guarded = [r for r in rows if not r[0].startswith("plain")]
    lines = [f"# bench_guard ({args.device}, {args.overhead_model}, {args.steps} steps per overhead run)", "",
             "| arm | mean CPU ms/step | median | p95 |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {mean:.2f} | {median:.2f} | {p95:.2f} |" for name, mean, median, p95 in rows]

    def extra(k: int) -> float:
        return statistics.fmean(r[k] for r in guarded) / statistics.fmean(r[k] for r in plain) - 1

    lines += ["", f"overhead of monitor+guard: mean {extra(1) * 100:+.1f}%, median {extra(2) * 100:+.1f}%, "
              f"p95 {extra(3) * 100:+.1f}% (CPU time per step, both repeats; the mean and p95 carry the "
              "every-10th-step monitor cost, the median does not)", "",
              f"## faults at step {args.fault_step} (one after a checkpoint), {args.div_steps} steps, "
              "checkpoints every 10", "",
              "| arm | outcome | final eval loss | vs clean | rollbacks | a bad state saved |",
              "|---|---|---:|---:|---:|---|"]
    for r in div:
        lines.append(f"| {r['arm']} | {r['outcome']} | {r['eval_loss']:.3f} | {r['vs_clean'] * 100:+.1f}% | "
                     f"{r['rollbacks']} | {'yes' if r['bad_state_saved'] else 'no'} |")
    text = "\n".join(lines) + "\n"
    (OUT / "results.md").write_text(text)
    (OUT / "results.json").write_text(json.dumps({"overhead": rows, "divergence": div}, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
