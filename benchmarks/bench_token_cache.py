"""The token cache at scale: encode time, and the memory a training process holds per token.

Issue #24: "Encode once into Arrow ... and memory-map it. Measure 100M tokens: encode time,
and resident memory during training, which should be <= 8 bytes per token."

What runs (SmolLM2-135M-Instruct's tokenizer and chat template, the ``smollm`` extra):

1. ``sample_data/alpaca_en_demo.json`` rows repeated with a seeded suffix until the
   conversations hold ``--tokens`` tokens, through an empty pipeline (real Arrow shards).
2. In a fresh process per side:
   - *cache, first start*: `dataguard.train.prepare.encode_split` with a ``cache_dir`` (the
     runner's path): it encodes and builds the cache;
   - *cache, second start* (a resume, or another rank): the same call maps the cache;
   - *lists* (only with ``--lists``, it needs ~50 bytes a token): the same call without a
     cache, the encoder before the cache.
   Then one pass over every training row in the sampler's order, collating batches of 8 as
   the loop does, and the process's resident memory (VmRSS: anonymous + mapped file pages)
   above what it held before encoding, per token. The second start's figure is what a
   training process holds; the first start's also holds heap the build freed but the
   allocator kept.

    HF_HUB_OFFLINE=1 python benchmarks/bench_token_cache.py --tokens 100000000 [--lists]

Last run (2026-12-02, ``--tokens 100000000``, SmolLM2's tokenizer, max_length 512, commit
4b1c1fc's encoder: rendered rows tokenised 256 at a time, labels from the offsets with array
operations; one core, the other running a benchmark):

| start | tokens | rows | encode or map s | epoch of collates s | held MB | bytes/token |
|---|---|---|---|---|---|---|
| first start (encodes, builds the cache) | 119,415,440 | 562,500 | 533.9 | 35 | 787 | 6.91 |
| second start (maps the cache) | 119,415,440 | 562,500 | 0.4 | 34 | 653 | 5.74 |

A training process (the second start: a resume, or any other rank) holds 5.74 bytes a token
for its examples: 5 in mapped file pages (int32 id + uint8 mask) and the rest row ids,
weights and offsets. The encoder runs at 224k tokens/s (24k before the per-token labelling
loop was vectorised, measured at 23.8M tokens under load).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "bench_token_cache"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_data(work: Path, tokens: int) -> Path:
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline

    rows = json.loads((REPO / "sample_data/alpaca_en_demo.json").read_text())
    per_row = 160  # about the demo's mean tokens per rendered conversation (checked below)
    n = max(1, tokens // per_row)
    rng = random.Random(0)
    src = work / "rows.jsonl"
    with src.open("w") as f:
        for i in range(n):
            r = rows[i % len(rows)]
            f.write(json.dumps({"instruction": r["instruction"], "input": r.get("input", ""),
                                "output": f"{r['output']} (variant {i} {rng.random():.6f})"}) + "\n")
    out = work / "data"
    Pipeline([], workers=2).run([InputSpec(path=str(src))], out)
    return out


def side(data: Path, cache: Path | None) -> dict[str, float]:
    from dataguard.train.config import load_train_config
    from dataguard.train.data import RunShards, run_split
    from dataguard.train.data.sampler import CurriculumSampler
    from dataguard.train.prepare import encode_split

    cfg = load_train_config({"task": "sft", "model": "smollm2-135m", "data": str(data), "output": "unused",
                             "max_length": 512})
    tok = _tokenizer()
    run = RunShards.open(data, task="sft")
    train_idx, val_idx, _ = run_split(run, cfg.eval_fraction, cfg.seed)
    base = rss_mb()
    t0 = time.perf_counter()
    enc, _, _ = encode_split(cfg, run, tok, None, train_idx, val_idx, lambda _: None, cache_dir=cache)
    first = time.perf_counter() - t0
    del run
    tokens = enc.n_tokens()
    sampler = CurriculumSampler(len(enc), repeat=enc.repeat, batch_size=8, seed=0,
                                total_steps=-(-len(enc) // 8), epochs=1)
    t0 = time.perf_counter()
    for batch in sampler:
        enc.collate(list(batch), 0)
    walk = time.perf_counter() - t0
    held = rss_mb() - base
    return {"tokens": tokens, "rows": len(enc), "encode_s": first, "epoch_collate_s": walk,
            "held_mb": held, "bytes_per_token": held * 2 ** 20 / max(tokens, 1), "mapped": bool(
                cache is not None and not isinstance(enc.input_ids, list))}


def _tokenizer():
    from dataguard.train.model.build import load_model

    return load_model("sft", "smollm2-135m")[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=100_000_000)
    ap.add_argument("--lists", action="store_true", help="also measure the in-memory encoder (no cache)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--child", choices=("cache", "lists"), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    if args.child:
        cache = Path(args.cache) if args.child == "cache" else None
        print(json.dumps(side(Path(args.data), cache)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = make_data(out, args.tokens)
    print(f"data: {time.perf_counter() - t0:.0f} s")
    results = {}
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=out))  # fresh: a first start must really encode
    # a first start encodes (and builds the cache); a second start (a resume, another rank)
    # maps it: its memory is what a training process holds
    sides = [("cache: first start", "cache"), ("cache: second start", "cache")]
    if args.lists:
        sides.append(("no cache (lists)", "lists"))
    for label, name in sides:
        done = subprocess.run([sys.executable, __file__, "--child", name, "--data", str(data), "--out", str(out),
                               "--cache", str(cache)],
                              capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        if done.returncode != 0:
            print(done.stderr[-3000:])
            return 1
        results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(cache)
    lines = ["| start | tokens | rows | encode or map s | epoch of collates s | held MB | bytes/token |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['tokens']:,} | {r['rows']:,} | {r['encode_s']:.1f} | "
                     f"{r['epoch_collate_s']:.0f} | {r['held_mb']:.0f} | {r['bytes_per_token']:.2f} |")
    table = "\n".join(lines)
    print(table)
    (out / "results.md").write_text(table + "\n")
    (REPO / "benchmarks" / "results" / "bench_token_cache.md").write_text(
        f"# bench_token_cache (--tokens {args.tokens:,})\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
