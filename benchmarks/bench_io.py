"""Throughput and peak memory of read -> normalize -> write as the input grows.

Builds JSONL inputs of 100k, 300k and 1M rows by replicating the real Alpaca, ShareGPT
and OpenAI-messages files in ../shared/data (each copy gets a distinct suffix so rows are
not identical), then runs `dataguard run` on each in a fresh process and reports rows/s
and the peak resident memory of the whole process tree. Flat memory across sizes is the
point: readers stream, work units are bounded, shards are cut at `shard_rows`.

Usage:  python benchmarks/bench_io.py [--sizes 100000,300000,1000000] [--workers 1,2]

Measured 2026-11-29 on this project's 2-core machine (quiet), `python benchmarks/bench_io.py`:

         rows  input MB workers  seconds    rows/s  peak RSS MB
      100,000      66.0       1      3.7    27,156          234
      100,000      66.0       2      3.2    31,471          173
      300,000     198.4       1      9.9    30,186          216
      300,000     198.4       2      6.3    47,429          183
    1,000,000     658.2       1     31.8    31,450          224
    1,000,000     658.2       2     19.1    52,409          179

Peak memory stays flat from 100k to 1M rows. Two workers on two cores give 1.66x at 1M
rows (the driver, which reads lines and cuts shards, shares the cores with them).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
SOURCES = [
    SHARED / "alpaca_en_demo/alpaca_en_demo.json",
    SHARED / "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json",
    SHARED / "messages_kto_demo/kto_en_demo.json",
    SHARED / "gpteacher_toolformer/toolformer-dedupe-only-dataset.json",
]


def build_input(path: Path, rows: int) -> int:
    """Write `rows` JSONL records cycling over the real files; returns bytes written."""
    pool = []
    for source in SOURCES:
        pool.extend(json.loads(source.read_text()))
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            record = dict(pool[i % len(pool)])
            record["id"] = f"r{i}"
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path.stat().st_size


def run_once(input_path: Path, out: Path, workers: int, batch_rows: int) -> tuple[float, float]:
    config = out.parent / f"{out.name}.yaml"
    config.write_text(f"inputs:\n  - path: {input_path}\n    name: bench\nstages: []\n"
                      f"batch_rows: {batch_rows}\nreport: false\n")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dataguard.cli", "run", str(config), "--output", str(out),
                    "--workers", str(workers), "--no-report", "--quiet"], check=True, capture_output=True)
    seconds = time.perf_counter() - start
    # ru_maxrss of children is the max over all waited-for descendants (KiB on Linux).
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, max(peak, before) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batch-rows", type=int, default=5000)
    parser.add_argument("--one", nargs=4, metavar=("INPUT", "OUT", "WORKERS", "BATCH_ROWS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        seconds, peak = run_once(Path(args.one[0]), Path(args.one[1]), int(args.one[2]), int(args.one[3]))
        print(seconds, peak)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    print(f"{'rows':>9} {'input MB':>9} {'workers':>7} {'seconds':>8} {'rows/s':>9} {'peak RSS MB':>12}")
    with tempfile.TemporaryDirectory(prefix="dataguard-bench-") as tmp:
        for rows in sizes:
            input_path = Path(tmp) / f"in-{rows}.jsonl"
            size = build_input(input_path, rows)
            for w in workers:
                # each measurement in its own interpreter so ru_maxrss is not carried over
                res = subprocess.run([sys.executable, __file__, "--one", str(input_path),
                                      str(Path(tmp) / f"out-{rows}-{w}"), str(w), str(args.batch_rows)],
                                     check=True, capture_output=True, text=True)
                seconds, peak = (float(x) for x in res.stdout.split())
                print(f"{rows:>9,} {size / 1e6:>9.1f} {w:>7} {seconds:>8.1f} {rows / seconds:>9,.0f} {peak:>12.0f}",
                      flush=True)
            input_path.unlink()


if __name__ == "__main__":
    main()
