"""dataguard's runner against Hugging Face ``transformers.Trainer``: time per step and memory.

Issue #24: "Same speed and memory as the tool a user would otherwise pick". Goal: dataguard's
runner (guard and monitor on, its defaults) takes <= 1.10x HF Trainer's time per optimizer step
and <= 1.10x its peak RSS (on CUDA also <= 1.10x its peak ``torch.cuda.max_memory_allocated``).

Run (from the repo root, offline, with the ``smollm`` extra installed; about 10 minutes of CPU
on one core with the defaults, most of it the full fine-tunes):

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python benchmarks/bench_runner.py \
        [--device cpu|cuda] [--arms lora,full] [--steps 10] [--warmup 1] [--batch-size 4] \
        [--max-length 256] [--core N] [--repeat 1] [--hf-optim OPTIM] [--profile lora|full]

The table is printed and written to ``benchmarks/results/bench_runner/results.md`` (the raw
numbers, every step's time included, to ``results.json``); run folders go under
``benchmarks/results/bench_runner/`` (git-ignored).

What is compared, per arm (1) SmolLM2-135M-Instruct (``smollm2-135m``) with LoRA and (2) the
same model fully fine-tuned:

* dataguard: ``dataguard.train.loop.Trainer`` on a config from
  ``dataguard.train.config.load_train_config`` with the runner's defaults (guard on,
  ``monitor_every`` 10, layer-wise clipping, metrics.jsonl and TensorBoard every step,
  torch AdamW), except what is held equal below and ``eval_every`` / ``save_every`` set
  beyond the run;
* HF: ``transformers.Trainer`` (+ ``peft.get_peft_model`` for LoRA) with its defaults
  (``optim`` is ``adamw_torch_fused`` with torch >= 2.8), ``save_strategy="no"``,
  ``eval_strategy="no"``, ``report_to="none"``, ``train_sampling_strategy="sequential"`` over
  the rows in dataguard's batch order, ``DataCollatorForSeq2Seq`` (right padding, labels -100).

Held equal: the rows (``sample_data/alpaca_en_demo.json`` through an empty dataguard pipeline,
``Pipeline([], workers=1)``, the training side of dataguard's seeded 10% held-out split: 360
rows); the token ids and labels (BOTH sides call dataguard's encoder,
``dataguard.train.prepare.encode_split`` -> ``encode_sft``: the model's ChatML template, loss on
assistant tokens only, truncated to ``--max-length``), and the batches (HF is fed the rows in
the order of dataguard's seeded sampler, so step k of both sides trains on the same 4 rows,
padded the same way; checked: every HF batch equals dataguard's collate of that step's rows,
and the tokens per step logged by dataguard equal HF's); the model (the same cached
float32 folder), fp32, batch size, max_length, the LoRA settings (r 8, alpha 16, q/k/v/o
projections, dropout 0), lr 2e-5 with 10% warmup and cosine decay, weight decay 0.01, max grad
norm 1.0, the number of optimizer steps, the device; one process per (arm, side), run one
after the other, pinned to ONE core (``os.sched_setaffinity``) with one torch thread
(``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``).

Timing: every side records (wall clock, process CPU clock, VmHWM) at the end of each optimizer
step (dataguard's ``on_step`` hook, HF's ``on_step_end`` callback; on CUDA after
``torch.cuda.synchronize()``). A step's time is the difference between two consecutive ends,
so it holds everything the runner does per step (drawing and collating the batch, forward,
backward, clipping, guard, optimizer, scheduler, logging). The first ``--warmup`` steps are
left out; the run is stopped after ``warmup + steps`` steps of a schedule one step longer (so
the last timed step is not dataguard's final step, which evaluates and saves a checkpoint).
With the default 1 + 10 steps the timed steps 2-11 hold exactly one step of dataguard's
``monitor_every: 10`` / guard ``snapshot_every: 10`` (step 10), the rate of a long run: the
median is the plain step, the mean carries that periodic work. Peak RSS is the process's
VmHWM (the ``ru_maxrss`` counter) up to the end of the last timed step: it includes loading the
model and encoding the rows (the same code on both sides). After the warm-up VmHWM is reset
(``/proc/self/clear_refs`` 5) so the second table also gives the peak of the timed steps alone.
Whole-process CPU time is ``getrusage(RUSAGE_SELF)`` user + system at the end of the process
(imports, model load, tokenisation, the untimed steps included).

``--profile ARM`` runs dataguard's side of ARM once more under cProfile (not timed in the
table) and writes the top functions by cumulative time of the training loop to
``profile_<arm>.txt``: where dataguard's extra time per step goes, if any.

Last measured 2026-12-02 at commit 22ae05a on a 2-core AMD EPYC VM (the other core busy with
the token-cache benchmark, then tests), CPU, torch 2.13, one process per side, defaults, 8 min
wall; ``--device cuda`` not run yet (no GPU was lent):

| arm | dataguard s/step (median / mean) | HF s/step (median / mean) | ratio (median / mean) | dataguard peak RSS | HF peak RSS | ratio |
|---|---|---|---|---|---|---|
| SmolLM2-135M LoRA r8 q/k/v/o | 8.561 / 8.551 | 8.713 / 8.674 | 0.98x / 0.99x | 3623 MB | 3425 MB | 1.06x |
| SmolLM2-135M full fine-tune | 11.332 / 11.918 | 11.225 / 11.056 | 1.01x / 1.08x | 4616 MB | 4482 MB | 1.03x |

RSS after the warm-up step: 2789 vs 2828 MB (LoRA), 2937 vs 2933 MB (full).

History (what closed the memory gap, which was 1.21x LoRA and 1.42x full at f5c4d7a):

* the SFT loss shifts the labels instead of copying the logits, then the lean loss
  (`dataguard.train.optim.forward`): the head and cross-entropy only on scored positions, in
  checkpointed chunks; 1,024 tokens per chunk left LoRA at 1.07-1.12x over three runs, 256
  brought it to 1.04-1.06x (one chunk's logits, log-softmax and gradient are a quarter the size);
* guard snapshots: only trainable tensors, spilled to ``RUN/_guard/`` on a CPU when over
  256 MB, memory-mapped back (full: 621 MB x 2 were live before);
* the monitor's update ratios on a 16k-element sample per tensor instead of a full copy
  (513 MB before).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "bench_runner"
SAMPLE = REPO / "sample_data" / "alpaca_en_demo.json"
MODEL = "smollm2-135m"
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}
LR, WEIGHT_DECAY, WARMUP_RATIO, MAX_GRAD_NORM, EVAL_FRACTION, SEED = 2e-5, 0.01, 0.1, 1.0, 0.1, 0
ARMS = {"lora": "SmolLM2-135M LoRA r8 q/k/v/o", "full": "SmolLM2-135M full fine-tune"}
GOAL = 1.10
T0 = [time.perf_counter()]  # the child's start (reset in `child`)


# ----------------------------------------------------------------------------- measuring
def _status_kb(key: str) -> int:
    """A ``/proc/self/status`` value in kB (VmHWM: peak RSS, VmRSS: current), 0 if absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Stamps:
    """(wall, process CPU, peak RSS kB) at the end of every optimizer step; stops the run."""

    def __init__(self, cuda: bool, warmup: int) -> None:
        self.cuda, self.warmup = cuda, warmup
        self.rows: list[dict[str, float]] = []
        self.t_start = T0[0]
        self.rss_after_warmup_kb = self.hwm_before_reset_kb = 0
        self.cuda_peak = None

    def step_end(self, step: int) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            self.cuda_peak = int(torch.cuda.max_memory_allocated())
        self.rows.append({"step": step, "wall": time.perf_counter(), "cpu": time.process_time(),
                          "hwm_kb": _status_kb("VmHWM")})
        if step == self.warmup:  # from here VmHWM is the peak of the timed steps alone
            self.rss_after_warmup_kb = _status_kb("VmRSS")
            self.hwm_before_reset_kb = self.rows[-1]["hwm_kb"]
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass

    def summary(self, warmup: int, tokens: list[int]) -> dict[str, Any]:
        by_step = {r["step"]: r for r in self.rows}
        timed = [s for s in sorted(by_step) if s > warmup and s - 1 in by_step]
        secs = [by_step[s]["wall"] - by_step[s - 1]["wall"] for s in timed]
        cpu = [by_step[s]["cpu"] - by_step[s - 1]["cpu"] for s in timed]
        toks = [tokens[s - 1] for s in timed] if len(tokens) >= max(timed, default=0) else []
        last = by_step[max(by_step)]
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"timed_steps": timed, "step_s": secs, "step_cpu_s": cpu,
                "median_s": statistics.median(secs), "mean_s": statistics.fmean(secs),
                "mean_cpu_s": statistics.fmean(cpu), "tokens": tokens,
                "tokens_per_s": sum(toks) / sum(secs) if toks else None,
                "peak_rss_mb": max(last["hwm_kb"], self.hwm_before_reset_kb) / 1024,
                "peak_rss_timed_mb": last["hwm_kb"] / 1024, "rss_after_warmup_mb": self.rss_after_warmup_kb / 1024,
                "to_first_step_end_s": by_step[min(by_step)]["wall"] - self.t_start,
                "cuda_peak_mb": self.cuda_peak / 2 ** 20 if self.cuda_peak is not None else None,
                "process_cpu_s": usage.ru_utime + usage.ru_stime,
                "vmhwm_mb_per_step": [round(by_step[s]["hwm_kb"] / 1024) for s in sorted(by_step)]}


# ----------------------------------------------------------------------------- the two sides
def _train_config(args: argparse.Namespace, data: Path, run_dir: Path, arm: str) -> Any:
    from dataguard.train.config import load_train_config

    total = args.warmup + args.steps + 1  # one step more than is run: the last timed step is not the final one
    values: dict[str, Any] = {
        "task": "sft", "model": MODEL, "data": str(data), "output": str(run_dir), "device": args.device,
        "batch_size": args.batch_size, "max_length": args.max_length, "max_steps": total, "lr": LR,
        "weight_decay": WEIGHT_DECAY, "warmup_ratio": WARMUP_RATIO, "max_grad_norm": MAX_GRAD_NORM,
        "eval_fraction": EVAL_FRACTION, "seed": SEED, "eval_every": 10 ** 6, "save_every": 10 ** 6}
    if arm == "lora":
        values["lora"] = dict(LORA)
    return load_train_config(values)


def _encoded(cfg: Any, tokenizer: Any) -> tuple[Any, list[list[int]]]:
    """dataguard's training examples of ``cfg`` and the row indices of every step, exactly as
    `dataguard.train.run_setup.setup_run` builds them (same split, encoder and seeded sampler)."""
    import numpy as np

    from dataguard.train.data import RunShards, curriculum_unit, run_split
    from dataguard.train.data.sampler import CurriculumSampler, steps_per_epoch
    from dataguard.train.prepare import encode_split

    run = RunShards.open(cfg.data, task=cfg.task)
    train_idx, val_idx, _ = run_split(run, cfg.eval_fraction, cfg.seed)
    enc, _val, _ = encode_split(cfg, run, tokenizer, None, train_idx, val_idx, lambda text: None)
    per_epoch = steps_per_epoch(int(np.sum(enc.repeat)), cfg.batch_size, cfg.grad_accum)
    total = cfg.max_steps
    sampler = CurriculumSampler(len(enc), repeat=enc.repeat, total_steps=total, batch_size=cfg.batch_size,
                                seed=cfg.seed, unit=cfg.curriculum_unit or curriculum_unit(run.training),
                                grad_accum=cfg.grad_accum, epochs=-(-total // per_epoch))
    return enc, [list(sampler.next_batch()[0]) for _ in range(total)]


def run_dataguard(args: argparse.Namespace, data: Path, run_dir: Path, arm: str) -> dict[str, Any]:
    from dataguard.train.loop import Trainer

    stop = args.warmup + args.steps
    stamps = Stamps(args.device == "cuda", args.warmup)
    if args.device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(_train_config(args, data, run_dir, arm), progress=False, on_step=stamps.step_end)
    if args.child_profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        result = trainer.fit(stop_after=stop)
        prof.disable()
        with open(args.child_profile, "w") as fh:
            stats = pstats.Stats(prof, stream=fh).sort_stats("cumulative")
            stats.print_stats(60)
            stats.sort_stats("tottime").print_stats(40)
    else:
        result = trainer.fit(stop_after=stop)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    tokens = [int(m["tokens"]) for m in metrics if "loss" in m]
    out = stamps.summary(args.warmup, tokens)
    record = json.loads((run_dir / "run.json").read_text())
    out.update(steps_run=result.steps, skipped=result.skipped_steps, losses=[h["loss"] for h in result.history],
               threads=record.get("threads"), trainable_params=sum(g["params"] for g in record["param_groups"]),
               monitor_steps=[m["step"] for m in metrics if "layer_grad_norms" in m])
    return out


def run_hf(args: argparse.Namespace, data: Path, run_dir: Path, arm: str) -> dict[str, Any]:
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from dataguard.train.model.pretrained import pretrained_path

    stop = args.warmup + args.steps
    stamps = Stamps(args.device == "cuda", args.warmup)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cfg = _train_config(args, data, run_dir / "unused", arm)
    path = str(pretrained_path(MODEL))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"  # as dataguard pads
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    if arm == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                                 target_modules=list(LORA["targets"]), task_type="CAUSAL_LM"))
    enc, order = _encoded(cfg, tokenizer)
    rows = [{"input_ids": enc.input_ids[i], "attention_mask": [1] * len(enc.input_ids[i]), "labels": enc.labels[i]}
            for batch in order for i in batch]
    collator = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100, return_tensors="pt")
    seen: list[dict[str, torch.Tensor]] = []

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = collator(features)
        seen.append({k: batch[k] for k in ("input_ids", "attention_mask", "labels")})
        return batch

    class Hook(TrainerCallback):
        def on_step_end(self, _args: Any, state: Any, control: Any, **kw: Any) -> Any:
            stamps.step_end(state.global_step)
            if state.global_step >= stop:
                control.should_training_stop = True
            return control

    extra = {"optim": args.hf_optim} if args.hf_optim else {}
    targs = TrainingArguments(
        output_dir=str(run_dir), per_device_train_batch_size=args.batch_size, max_steps=cfg.max_steps,
        learning_rate=LR, weight_decay=WEIGHT_DECAY, warmup_steps=WARMUP_RATIO, lr_scheduler_type="cosine",
        max_grad_norm=MAX_GRAD_NORM, save_strategy="no", eval_strategy="no", report_to="none", seed=SEED,
        use_cpu=args.device == "cpu", train_sampling_strategy="sequential", remove_unused_columns=False,
        dataloader_num_workers=0, disable_tqdm=True, **extra)
    trainer = Trainer(model=model, args=targs, train_dataset=rows, data_collator=collate, callbacks=[Hook()])
    trainer.train()
    out = stamps.summary(args.warmup, [int(b["attention_mask"].sum()) for b in seen])
    same = all(torch.equal(b[k], enc.collate(idx, tokenizer.pad_token_id)[k])
               for b, idx in zip(seen, order, strict=False) for k in ("input_ids", "attention_mask", "labels"))
    out.update(steps_run=trainer.state.global_step, batches_equal_dataguard=same and len(seen) >= stop,
               optim=str(targs.optim), trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
               losses=[h["loss"] for h in trainer.state.log_history if "loss" in h])
    return out


def child(args: argparse.Namespace) -> int:
    T0[0] = time.perf_counter()
    os.sched_setaffinity(0, {args.core})
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    run_dir = Path(args.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    fn = run_dataguard if args.child == "dataguard" else run_hf
    out = fn(args, Path(args.data), run_dir, args.arm)
    out.update(side=args.child, arm=args.arm, core=args.core, affinity=sorted(os.sched_getaffinity(0)),
               torch_threads=torch.get_num_threads())
    Path(args.result).write_text(json.dumps(out, indent=1) + "\n")
    return 0


# ----------------------------------------------------------------------------- the parent
def _spawn(args: argparse.Namespace, side: str, arm: str, data: Path, tag: str, profile: Path | None = None
           ) -> dict[str, Any]:
    result = OUT / "raw" / f"{tag}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--arm", arm, "--data", str(data),
           "--run-dir", str(OUT / "runs" / tag), "--result", str(result), "--core", str(args.core),
           "--device", args.device, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--batch-size", str(args.batch_size), "--max-length", str(args.max_length)]
    if args.hf_optim:
        cmd += ["--hf-optim", args.hf_optim]
    if profile is not None:
        cmd += ["--child-profile", str(profile)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not result.is_file():
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"{tag}: the {side} process failed (exit {proc.returncode})")
    out = json.loads(result.read_text())
    out["process_wall_s"] = time.perf_counter() - t0
    print(f"  {tag}: median {out['median_s']:.3f} s/step, mean {out['mean_s']:.3f}, peak RSS "
          f"{out['peak_rss_mb']:.0f} MB, process {out['process_wall_s']:.0f} s wall / {out['process_cpu_s']:.0f} s CPU",
          flush=True)
    return out


def _data() -> Path:
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline

    out = OUT / "data"
    shutil.rmtree(out, ignore_errors=True)
    Pipeline([], workers=1).run([InputSpec(path=str(SAMPLE))], out)
    return out


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeats of one (arm, side): every timed step pooled; the largest peak memory."""
    secs = [s for r in runs for s in r["step_s"]]
    toks = [t for r in runs for s, t in zip(r["timed_steps"], [r["tokens"][s - 1] for s in r["timed_steps"]],
                                          strict=True)]
    cuda = [r["cuda_peak_mb"] for r in runs if r.get("cuda_peak_mb") is not None]
    return {"median_s": statistics.median(secs), "mean_s": statistics.fmean(secs),
            "tokens_per_s": sum(toks) / sum(secs), "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "peak_rss_timed_mb": max(r["peak_rss_timed_mb"] for r in runs),
            "rss_after_warmup_mb": max(r["rss_after_warmup_mb"] for r in runs),
            "process_cpu_s": statistics.fmean(r["process_cpu_s"] for r in runs),
            "timed_cpu_s": statistics.fmean(sum(r["step_cpu_s"]) for r in runs),
            "to_first_step_end_s": statistics.fmean(r["to_first_step_end_s"] for r in runs),
            "cuda_peak_mb": max(cuda) if cuda else None}


def table(results: dict[str, dict[str, list[dict[str, Any]]]], args: argparse.Namespace) -> str:
    cuda = args.device == "cuda"
    head = ["arm", "dataguard s/step (median / mean)", "HF s/step (median / mean)", "ratio (median / mean)",
            "dataguard peak RSS", "HF peak RSS", "ratio"]
    if cuda:
        head += ["dataguard peak CUDA", "HF peak CUDA", "ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    extra = ["| arm | side | tokens/s | CPU s in timed steps | process CPU s | s to end of step 1 "
             "| RSS after warm-up | peak RSS in timed steps |", "|---|---|---|---|---|---|---|---|"]
    for arm, sides in results.items():
        dg, hf = _merge(sides["dataguard"]), _merge(sides["hf"])
        row = [ARMS[arm], f"{dg['median_s']:.3f} / {dg['mean_s']:.3f}", f"{hf['median_s']:.3f} / {hf['mean_s']:.3f}",
               f"{_ratio(dg['median_s'], hf['median_s'])} / {_ratio(dg['mean_s'], hf['mean_s'])}",
               f"{dg['peak_rss_mb']:.0f} MB", f"{hf['peak_rss_mb']:.0f} MB", _ratio(dg["peak_rss_mb"], hf["peak_rss_mb"])]
        if cuda:
            row += [f"{dg['cuda_peak_mb']:.0f} MB", f"{hf['cuda_peak_mb']:.0f} MB",
                    _ratio(dg["cuda_peak_mb"], hf["cuda_peak_mb"])]
        lines.append("| " + " | ".join(row) + " |")
        for side, m in (("dataguard", dg), ("HF", hf)):
            extra.append(f"| {ARMS[arm]} | {side} | {m['tokens_per_s']:.0f} | {m['timed_cpu_s']:.1f} | "
                         f"{m['process_cpu_s']:.1f} | {m['to_first_step_end_s']:.1f} | {m['rss_after_warmup_mb']:.0f} MB | "
                         f"{m['peak_rss_timed_mb']:.0f} MB |")
    return "\n".join(lines) + "\n\n" + "\n".join(extra)


def main() -> int:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--arms", default="lora,full", help="comma-separated: lora, full")
    ap.add_argument("--steps", type=int, default=10, help="timed optimizer steps per process")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--core", type=int, default=None, help="the CPU every process is pinned to (default: the "
                    "last one this process may use)")
    ap.add_argument("--repeat", type=int, default=1, help="processes per (arm, side); the order alternates")
    ap.add_argument("--hf-optim", default=None, help="HF TrainingArguments.optim (default: HF's own default)")
    ap.add_argument("--profile", default=None, choices=tuple(ARMS), help="also profile dataguard's side of this arm")
    ap.add_argument("--out", default=str(OUT), help="results folder (default: %(default)s)")
    # the child processes
    ap.add_argument("--child", choices=("dataguard", "hf"), help=argparse.SUPPRESS)
    ap.add_argument("--arm", choices=tuple(ARMS), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.core is None:
        args.core = max(os.sched_getaffinity(0))
    if args.child:
        return child(args)
    OUT = Path(args.out).resolve()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or args.steps < 2 or args.warmup < 1:
        ap.error(f"unknown arms {unknown}" if unknown else "--steps >= 2 and --warmup >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    OUT.mkdir(parents=True, exist_ok=True)
    from dataguard.train.model.pretrained import pretrained_path

    print(f"model folder: {pretrained_path(MODEL)}", flush=True)  # built once, before any timed process
    data = _data()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    t0 = time.perf_counter()
    for arm in arms:
        results[arm] = {"dataguard": [], "hf": []}
        for rep in range(args.repeat):
            order = ("dataguard", "hf") if rep % 2 == 0 else ("hf", "dataguard")
            for side in order:
                results[arm][side].append(_spawn(args, side, arm, data, f"{arm}-{side}-{rep}"))
    checks = []
    for arm, sides in results.items():
        for dg, hf in zip(sides["dataguard"], sides["hf"], strict=True):
            n = args.warmup + args.steps
            checks.append(f"{arm}: HF batches == dataguard's collate of the same rows: {hf['batches_equal_dataguard']}; "
                          f"tokens per step equal: {dg['tokens'][:n] == hf['tokens'][:n]}; trainable params "
                          f"{dg['trainable_params']:,} / {hf['trainable_params']:,}; threads {dg['threads']} / "
                          f"{hf['torch_threads']}; monitor steps {dg['monitor_steps']}; HF optim {hf['optim']}")
    text = table(results, args)
    lines = [f"# dataguard runner vs transformers.Trainer ({args.device}, one core, fp32)", "",
             f"batch {args.batch_size}, max_length {args.max_length}, {args.steps} timed optimizer steps after "
             f"{args.warmup} warm-up step(s), {args.repeat} process(es) per side; goal <= {GOAL:.2f}x on time per step "
             f"and peak RSS.", "", text, "", *[f"- {c}" for c in checks], ""]
    if args.profile:
        prof = OUT / f"profile_{args.profile}.txt"
        _spawn(args, "dataguard", args.profile, data, f"{args.profile}-dataguard-profile", profile=prof)
        lines.append(f"cProfile of dataguard's {args.profile} run (not timed above): {prof}")
    report = "\n".join(lines)
    print()
    print(report)
    print(f"total {time.perf_counter() - t0:.0f} s")
    (OUT / "results.md").write_text(report + "\n")
    (OUT / "results.json").write_text(json.dumps({"args": {k: v for k, v in vars(args).items()
                                                           if k not in ("child", "arm", "data", "run_dir", "result",
                                                                        "child_profile")},
                                                  "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
