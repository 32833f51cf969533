"""The runner on a real pretrained model: what a user needs to know before a GPU run.

Run by ``scripts/gpu_check.sh`` after its stability matrix. On CUDA it trains SmolLM2-135M
(``smollm2-135m``, the ``smollm`` extra) and prints, per scenario, tokens/s and peak memory
(``torch.cuda.max_memory_allocated``; on CPU the process's peak RSS since the scenario began):

- LoRA and full fine-tune, in bf16 and fp16;
- gradient checkpointing and packing (LoRA, bf16);
- a resume mid-run against a straight run (max weight difference);
- the guard's poisoned-state scenario (a 1e20x lr spike: a rollback to a verified state, no
  checkpoint on disk with a non-finite or out-of-bound weight);
- guard on vs guard off over ``max(50, steps)`` steps;
- DDP on 2 GPUs through torchrun, where 2 are present.

Without CUDA the same scenarios run on the tiny causal LM (fp32 and bf16) for a few steps, so
CI runs the script. Exits non-zero when any scenario fails.

    python scripts/gpu_check_model.py WORK_DIR [STEPS]
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.checkpoint import complete_checkpoints, latest_checkpoint, read_weights
from dataguard.train.config import load_train_config
from dataguard.train.loop import Trainer

warnings.filterwarnings("ignore")
CUDA = torch.cuda.is_available()


def QUIET(line: str) -> None:  # noqa: N802 - the runner's progress lines would bury the table
    return None


def peak_reset() -> None:
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            pass


def peak_mb() -> float:
    if CUDA:
        return torch.cuda.max_memory_allocated() / 2 ** 20
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(work: Path, name: str, base: dict[str, Any], **extra: Any) -> tuple[Any, dict[str, float]]:
    out = work / name
    peak_reset()
    result = Trainer(load_train_config({**base, "output": str(out), **extra}), progress=False, echo=QUIET).fit()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s")][2:] or [float("nan")]
    times = [r["tokens"] / r["tokens_per_s"] for r in rows if r.get("tokens_per_s")][2:] or [float("nan")]
    return result, {"tok_s": statistics.median(rates), "ms": 1000 * statistics.median(times), "peak": peak_mb()}


def finite_checkpoints(run: Path, bound: float = 1e6) -> bool:
    return all(torch.isfinite(t).all() and float(t.abs().max()) <= bound
               for c in complete_checkpoints(run) for t in read_weights(c).values())


def main(work: Path, steps_arg: str) -> int:
    model = "smollm2-135m" if CUDA else "tiny-causal-lm"
    steps = int(steps_arg) if steps_arg else (40 if CUDA else 6)
    Pipeline([], workers=1).run([InputSpec(path="sample_data/alpaca_en_demo.json")], work / "data")
    base = {"task": "sft", "model": model, "data": str(work / "data"), "max_steps": steps, "batch_size": 8,
            "lr": 2e-4, "max_length": 256, "eval_every": 10_000, "save_every": 10_000, "tensorboard": False,
            "device": "auto"}
    precisions = ["bf16", "fp16"] if CUDA else ["fp32", "bf16"]
    failed: list[str] = []
    print(f"\nmodel {model} on {torch.cuda.get_device_name(0) if CUDA else 'cpu'}, {steps} steps")
    print(f"{'scenario':<34} {'tokens/s':>9} {'ms/step':>8} {'peak MB':>8}  result")

    def row(name: str, stats: dict[str, float] | None, verdict: str, ok: bool) -> None:
        if not ok:
            failed.append(f"{name}: {verdict}")
        s = stats or {"tok_s": float("nan"), "ms": float("nan"), "peak": float("nan")}
        print(f"{name:<34} {s['tok_s']:9.0f} {s['ms']:8.1f} {s['peak']:8.0f}  {verdict}")

    def attempt(name: str, fn: Any) -> None:
        try:
            fn(name)
        except Exception as exc:  # every failure is reported, then the exit code says so
            row(name, None, f"FAILED: {type(exc).__name__}: {exc}", False)

    for precision in precisions:
        for mode, lora in (("lora", {"r": 8}), ("full", None)):
            def plain(name: str, precision: str = precision, mode: str = mode, lora: Any = lora) -> None:
                result, stats = train(work, f"{mode}-{precision}", base, precision=precision, lora=lora)
                row(name, stats, f"final loss {result.final_loss:.4f}", bool(torch.isfinite(
                    torch.tensor(result.final_loss))))
            attempt(f"{mode} {precision}", plain)
    p = precisions[-1] if not CUDA else "bf16"
    for label, extra in (("gradient checkpointing", {"gradient_checkpointing": True}),
                         ("packing", {"packing": True})):
        def feature(name: str, extra: dict[str, Any] = extra, label: str = label) -> None:
            result, stats = train(work, label.replace(" ", "-"), base, precision=p, lora={"r": 8}, **extra)
            row(name, stats, f"final loss {result.final_loss:.4f}", bool(torch.isfinite(
                torch.tensor(result.final_loss))))
        attempt(f"lora {p} {label}", feature)

    def resume(name: str) -> None:
        cfg = {**base, "precision": p, "lora": {"r": 8}, "save_every": max(1, steps // 2)}
        Trainer(load_train_config({**cfg, "output": str(work / "straight")}), progress=False, echo=QUIET).fit()
        Trainer(load_train_config({**cfg, "output": str(work / "killed")}), progress=False, echo=QUIET).fit(stop_after=steps // 2)
        Trainer(load_train_config({**cfg, "output": str(work / "killed")}), progress=False, echo=QUIET).fit(resume=True)
        a, b = (read_weights(latest_checkpoint(work / n)) for n in ("straight", "killed"))
        apart = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
        row(name, None, f"max |w_resumed - w_straight| {apart:.2e}", apart <= (1e-3 if CUDA else 0.0))
    attempt(f"resume mid-run {p}", resume)

    def poisoned(name: str) -> None:
        n = max(steps, 40) if CUDA else 30
        run = work / "poisoned"
        cfg = {**base, "max_steps": n, "precision": p, "save_every": 10, "eval_every": 10, "keep_checkpoints": 10,
               "faults": [{"step": n - 9, "kind": "lr_spike", "factor": 1e20}], "output": str(run)}
        try:
            Trainer(load_train_config(cfg), progress=False, echo=QUIET).fit()
        except Exception as exc:  # a stop with its diagnosis is allowed; a bad state kept is not
            if not (run / "diagnosis.json").is_file():
                raise exc
        events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
        targets = [int(e["detail"].split("state of step ")[1].split(";")[0]) for e in events if e["kind"] == "rollback"]
        ok = finite_checkpoints(run) and bool(targets) and all(t < n - 9 for t in targets)
        row(name, None, f"rollbacks to steps {targets}; every checkpoint finite and in bound: {ok}", ok)
    attempt("guard: poisoned state (lr x1e20)", poisoned)

    def overhead(name: str) -> None:
        n = max(50, steps) if CUDA else steps
        _, on = train(work, "guard-on", base, precision=p, lora={"r": 8}, max_steps=n)
        _, off = train(work, "guard-off", base, precision=p, lora={"r": 8}, max_steps=n, guard=None)
        row(name, on, f"guard on {on['ms']:.1f} ms vs off {off['ms']:.1f} ms: {100 * (on['ms'] / off['ms'] - 1):+.1f}%",
            True)
    attempt("guard on vs off", overhead)

    if CUDA and torch.cuda.device_count() >= 2:
        def ddp(name: str) -> None:
            config = work / "ddp.yaml"
            config.write_text(yaml.safe_dump({"train": {**base, "precision": "bf16", "lora": {"r": 8},
                                                        "output": str(work / "ddp")}}))
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
                                   "dataguard", "train", str(config)], capture_output=True, text=True, timeout=900)
            record = json.loads((work / "ddp" / "run.json").read_text()) if done.returncode == 0 else {}
            row(name, None, f"exit {done.returncode}, processes {record.get('processes')}",
                done.returncode == 0 and record.get("processes") == 2)
        attempt("DDP 2 GPUs lora bf16", ddp)
    else:
        print(f"{'DDP 2 GPUs':<34} {'':>9} {'':>8} {'':>8}  not run: {torch.cuda.device_count()} GPU(s)")
    if failed:
        print("\nFAILED:\n  " + "\n  ".join(failed))
        return 1
    print("\nall model scenarios passed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ""))
