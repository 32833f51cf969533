"""Does `task: dpo` teach a real chat model the held-out preference? (issue #25's proof)

SmolLM2-135M-Instruct (the ``smollm`` extra) with LoRA, trained by dataguard's own runner on
the DPO demo's real preference pairs after ``pipelines/train_dpo.yaml``'s stages (exact dedup,
length on both responses, quality on both responses). The reference model is the same base
with the adapter switched off. Scored on the held-out pairs the runner splits off:

* reward accuracy: the share of held-out pairs whose chosen response gets the higher implicit
  reward (beta x the policy/reference log-ratio), with a 95% Wilson interval; 0.5 is chance;
* the pair loss against ln 2 (policy == reference) and the reward margin;
* beside it, the length baseline on the same held-out pairs: "the longer response is the
  chosen one". Length is the known confound of preference data; a model that only learned
  length would score this.

Run (offline, CPU; ``BENCH_SHARED_DATA`` or ``../shared/data`` adds the demo's full 300 pairs,
otherwise the 160 in ``sample_data/``):

    HF_HUB_OFFLINE=1 python benchmarks/bench_dpo.py        # the result below (about an hour)

Results go to ``benchmarks/results/bench_dpo/`` (git-ignored) and the table is printed.

Result (2026-12-02, commit 9869408, ``--steps 150 --eval-every 50 --lr 5e-4 --max-length 256
--threads 2``: the demo's 300 pairs, 270 after the stages, 202 training and 68 held out, three
epochs of 4-pair steps, 60.7 min on 2 quiet cores, seed 0):

| held-out measure | value |
|---|---:|
| reward accuracy (chosen reward > rejected) | **0.647** (44/68; 95% CI 0.53-0.75) |
| pair loss (ln 2 = 0.6931 before training) | 0.7530 |
| reward margin (chosen - rejected) | +0.7102 |
| length baseline: the longer response is the chosen one | 0.368 (25/68; 95% CI 0.26-0.49) |

| step (epoch) | reward accuracy | pair loss | margin |
|---:|---:|---:|---:|
| 50 (1) | 0.618 (42/68) | 0.6139 | +0.2774 |
| 100 (2) | 0.647 (44/68) | 0.7228 | +0.6976 |
| 150 (3) | 0.647 (44/68) | 0.7530 | +0.7102 |

A second seed (another split and LoRA init; ``--steps 50 --seed 1 --threads 1``: one epoch,
its cosine schedule over 50 steps, 45.5 min on one core shared with CI) gives 0.618 (42/68;
95% CI 0.50-0.72), pair loss 0.6362, margin +0.148, beside a length baseline of 0.426.

The preference carries to unseen pairs: the 95% interval clears 0.5 from the second epoch,
and it is not length (the longer response is the chosen one in only 37% of the held-out
pairs, so a length-only model would score below chance). From the second epoch on the
model over-fits the 202 pairs (training loss 0.03-0.10): the held-out margins widen both
ways, so the pair loss rises above ln 2 while the ranking holds. The guard skipped two steps
(129, 130) as spikes: in that over-fitted phase an ordinary batch at loss 0.34 is 22 robust
SDs above the run's recent losses.

Earlier runs (0.447 at 24 steps, 0.413 at 48) were wrong, not only short: the encoder kept
the start of a long pair as SFT does, so 96 of the 270 pairs at 256 tokens kept no token of
their final response (their earlier assistant turns were scored instead, the same on both
sides): a margin of exactly zero, counted as a wrong ranking. Now only the final response is
scored and a long pair loses the start of its prompt (`dataguard.train.data.pair_window`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_dpo"
SHARED = Path(os.environ.get("BENCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
FULL = SHARED / "sharegpt_dpo_demo" / "dpo_en_demo.json"
SAMPLE = ROOT / "sample_data" / "dpo_en_demo.head160.json"


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (sound at small n, unlike p +- 2 se)."""
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (centre - half, centre + half)


def run_pipeline(source: Path, out: Path) -> None:
    """``pipelines/train_dpo.yaml``'s stages on ``source`` (its own inputs replaced)."""
    import yaml

    from dataguard.config import load_config

    cfg = yaml.safe_load((ROOT / "pipelines" / "train_dpo.yaml").read_text())
    cfg.update({"inputs": [{"path": str(source), "name": "dpo_demo"}], "output": str(out), "report": False})
    cfg.pop("train", None)
    path = RESULTS / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    if out.exists():
        shutil.rmtree(out)
    loaded = load_config(path)
    loaded.pipeline(workers=1).run(loaded.inputs, out)


def held_out_length_baseline(data: Path, fraction: float, seed: int) -> tuple[int, int]:
    """(pairs whose chosen response is the longer one, held-out pairs), on the runner's split."""
    from dataguard.records import pair_responses
    from dataguard.train.data import RunShards
    from dataguard.train.data.split import run_split

    shards = RunShards.open(data, task="dpo")
    _, val, _ = run_split(shards, fraction, seed)
    pairs = [p for p in pair_responses(shards.table.take(val)) if p is not None]
    return sum(1 for chosen, rejected in pairs if len(chosen) > len(rejected)), len(pairs)


def train(data: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    from dataguard.train.config import load_train_config
    from dataguard.train.loop import Trainer

    if out.exists():
        shutil.rmtree(out)
    cfg = load_train_config({
        "task": "dpo", "model": "smollm2-135m", "data": str(data), "output": str(out), "device": "cpu",
        "precision": "fp32", "threads": args.threads, "seed": args.seed, "max_steps": args.steps,
        "batch_size": args.batch_size, "lr": args.lr, "dpo_beta": args.beta, "max_length": args.max_length,
        "eval_fraction": args.eval_fraction, "eval_every": args.eval_every or args.steps, "save_every": args.steps,
        "lora": {"r": 8}, "tensorboard": False, "dynamics": False})
    t0 = time.perf_counter()
    Trainer(cfg, progress=False).fit()
    seconds = time.perf_counter() - t0
    evals = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval_loss" in m]
    record = json.loads((out / "run.json").read_text())
    return {"seconds": seconds, "eval": evals[-1], "curve": evals, "val_pairs": record["val_examples"],
            "train_pairs": record["train_examples"], "dropped": record["dropped"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--eval-fraction", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations "
                        "(0: only at the end); each one is a row of the curve printed under the table")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    source = FULL if FULL.is_file() else SAMPLE
    data = RESULTS / "pipeline"
    run_pipeline(source, data)
    result = train(data, RESULTS / "run", args)
    longer, n_len = held_out_length_baseline(data, args.eval_fraction, args.seed)
    ev, n = result["eval"], result["val_pairs"]
    hits = round(ev["eval_accuracy"] * n)
    lo, hi = wilson(hits, n)
    blo, bhi = wilson(longer, n_len)
    table = "\n".join([
        f"data: {source.name} through train_dpo.yaml's stages; {result['train_pairs']} training pairs, {n} held out "
        f"(dropped by the encoder: {result['dropped'] or 'none'})",
        f"settings: {args.steps} steps x {args.batch_size} pairs, lr {args.lr}, beta {args.beta}, max_length "
        f"{args.max_length}, LoRA r8 q/k/v/o, seed {args.seed}, {result['seconds'] / 60:.1f} min on {args.threads} "
        "thread(s)",
        "",
        "| held-out measure | value |",
        "|---|---:|",
        f"| reward accuracy (chosen reward > rejected) | {ev['eval_accuracy']:.3f} ({hits}/{n}; 95% CI "
        f"{lo:.2f}-{hi:.2f}) |",
        f"| pair loss (ln 2 = {math.log(2):.4f} before training) | {ev['eval_loss']:.4f} |",
        f"| reward margin (chosen - rejected) | {ev['eval_reward_margin']:+.4f} |",
        f"| length baseline, every held-out pair of the split (before the encoder drops any): the longer response is the chosen one | {longer / max(n_len, 1):.3f} ({longer}/{n_len}; "
        f"95% CI {blo:.2f}-{bhi:.2f}) |",
    ])
    curve = [f"| {m['step']} | {m['eval_accuracy']:.3f} | {m['eval_loss']:.4f} | {m['eval_reward_margin']:+.4f} |"
             for m in result["curve"]]
    if len(curve) > 1:
        table += "\n\n| step | reward accuracy | pair loss | margin |\n|---:|---:|---:|---:|\n" + "\n".join(curve)
    print(table)
    (RESULTS / "bench_dpo.md").write_text(f"# bench_dpo ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
                                          f"{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
