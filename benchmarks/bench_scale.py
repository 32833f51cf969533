"""Memory at scale (issue #28): distinct rows with planted near duplicates through
``dedup -> near_dedup -> semantic_dedup`` on 2 workers; the driver's peak RSS, the largest
worker's peak RSS and the wall time, per input size.

Rows: ``--rows`` distinct Alpaca-shaped rows (instruction: 12 words, output: 40 words, drawn
seeded from the 10,302 words of tests/data/alpaca_en_demo, so no two originals are alike:
nearest-neighbour cosine ~0.45 with the static embedder), plus planted copies of 8 % of them:
2 % exact copies (``dedup``), 4 % with one output word replaced (word 5-shingle Jaccard
>= 0.8: ``near_dedup``), 2 % with the same instruction and a new output (``semantic_dedup``,
user side). Each size runs in a fresh process (``--one``), so its peaks are its own:
driver = ``RUSAGE_SELF``, largest worker = ``RUSAGE_CHILDREN`` (the pool's processes, each
running many tasks: an upper bound of the largest task's peak).

    nice python benchmarks/bench_scale.py --rows 200000,1000000 --work /tmp/bench_scale

The input is written once per size under ``--work`` (about 400 bytes a row) and reused.

Measured 2026-12-02 on the shared 2-core machine (other jobs running, so wall times are
loose; default batch_rows 5,000 and shards of 100,000 rows; 2M was a separate run with
``--rows 2000000``). Every stage fitted in rounds (`dataguard.rounds`); before, at 0.2M, the
driver peaked at 815 MB (semantic_dedup's embeddings and k-means in the driver)::

     distinct   rows in        planted e/n/s          dropped d/n/s driver MB worker MB  wall s
       200000    216000   4000/8000/4000      4001/7993/4006           81       400   181.3
      1000000   1080000  20000/40000/20000    20004/39951/20045          83       390   764.8
      2000000   2160000  40000/80000/40000    40010/79909/40081          89       425  1642.5

The driver grows 10 % from 0.2M to 2M rows: what it keeps per unit (counts, tallies; 432
units x 4 segments at 2M), not per row. 5M was not run: ~70 minutes here, past the time one
job may take on this shared machine. The work folder peaks at about 3.6 KB a row (measured
at 21,600 rows with keep_work: the rows once per segment, 1.5 KB of fit material, of which
the 256-dim embeddings are 1 KB), the output at 0.5 KB a row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORDS = ROOT / "tests/data/alpaca_en_demo/alpaca_en_demo.json"
SHARES = {"exact": 0.02, "near": 0.04, "semantic": 0.02}


def vocabulary() -> list[str]:
    rows = json.loads(WORDS.read_text(encoding="utf-8"))
    return sorted({w.lower() for r in rows for w in re.findall(r"[A-Za-z]{3,}", r["instruction"] + " " + r["output"])})


def write_input(path: Path, rows: int, seed: int = 0) -> dict[str, int]:
    """Originals in chunks of 10,000, each chunk followed by its planted copies."""
    vocab = np.array(vocabulary(), dtype=object)
    rng = np.random.default_rng(seed)
    planted = dict.fromkeys(SHARES, 0)
    tmp = path.with_name(path.name + ".part")
    with tmp.open("w", encoding="utf-8") as out:
        for lo in range(0, rows, 10_000):
            n = min(10_000, rows - lo)
            ins = vocab[rng.integers(0, len(vocab), (n, 12))]
            outs = vocab[rng.integers(0, len(vocab), (n, 40))]
            lines = [(" ".join(i), " ".join(o)) for i, o in zip(ins, outs, strict=True)]
            copies = []
            for kind, share in SHARES.items():
                picks = rng.choice(n, size=int(n * share), replace=False)
                planted[kind] += len(picks)
                for p in picks.tolist():
                    instruction, output = lines[p]
                    if kind == "near":
                        words = output.split(" ")
                        words[int(rng.integers(0, len(words)))] = str(vocab[int(rng.integers(0, len(vocab)))])
                        output = " ".join(words)
                    elif kind == "semantic":
                        output = " ".join(vocab[rng.integers(0, len(vocab), 40)])
                    copies.append((instruction, output))
            for instruction, output in lines + copies:
                out.write(json.dumps({"instruction": instruction, "input": "", "output": output}) + "\n")
    tmp.replace(path)
    return planted


def run_one(src: Path, out: Path, workers: int) -> dict[str, float]:
    """The pipeline on ``src`` in this process (the driver); peaks from getrusage."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline
    from dataguard.stages.dedup import DedupStage
    from dataguard.stages.near_dedup import NearDedupStage
    from dataguard.stages.semantic_dedup import SemanticDedupStage

    stages = [DedupStage(action="drop"), NearDedupStage(), SemanticDedupStage(backend="static", action="drop")]
    start = time.time()
    result = Pipeline(stages, workers=workers).run([InputSpec(path=src, name="bench")], out, fresh=True)
    wall = time.time() - start
    counts = {s["name"]: s["rows_rejected"] for s in result.manifest["stages"]}
    return {"rows_in": result.rows_in, "kept": result.rows_kept, "wall_s": round(wall, 1),
            "driver_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "dedup": counts.get("dedup", 0), "near_dedup": counts.get("near_dedup", 0),
            "semantic_dedup": counts.get("semantic_dedup", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="200000,1000000", help="distinct rows per run, comma-separated")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_scale"))
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # run one size in this process
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.one is not None:
        src = args.work / f"rows-{args.one}.jsonl"
        print(json.dumps(run_one(src, args.work / f"out-{args.one}", args.workers)))
        return
    print(f"{'distinct':>9} {'rows in':>9} {'planted e/n/s':>20} {'dropped d/n/s':>22} {'driver MB':>9} "
          f"{'worker MB':>9} {'wall s':>7}")
    for rows in [int(r) for r in args.rows.split(",")]:
        src = args.work / f"rows-{rows}.jsonl"
        facts = args.work / f"rows-{rows}.planted.json"
        if not src.is_file() or not facts.is_file():
            facts.write_text(json.dumps(write_input(src, rows)))
        planted = json.loads(facts.read_text())
        done = subprocess.run([sys.executable, __file__, "--one", str(rows), "--workers", str(args.workers),
                               "--work", str(args.work)], capture_output=True, text=True, env=os.environ)
        if done.returncode != 0:
            print(f"{rows:>9} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{rows:>9} {r['rows_in']:>9} {planted['exact']:>6}/{planted['near']}/{planted['semantic']:<6} "
              f"{r['dedup']:>7}/{r['near_dedup']}/{r['semantic_dedup']:<7} {r['driver_mb']:>9.0f} "
              f"{r['worker_mb']:>9.0f} {r['wall_s']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
