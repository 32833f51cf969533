#!/usr/bin/env bash
# Short training runs that check the runner on this machine and time its stability features.
#
#   scripts/gpu_check.sh            (STEPS=30 by default; STEPS=8 for a quick look)
#
# With CUDA: bf16 and fp16 runs of the tiny causal LM (SFT) and of MiniLM (classify), both with
# LoRA, each "plain" (no layer-wise lr/clipping rules, no effective global clip) and "stable"
# (the defaults: layer-wise lr, clipping rules, global clip, non-finite guard) and "stable+gvs"
# (plus gradient-variance lr scaling). Prints the median step time and the overhead of the
# stability features (goal: <= 5%). Without CUDA it runs the same matrix briefly on CPU in
# fp32 and bf16, so CI exercises the script. Then scripts/gpu_check_model.py: SmolLM2-135M on
# CUDA (LoRA and full in bf16/fp16, gradient checkpointing, packing, resume mid-run, the
# guard's poisoned-state scenario, guard on vs off over 50+ steps, DDP on 2 GPUs), the tiny
# causal LM on CPU. Exits non-zero if any run fails or is non-finite.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
STEPS="${STEPS:-}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python - "$WORK" "$STEPS" <<'PY'
import json, statistics, sys, warnings
from pathlib import Path

import torch

from dataguard.config import load_config
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.config import load_train_config
from dataguard.train.loop import Trainer

warnings.filterwarnings("ignore")
work = Path(sys.argv[1])
cuda = torch.cuda.is_available()
steps = int(sys.argv[2]) if sys.argv[2] else (30 if cuda else 6)
print(f"device: {torch.cuda.get_device_name(0) if cuda else 'cpu'}  torch {torch.__version__}  steps {steps}")

Pipeline([], workers=1).run([InputSpec(path="sample_data/alpaca_en_demo.json")], work / "sft")
spec = work / "cls.yaml"
spec.write_text("inputs:\n  - {path: sample_data/banking77/train.csv, name: b77, format: labelled_text, "
                f"aliases: {{category: label}}}}\noutput: {work / 'cls'}\n"
                "stages:\n  - longtail: {tau: 1.0, phases: [0.5, 0.8]}\n")
config = load_config(spec)
config.pipeline(progress=False, workers=1).run(config.inputs, config.output)

PLAIN = {"lr_multipliers": {"embeddings": 1.0, "attention": 1.0, "mlp": 1.0, "other": 1.0, "head": 1.0},
         "clip_rules": {}, "max_grad_norm": 1e9}
VARIANTS = {"plain": PLAIN, "stable": {}, "stable+gvs": {"grad_variance_scaling": True}}
JOBS = {"tiny-causal-lm/sft": dict(task="sft", model="tiny-causal-lm", data=str(work / "sft"), max_length=256,
                                   batch_size=8, lr=1e-3),
        "minilm/classify": dict(task="classify", model="minilm", data=str(work / "cls"), max_length=64,
                                batch_size=32 if cuda else 8, eval_fraction=0.1 if cuda else 0.03, lr=1e-4)}
# (On CPU the matrix only proves every variant runs: bf16 there is emulated, ~20x slower than fp32
# on a CPU without bf16 units, so MiniLM gets 8-row batches and a 3% evaluation split.)
precisions = ["bf16", "fp16"] if cuda else ["fp32", "bf16"]
if cuda and torch.cuda.get_device_capability() >= (8, 9):
    precisions.append("fp8")  # torchao float8 layers (full fine-tune: fp8 does not combine with LoRA)
failed = []
print(f"\n{'model':<20} {'precision':<9} {'variant':<11} {'ms/step':>8} {'overhead':>9} {'loss':>8} {'skipped':>7}")
for job, base in JOBS.items():
    for precision in precisions:
        baseline = None
        for variant, extra in VARIANTS.items():
            out = work / f"run-{job.replace('/', '-')}-{precision}-{variant}"
            values = dict(base, output=str(out), max_steps=steps, precision=precision, device="auto",
                          lora={"r": 8} if precision != "fp8" else None, eval_every=10_000, save_every=10_000, tensorboard=False, **extra)
            try:
                result = Trainer(load_train_config(values), progress=False).fit()
            except Exception as exc:  # report every failure, then exit non-zero
                failed.append(f"{job} {precision} {variant}: {type(exc).__name__}: {exc}")
                print(f"{job:<20} {precision:<9} {variant:<11} FAILED: {exc}")
                continue
            rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
            times = [r["tokens"] / r["tokens_per_s"] for r in rows if "tokens_per_s" in r][2:] or [float("nan")]
            ms = 1000 * statistics.median(times)
            baseline = ms if variant == "plain" else baseline
            over = f"{100 * (ms / baseline - 1):+.1f}%" if baseline and variant != "plain" else ""
            loss = result.final_loss if result.final_loss is not None else float("nan")
            if not torch.isfinite(torch.tensor(loss)):
                failed.append(f"{job} {precision} {variant}: final loss {loss}")
            print(f"{job:<20} {precision:<9} {variant:<11} {ms:8.1f} {over:>9} {loss:8.4f} {result.skipped_steps:>7}")
if failed:
    print("\nFAILED:\n  " + "\n  ".join(failed))
    sys.exit(1)
print("\nall runs finished with finite losses")
PY
mkdir -p "$WORK/model"
python scripts/gpu_check_model.py "$WORK/model" "$STEPS"
