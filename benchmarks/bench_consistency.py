"""Consistency stage benchmark: detection quality, speed and memory of each embedding backend.

For each real file from ../shared/data it normalizes the first N rows, scores them with
`ConsistencyStage` (prompt = user turns, response = assistant turns), then builds
mismatched pairs by shifting every response to the next row's prompt (reusing the kept
embeddings, so the model runs once per text). Per backend (each in its own process, so
its peak memory is its own) it reports:

* rows/s of the scoring step (2 texts per row, model load and one-off export excluded),
  per wall-clock second and per CPU-second of the process (trust the latter on a shared,
  loaded machine: on 2 idle cores, rows/s is at most 2x rows/cpu-s);
* peak RSS of the process;
* the rank AUC of real vs mismatched pairs per file, and its largest drop against fp32 torch;
* the agreement of flagged rows with fp32 torch: the stage's rule (median - 3 robust SD of
  the real scores) applied to real and mismatched pairs, the share of pairs flagged the same.

``--memory N`` instead streams N rows (the files' rows repeated, in batches of 1,000 as a
pipeline would) through one backend and prints the peak RSS after each tenth.
``--side-by-side K`` runs K such streams at once per backend, one math thread each (what
``--workers K`` runs): on a small machine cores share caches and matrix units, so a backend's
speed alone can differ from its speed next to another worker.

    python benchmarks/bench_consistency.py --threads 2                       # the backend table
    python benchmarks/bench_consistency.py --backends torch --files alpaca_en_demo/alpaca_en_demo.json
    python benchmarks/bench_consistency.py --memory 20000 --backends onnx-int8
    python benchmarks/bench_consistency.py --side-by-side 2 --memory 3000 --backends onnx-int8 torch-bf16
    python benchmarks/bench_consistency.py --device cuda --backends torch --rows 5000   # on a GPU

Output: tables on stdout and, with --json PATH, the same figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataguard.embed import BACKENDS  # noqa: E402
from dataguard.io.raw import RawBatch, SourceOptions  # noqa: E402
from dataguard.stages.consistency import RESPONSE_COLUMN, ConsistencyStage  # noqa: E402
from dataguard.stages.normalize import Normalizer  # noqa: E402

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
FILES = {
    "alpaca_en_demo/alpaca_en_demo.json": 999,
    "gpteacher_toolformer/toolformer-similarity-0.6-dataset.json": 600,
    "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json": 300,
    "messages_kto_demo/kto_en_demo.json": 300,
    "sharegpt_dpo_demo/dpo_en_demo.json": 300,
    "sharegpt_fastchat_dummy/dummy_conversation.json": 500,
}
NO_SIGNAL = "sharegpt_fastchat_dummy/dummy_conversation.json"  # canned answers: no backend separates them
KS = (2.0, 2.5, 3.0)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load(path: Path, limit: int, replicate: int = 1) -> pa.Table:
    text = path.read_text(encoding="utf-8")
    records = [json.loads(x) for x in text.splitlines() if x.strip()] if path.suffix == ".jsonl" else json.loads(text)
    records = (records * replicate)[:limit] if replicate > 1 else records[:limit]
    batch = RawBatch(source=path.stem)
    for i, rec in enumerate(records):
        batch.add(i, rec)
    return Normalizer().normalize(batch, SourceOptions(name=path.stem)).kept


def stage_for(args: argparse.Namespace, backend: str) -> ConsistencyStage:
    return ConsistencyStage(keep_embeddings=True, threads=args.threads, batch_size=args.batch_size,
                            device=args.device, backend=backend)


def measure(rel: str, rows: int, stage: ConsistencyStage, args: argparse.Namespace) -> dict[str, object]:
    table = load(DATA / rel, rows, args.replicate)
    t0, c0 = time.perf_counter(), time.process_time()
    scored = stage.score(table)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    real = scored.column("consistency_score").to_numpy()
    shift = np.roll(np.arange(scored.num_rows), -1)
    resp = scored.column(RESPONSE_COLUMN).take(pa.array(shift))
    shuffled_table = scored.set_column(scored.column_names.index(RESPONSE_COLUMN),
                                       scored.schema.field(RESPONSE_COLUMN), resp)
    shuffled = stage.score(shuffled_table).column("consistency_score").to_numpy()
    ok = np.isfinite(real) & np.isfinite(shuffled)
    real, shuffled = real[ok], shuffled[ok]
    med = float(np.median(real))
    rsd = float(1.4826 * np.median(np.abs(real - med)))
    out: dict[str, object] = {
        "file": rel, "rows": int(table.num_rows), "seconds": seconds, "cpu_seconds": cpu_seconds,
        "rows_per_s": table.num_rows / seconds, "rows_per_cpu_s": table.num_rows / cpu_seconds,
        "real_median": med, "robust_sd": rsd, "mismatched_median": float(np.median(shuffled)),
        "auc": float((real[:, None] > shuffled[None, :]).mean()),
        "flags": [bool(x) for x in np.concatenate([real, shuffled]) < med - 3.0 * rsd],
    }
    for k in KS:
        cut = med - k * rsd
        out[f"real_flagged_k{k:g}"] = float(np.mean(real < cut))
        out[f"mismatched_flagged_k{k:g}"] = float(np.mean(shuffled < cut))
    return out


def run_one(backend: str, args: argparse.Namespace) -> dict[str, object]:
    stage = stage_for(args, backend)
    stage.score(load(DATA / args.files[0], 2))  # load (and build, once) the model outside the timing
    files = [measure(rel, args.rows or FILES.get(rel, 500), stage, args) for rel in args.files]
    rows = sum(f["rows"] for f in files)
    return {"backend": backend, "files": files, "rows": rows,
            "rows_per_s": rows / sum(f["seconds"] for f in files),
            "rows_per_cpu_s": rows / sum(f["cpu_seconds"] for f in files), "peak_rss_mb": peak_rss_mb()}


def memory_run(backend: str, total: int, args: argparse.Namespace) -> None:
    rel = args.files[0]
    table = load(DATA / rel, 10**9)
    stage = stage_for(args, backend)
    stage.score(table.slice(0, 2))
    print(f"{backend}: streaming {total} rows of {rel} (repeated) in batches of 1000; "
          f"peak RSS after load {peak_rss_mb():.0f} MB", flush=True)
    done, t0, c0 = 0, time.perf_counter(), time.process_time()
    step = max(1000, total // 10)
    while done < total:
        n = min(1000, total - done)
        start = done % table.num_rows
        batch = table.slice(start, n) if start + n <= table.num_rows else pa.concat_tables(
            [table.slice(start), table.slice(0, start + n - table.num_rows)])
        stage.score(batch)
        done += n
        if done % step == 0 or done == total:
            print(f"  {done:>7} rows  peak RSS {peak_rss_mb():6.0f} MB  {done / (time.perf_counter() - t0):6.1f} rows/s  "
                  f"{done / (time.process_time() - c0):6.1f} rows/cpu-s", flush=True)


def side_by_side(args: argparse.Namespace) -> None:
    """K single-thread streams of one backend at once; each one's last progress line."""
    for backend in args.backends:
        cmd = [sys.executable, __file__, "--memory", str(args.memory), "--backends", backend, "--threads", "1",
               "--batch-size", str(args.batch_size), "--files", args.files[0]]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(args.side_by_side)]
        for k, proc in enumerate(procs):
            out, _ = proc.communicate()
            print(f"{backend} stream {k + 1}/{args.side_by_side}: {out.strip().splitlines()[-1].strip()}", flush=True)
    print(f"load={os.getloadavg()[0]:.1f} cpus={os.cpu_count()}")


def print_tables(results: list[dict[str, object]], args: argparse.Namespace) -> None:
    ref = next((r for r in results if r["backend"] == "torch"), None)
    short = {rel: rel.split("/")[0].replace("sharegpt_", "").replace("messages_", "")[:12] for rel in args.files}
    head = f"{'backend':10} {'rows/s':>7} {'/cpu-s':>7} {'peakMB':>7} " + " ".join(f"{short[r]:>12}" for r in args.files)
    head += f" {'max AUC drop':>12} {'flag agree':>10}"
    print("AUC of real vs mismatched pairs per file; drop and flag agreement against fp32 torch"
          f" (max drop excludes {short.get(NO_SIGNAL, 'fastchat')}: no backend separates it)")
    print(head)
    for r in results:
        aucs = {f["file"]: f["auc"] for f in r["files"]}
        line = f"{r['backend']:10} {r['rows_per_s']:>7.1f} {r['rows_per_cpu_s']:>7.1f} {r['peak_rss_mb']:>7.0f} "
        line += " ".join(f"{aucs[f]:>12.4f}" for f in args.files)
        if ref is not None:
            ref_aucs = {f["file"]: f["auc"] for f in ref["files"]}
            drop = max(ref_aucs[f] - aucs[f] for f in args.files if f != NO_SIGNAL)
            flags = np.concatenate([f["flags"] for f in r["files"]])
            ref_flags = np.concatenate([f["flags"] for f in ref["files"]])
            line += f" {drop:>12.4f} {float((flags == ref_flags).mean()):>10.1%}"
        print(line)
    print()
    for r in results:
        print(f"[{r['backend']}] {'file':58} {'rows':>5} {'med':>6} {'rsd':>6} {'mism':>6} {'auc':>6}"
              + "".join(f" {'r/m@' + format(k, 'g'):>12}" for k in KS))
        for f in r["files"]:
            line = (f"{'':{len(r['backend']) + 3}}{f['file']:58} {f['rows']:>5} {f['real_median']:>6.3f} "
                    f"{f['robust_sd']:>6.3f} {f['mismatched_median']:>6.3f} {f['auc']:>6.3f}")
            line += "".join(f" {f[f'real_flagged_k{k:g}']:>5.1%}/{f[f'mismatched_flagged_k{k:g}']:>6.1%}" for k in KS)
            print(line)
    print(f"device={args.device} threads={args.threads} batch_size={args.batch_size} "
          f"load={os.getloadavg()[0]:.1f} cpus={os.cpu_count()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="*", default=list(FILES), help="paths relative to ../shared/data")
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--rows", type=int, default=None, help="rows per file (default: per-file sizes above)")
    parser.add_argument("--replicate", type=int, default=1, help="repeat the file's records to reach --rows")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory", type=int, default=None, help="stream this many rows; print peak RSS")
    parser.add_argument("--side-by-side", type=int, default=None, help="with --memory: K streams at once, 1 thread each")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process: one backend -> JSON
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.memory and args.side_by_side:
        side_by_side(args)
        return
    if args.memory:
        for backend in args.backends:
            memory_run(backend, args.memory, args)
        return
    if args.one:
        args.json.write_text(json.dumps(run_one(args.one, args)))
        return
    results = []
    for backend in args.backends:  # one process each: its own peak memory, its own model load
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_consistency_{os.getpid()}_{backend}.json"
        child = [sys.executable, __file__, "--one", backend, "--json", str(out), "--threads", str(args.threads),
                 "--batch-size", str(args.batch_size), "--device", args.device, "--replicate", str(args.replicate),
                 "--files", *args.files] + (["--rows", str(args.rows)] if args.rows else [])
        subprocess.run(child, check=True)
        results.append(json.loads(out.read_text()))
        out.unlink()
    print_tables(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
