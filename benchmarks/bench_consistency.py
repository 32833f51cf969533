"""Consistency stage benchmark: real vs mismatched separation, and embedding throughput.

For each real file from ../shared/data it normalizes the first N rows, scores them with
`ConsistencyStage` (which embeds user turns and assistant turns with all-MiniLM-L6-v2),
then builds mismatched pairs by shifting every response to the next row's prompt (reusing
the kept embeddings, so the model runs once per text) and reports: medians, robust SD,
the share of real / mismatched rows below median - k * robust SD for k = 2, 2.5, 3, the
rank AUC, and rows/s of the scoring step (2 texts per row, model load excluded) both per
wall-clock second and per CPU-second of this process (the latter is what to trust on a
shared, loaded machine).
These are the numbers quoted in `dataguard/stages/consistency.py`.

Only the system Python with dataguard's own dependencies is needed (no extra venv):

    python benchmarks/bench_consistency.py --threads 2            # all files, default sizes
    python benchmarks/bench_consistency.py --rows 200 --files alpaca_en_demo/alpaca_en_demo.json
    python benchmarks/bench_consistency.py --device cuda --rows 5000   # on a GPU machine

Output: a table on stdout and, with --json PATH, the same figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
KS = (2.0, 2.5, 3.0)


def load(path: Path, limit: int, replicate: int = 1) -> pa.Table:
    text = path.read_text(encoding="utf-8")
    records = [json.loads(x) for x in text.splitlines() if x.strip()] if path.suffix == ".jsonl" else json.loads(text)
    records = (records * replicate)[:limit] if replicate > 1 else records[:limit]
    batch = RawBatch(source=path.stem)
    for i, rec in enumerate(records):
        batch.add(i, rec)
    return Normalizer().normalize(batch, SourceOptions(name=path.stem)).kept


def measure(rel: str, rows: int, args: argparse.Namespace) -> dict[str, object]:
    table = load(DATA / rel, rows, args.replicate)
    stage = ConsistencyStage(keep_embeddings=True, threads=args.threads, batch_size=args.batch_size,
                             device=args.device)
    stage.score(table.slice(0, 2))  # load the model outside the timing
    t0, c0 = time.perf_counter(), time.process_time()
    scored = stage.score(table)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    real = scored.column("consistency_score").to_numpy()
    shift = np.roll(np.arange(scored.num_rows), -1)
    resp = scored.column(RESPONSE_COLUMN).take(pa.array(shift))
    shuffled_table = scored.set_column(scored.column_names.index(RESPONSE_COLUMN),
                                       scored.schema.field(RESPONSE_COLUMN), resp)
    shuffled = ConsistencyStage().score(shuffled_table).column("consistency_score").to_numpy()
    ok = np.isfinite(real) & np.isfinite(shuffled)
    real, shuffled = real[ok], shuffled[ok]
    med = float(np.median(real))
    rsd = float(1.4826 * np.median(np.abs(real - med)))
    out: dict[str, object] = {
        "file": rel, "rows": int(table.num_rows), "rows_per_s": table.num_rows / seconds,
        "rows_per_cpu_s": table.num_rows / cpu_seconds,
        "real_median": med, "robust_sd": rsd, "mismatched_median": float(np.median(shuffled)),
        "auc": float((real[:, None] > shuffled[None, :]).mean()),
    }
    for k in KS:
        cut = med - k * rsd
        out[f"real_flagged_k{k:g}"] = float(np.mean(real < cut))
        out[f"mismatched_flagged_k{k:g}"] = float(np.mean(shuffled < cut))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="*", default=list(FILES), help="paths relative to ../shared/data")
    parser.add_argument("--rows", type=int, default=None, help="rows per file (default: per-file sizes above)")
    parser.add_argument("--replicate", type=int, default=1, help="repeat the file's records to reach --rows")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = [measure(rel, args.rows or FILES.get(rel, 500), args) for rel in args.files]
    head = f"{'file':58} {'rows':>5} {'rows/s':>7} {'/cpu-s':>7} {'med':>6} {'rsd':>6} {'mism':>6} {'auc':>6}"
    head += "".join(f" {'r/m@' + format(k, 'g'):>12}" for k in KS)
    print(head)
    for r in results:
        line = (f"{r['file']:58} {r['rows']:>5} {r['rows_per_s']:>7.1f} {r['rows_per_cpu_s']:>7.1f} {r['real_median']:>6.3f} "
                f"{r['robust_sd']:>6.3f} {r['mismatched_median']:>6.3f} {r['auc']:>6.3f}")
        line += "".join(f" {r[f'real_flagged_k{k:g}']:>5.1%}/{r[f'mismatched_flagged_k{k:g}']:>6.1%}" for k in KS)
        print(line)
    print(f"device={args.device} threads={args.threads} batch_size={args.batch_size} "
          f"load={os.getloadavg()[0]:.1f} cpus={os.cpu_count()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
