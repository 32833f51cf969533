"""Near-duplicate recall, precision and throughput: dataguard's ``near_dedup`` against
datatrove's and data-juicer's MinHash deduplication, each with its own code, on the same rows.

Data: real rows from /work/shared/data (alpaca_en_demo, gpteacher toolformer 0.6, GSM8K
train+test, MMLU test, 20 Newsgroups test, DPO/glaive ShareGPT demos, TruthfulQA), exact
duplicates removed, rows of >= 30 words; a ``--dup-fraction`` share of the ``--rows`` is
planted copies of other rows (round-robin over the originals), one of three kinds:
``edit`` (3 % of the words replaced, deleted or inserted, at least one), ``reorder`` (two
sentences swapped, or a passage moved to the end) and ``template`` (the prompt re-written
in another template: ``### Instruction:``/``### Response:``, ``[INST]``, ``Question:``).
Rows are shuffled (seeded), so a copy may come before its original.

A copy is *found* when the tool does not keep both it and its original; recall = found /
planted. Precision = removed rows that belong to a planted group / removed rows (removals
among the unplanted rows count against it, although some are real near duplicates in the
source data, e.g. MMLU questions sharing one passage). Throughput = rows / wall seconds of
the dedup itself on one core: ours = summarize + fit + apply over 5,000-row batches in
process (and, separately, the whole ``Pipeline`` run with workers=1: reading JSONL,
normalising, writing Arrow shards); datatrove = its four MinHash steps (signatures,
buckets, clusters, filter) through ``LocalPipelineExecutor`` with one worker, reading and
writing JSONL as it is built to; data-juicer = ``compute_hash`` mapped over a Hugging Face
dataset then ``process``. All three at their defaults: 5-word shingles, Jaccard ~0.7.

Usage (the competitors need the benchmark venv: ``bash benchmarks/setup_bench_env_dedup.sh``)::

    nice python benchmarks/bench_near_dedup.py --rows 20000                 # ~6 min here
    nice python benchmarks/bench_near_dedup.py --rows 100000 --repeat 1     # ~12 min here
    nice python benchmarks/bench_near_dedup.py --rows 20000 --tools ours,pipeline

Measured 2026-12-01 on the shared 2-core machine (other jobs running: timings are best of 2
at 20k, single runs at 100k; the data are the same for every tool, seeded, so rows of one
table come from the commands above, the dataguard rows from a re-run after a speed-up that
changed no decision). ``recall`` = planted copies found; ``J>=.7`` = recall among the copies
whose exact word-5-shingle Jaccard to their original is >= 0.7 (the near duplicates by
definition: 3,725 of 4,000 at 20k, 64,053 of 69,103 at 100k); edit/reord/templ = recall per
kind; ``unplanted`` = removed rows outside any planted group.

20,000 rows (16,000 real originals, 4,000 planted copies)::

    tool                                   recall  J>=.7   edit  reord  templ   prec  unplanted  rows/s
    dataguard near_dedup (defaults)         0.928  0.996  0.966  0.821  0.996  0.984     61      7676
    dataguard near_dedup verify=false       0.918  0.974  0.943  0.815  0.996  0.982     66      7990
    dataguard Pipeline, workers=1 (e2e)     0.928  0.996  0.966  0.821  0.996  0.984     61      4393
    datatrove 0.10.1 MinHash (14x8)         0.907  0.942  0.891  0.842  0.986  0.910    364       258
    data-juicer 1.6.1 MinHash (256 perm)    0.768  0.812  0.838  0.486  0.979  0.927    246       926

100,000 rows (all 30,897 usable real rows as originals, 69,103 planted copies, ~2.2 per
original: every row is in a planted group, so precision is 1.0 for all and not shown)::

    tool                                   recall  J>=.7   edit  reord  templ  seconds  rows/s
    dataguard near_dedup (defaults)         0.951  0.998  0.981  0.875  0.999    17.7    5636
    dataguard near_dedup verify=false       0.949  0.988  0.970  0.880  0.998    13.7    7311
    dataguard Pipeline, workers=1 (e2e)     0.951  0.998  0.981  0.875  0.999    27.7    3615
    datatrove 0.10.1 MinHash (14x8)         0.949  0.973  0.947  0.905  0.997   271.0     369
    data-juicer 1.6.1 MinHash (256 perm)    0.866  0.904  0.904  0.701  0.991    59.9    1669

Reading: at equal settings (5-word shingles, ~0.7) dataguard finds more planted copies than
both at higher precision: candidates are checked with the exact Jaccard, so the bands can
lean to recall (20 x 6) without letting false candidates through; both others link every
LSH candidate unchecked (their unplanted removals; dataguard's 61 are real near duplicates
in the sources, every link an exact Jaccard >= 0.7: MMLU questions sharing one passage,
cross-posted newsgroup messages). datatrove's text normalisation (digits
-> 0, punctuation dropped) catches more sentence swaps but also merges rows that differ
only in numbers (GSM8K, MMLU: most of its 364 unplanted removals). Throughput: 15-30x
datatrove, 3.4-8x data-juicer (one core each; data-juicer's time excludes building its
dataset, ours excludes nothing but file I/O, which the Pipeline row includes). 100k rows
needs copies of copies because the shared data hold ~31k distinct rows of >= 30 words.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
BENCH_PY = Path("/work/benchenv-dedup/bin/python")
MIN_WORDS = 30
TEMPLATES = (
    lambda p: f"### Instruction:\n{p}\n\n### Response:",
    lambda p: f"[INST] {p} [/INST]",
    lambda p: f"Question: {p}\nAnswer:",
)


# ----------------------------------------------------------------------------- data
def load_base() -> list[tuple[str, str]]:
    """(prompt, response) pairs of real rows, exact duplicates removed, >= MIN_WORDS words."""
    rows: list[tuple[str, str]] = []

    def alpaca(path: Path) -> None:
        for r in json.loads(path.read_text(encoding="utf-8")):
            rows.append((r["instruction"] + ("\n" + r["input"] if r.get("input") else ""), r["output"]))

    alpaca(SHARED / "alpaca_en_demo/alpaca_en_demo.json")
    alpaca(SHARED / "gpteacher_toolformer/toolformer-similarity-0.6-dataset.json")
    for name in ("train.jsonl", "test.jsonl"):
        for line in (SHARED / "gsm8k" / name).read_text(encoding="utf-8").split("\n"):
            if not line.strip():
                continue
            r = json.loads(line)
            rows.append((r["question"], r["answer"]))
    for line in (SHARED / "mmlu/mmlu_test.jsonl").read_text(encoding="utf-8").split("\n"):
        if not line.strip():
            continue
        r = json.loads(line)
        choices = "\n".join(f"{'ABCD'[i]}. {c}" for i, c in enumerate(r["choices"]))
        rows.append((f"{r['question']}\n{choices}", "ABCD"[r["answer"]]))
    with gzip.open(SHARED / "20news_label_errors/20news_test_texts.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            rows.append((r["text"], r["label_name"]))
    for name in ("sharegpt_dpo_demo/dpo_en_demo.json", "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json"):
        for r in json.loads((SHARED / name).read_text(encoding="utf-8")):
            turns = r["conversations"]
            user = next((t["value"] for t in turns if t["from"] == "human"), "")
            answer = r["chosen"]["value"] if "chosen" in r else next((t["value"] for t in turns
                                                                       if t["from"] == "gpt"), "")
            rows.append((user, answer))
    import csv

    with open(SHARED / "truthfulqa/TruthfulQA.csv", encoding="utf-8", newline="") as fh:
        for r in csv.DictReader(fh):
            rows.append((r["Question"], r["Best Answer"]))
    seen: set[tuple[str, str]] = set()
    out = []
    for p, r in rows:
        if p.strip() and r.strip() and (p, r) not in seen and len((p + " " + r).split()) >= MIN_WORDS:
            seen.add((p, r))
            out.append((p, r))
    return out


def edit(text: str, rng: random.Random) -> str:
    words = text.split(" ")
    for _ in range(max(1, round(0.03 * len(words)))):
        pos = rng.randrange(len(words))
        op = rng.choice(("replace", "delete", "insert"))
        if op == "replace":
            words[pos] = rng.choice(("really", "very", "quite", "also", "then"))
        elif op == "delete" and len(words) > 1:
            del words[pos]
        else:
            words.insert(pos, rng.choice(("really", "very", "quite", "also", "then")))
    return " ".join(words)


def reorder(text: str, rng: random.Random) -> str:
    parts = re.split(r"(?<=[.!?])\s+", text)
    if len(parts) >= 3:
        i = rng.randrange(len(parts) - 1)
        parts[i], parts[i + 1] = parts[i + 1], parts[i]
        return " ".join(parts)
    words = text.split(" ")
    cut = len(words) // 3 or 1
    return " ".join(words[cut:] + words[:cut])  # a leading passage moved to the end


def plant(base: list[tuple[str, str]], n_rows: int, dup_fraction: float, seed: int) -> dict[str, Any]:
    """Rows (id, prompt, response), shuffled; planted copy id -> (original id, kind)."""
    rng = random.Random(seed)
    n_dup = int(round(n_rows * dup_fraction))
    n_orig = min(len(base), n_rows - n_dup)
    n_dup = n_rows - n_orig
    originals = rng.sample(base, n_orig)
    rows = [(f"o{i}", p, r) for i, (p, r) in enumerate(originals)]
    truth: dict[str, tuple[str, str]] = {}
    for j in range(n_dup):
        i = j % n_orig
        p, r = originals[i]
        kind = ("edit", "reorder", "template")[j % 3]
        if kind == "edit":
            if len(r.split()) >= len(p.split()):
                r = edit(r, rng)
            else:
                p = edit(p, rng)
        elif kind == "reorder":
            if len(r.split()) >= len(p.split()):
                r = reorder(r, rng)
            else:
                p = reorder(p, rng)
        else:
            p = TEMPLATES[j % len(TEMPLATES)](p)
        rows.append((f"d{j}", p, r))
        truth[f"d{j}"] = (f"o{i}", kind)
    rng.shuffle(rows)
    return {"rows": rows, "truth": truth}


def planted_above_threshold(rows: list[tuple[str, str, str]], truth: dict[str, tuple[str, str]],
                            threshold: float) -> set[str]:
    """Planted copies that are near duplicates by definition (exact Jaccard >= threshold)."""
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dataguard.text import minhash

    pos = {i: n for n, (i, _, _) in enumerate(rows)}
    values, offsets = minhash.shingle_sets([p + "\n" + r for _, p, r in rows], "word", 5)
    ids = list(truth)
    pairs = np.array([[pos[truth[d][0]], pos[d]] for d in ids], dtype=np.int64).reshape(-1, 2)
    jac = minhash.exact_jaccard(values, offsets, pairs)
    return {d for d, j in zip(ids, jac.tolist(), strict=True) if j >= threshold}


def score(removed: set[str], truth: dict[str, tuple[str, str]], above: set[str]) -> dict[str, Any]:
    in_groups = set(truth) | {o for o, _ in truth.values()}
    found = {d for d, (o, _) in truth.items() if d in removed or o in removed}
    by_kind = {}
    for kind in ("edit", "reorder", "template"):
        ids = [d for d, (_, k) in truth.items() if k == kind]
        by_kind[kind] = sum(d in found for d in ids) / max(len(ids), 1)
    good = sum(r in in_groups for r in removed)
    return {"removed": len(removed), "recall": len(found) / max(len(truth), 1),
            "recall_j07": len(found & above) / max(len(above), 1),
            "precision": good / max(len(removed), 1), "unplanted_removed": len(removed) - good, **by_kind}


# ----------------------------------------------------------------------------- tools
def run_ours(rows: list[tuple[str, str, str]], **params: Any) -> tuple[set[str], float]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dataguard.records import canonical_table
    from dataguard.stages.near_dedup import NearDedupStage

    table = canonical_table([{"id": i, "source": "bench", "messages": [
        {"role": "user", "content": p}, {"role": "assistant", "content": r}]} for i, p, r in rows])
    stage = NearDedupStage(**params)
    t0 = time.perf_counter()
    batches = [table.slice(s, 5000) for s in range(0, table.num_rows, 5000)]
    stage.fit([stage.summarize(b) for b in batches])
    removed: set[str] = set()
    for b in batches:
        removed.update(stage.apply(b).rejected.column("id").to_pylist())
    return removed, time.perf_counter() - t0


def run_ours_pipeline(rows: list[tuple[str, str, str]], work: Path) -> tuple[set[str], float]:
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline
    from dataguard.stages.near_dedup import NearDedupStage

    work.mkdir(parents=True, exist_ok=True)
    path = work / "messages.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i, p, r in rows:
            fh.write(json.dumps({"id": i, "messages": [{"role": "user", "content": p},
                                                       {"role": "assistant", "content": r}]}) + "\n")
    t0 = time.perf_counter()
    result = Pipeline([NearDedupStage()], workers=1).run([InputSpec(path=path, name="bench")], work / "out")
    elapsed = time.perf_counter() - t0
    rejected = result.rejected_table()
    metas = [json.loads(rec).get("meta") for rec in rejected.column("record").to_pylist()]
    return {json.loads(m)["source_id"] for m in metas}, elapsed  # the input's own id is kept in meta


def run_other(tool: str, rows: list[tuple[str, str, str]], work: Path) -> tuple[set[str], float] | str:
    """Run `tool` in the benchmark venv (this file with --tool); an error text if it cannot."""
    if not BENCH_PY.exists():
        return f"no benchmark venv at {BENCH_PY} (run benchmarks/setup_bench_env_dedup.sh)"
    src = work / f"{tool}_in"
    src.mkdir(parents=True, exist_ok=True)
    with (src / "data.jsonl").open("w", encoding="utf-8") as fh:
        for i, p, r in rows:
            fh.write(json.dumps({"id": i, "text": p + "\n" + r}) + "\n")
    out = work / f"{tool}_result.json"
    proc = subprocess.run([str(BENCH_PY), __file__, "--tool", tool, "--work", str(work)], capture_output=True,
                          text=True)
    if proc.returncode != 0 or not out.exists():
        return f"{tool} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    res = json.loads(out.read_text())
    return set(res["removed"]), res["seconds"]


def _datatrove(work: Path) -> dict[str, Any]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    cfg = MinhashConfig()
    d = work / "datatrove"
    src = str(work / "datatrove_in")
    t0 = time.perf_counter()
    steps = [
        ([JsonlReader(src), MinhashDedupSignature(output_folder=str(d / "sigs"), config=cfg)], 1),
        ([MinhashDedupBuckets(input_folder=str(d / "sigs"), output_folder=str(d / "buckets"), config=cfg)],
         cfg.num_buckets),
        ([MinhashDedupCluster(input_folder=str(d / "buckets"), output_folder=str(d / "remove"), config=cfg)], 1),
        ([JsonlReader(src), MinhashDedupFilter(input_folder=str(d / "remove"),
                                               exclusion_writer=JsonlWriter(str(d / "removed"), compression=None)),
          JsonlWriter(str(d / "kept"), compression=None)], 1),
    ]
    for i, (pipeline, tasks) in enumerate(steps):
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=str(d / f"logs{i}")).run()
    seconds = time.perf_counter() - t0
    removed = [doc["id"] for f in sorted((d / "removed").glob("*.jsonl")) for doc in _json_stream(f)]
    return {"removed": removed, "seconds": seconds}


def _json_stream(path: Path) -> list[dict[str, Any]]:
    """Every JSON object in a file, whatever separates them (a text may hold a raw U+2028)."""
    text = path.read_text(encoding="utf-8")
    dec = json.JSONDecoder(strict=False)
    out, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        obj, pos = dec.raw_decode(text, pos)
        out.append(obj)


def _datajuicer(work: Path) -> dict[str, Any]:
    from data_juicer.ops.deduplicator.document_minhash_deduplicator import DocumentMinhashDeduplicator
    from datasets import Dataset, disable_progress_bar

    disable_progress_bar()
    rows = [json.loads(line) for line in (work / "datajuicer_in/data.jsonl").read_text(encoding="utf-8").split("\n")
            if line.strip()]
    ds = Dataset.from_list(rows)
    t0 = time.perf_counter()
    op = DocumentMinhashDeduplicator()
    hashed = ds.map(op.compute_hash, num_proc=1)
    kept, _ = op.process(hashed)
    seconds = time.perf_counter() - t0
    kept_ids = set(kept["id"])
    return {"removed": [r["id"] for r in rows if r["id"] not in kept_ids], "seconds": seconds}


# ----------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--dup-fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2, help="best of N timings per tool (shared machine)")
    ap.add_argument("--tools", default="ours,pipeline,datatrove,datajuicer",
                    help="comma-separated subset of: ours, pipeline, datatrove, datajuicer")
    ap.add_argument("--tool", choices=("datatrove", "datajuicer"), help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tool:  # inside the benchmark venv
        res = _datatrove(args.work) if args.tool == "datatrove" else _datajuicer(args.work)
        (args.work / f"{args.tool}_result.json").write_text(json.dumps(res))
        return
    base = load_base()
    data = plant(base, args.rows, args.dup_fraction, args.seed)
    rows, truth = data["rows"], data["truth"]
    print(f"{len(rows)} rows ({len(rows) - len(truth)} originals from {len(base)} usable real rows, "
          f"{len(truth)} planted copies)", flush=True)
    above = planted_above_threshold(rows, truth, 0.7)
    print(f"planted copies whose exact Jaccard (word 5-shingles) to their original is >= 0.7: "
          f"{len(above)} of {len(truth)}", flush=True)
    results: list[tuple[str, dict[str, Any] | str]] = []
    tools = set(args.tools.split(","))
    for label, params in (("dataguard near_dedup (defaults)", {}),
                          ("dataguard near_dedup verify=false", {"verify": False})):
        if "ours" not in tools:
            break
        removed, secs = run_ours(rows, **params)
        for _ in range(args.repeat - 1):
            secs = min(secs, run_ours(rows, **params)[1])
        results.append((label, {**score(removed, truth, above), "seconds": secs, "rows_s": len(rows) / secs}))
        print(label, results[-1][1], flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_near_dedup_") as tmp:
        work = Path(tmp)
        if "pipeline" in tools:
            removed, secs = run_ours_pipeline(rows, work)
            for r in range(args.repeat - 1):
                secs = min(secs, run_ours_pipeline(rows, work / f"again{r}")[1])
            results.append(("dataguard Pipeline, workers=1 (end to end)",
                            {**score(removed, truth, above), "seconds": secs, "rows_s": len(rows) / secs}))
            print(results[-1], flush=True)
        for tool, label in (("datatrove", "datatrove 0.10.1 MinHash (14x8)"),
                            ("datajuicer", "data-juicer 1.6.1 MinHash (256 perm)")):
            if tool in tools:
                got = run_other(tool, rows, work)
                for r in range(args.repeat - 1):
                    again = run_other(tool, rows, work / f"again{r}")
                    if not isinstance(got, str) and not isinstance(again, str):
                        got = (got[0], min(got[1], again[1]))
                if isinstance(got, str):
                    results.append((label, got))
                else:
                    results.append((label, {**score(got[0], truth, above), "seconds": got[1],
                                            "rows_s": len(rows) / got[1]}))
                print(results[-1], flush=True)
    print()
    head = f"{'tool':44} {'recall':>7} {'J>=.7':>6} {'edit':>6} {'reord':>6} {'templ':>6} {'prec':>6} {'unplanted':>9} " \
           f"{'seconds':>8} {'rows/s':>8}"
    print(head)
    print("-" * len(head))
    for label, r in results:
        if isinstance(r, str):
            print(f"{label:44} {r}")
            continue
        print(f"{label:44} {r['recall']:7.3f} {r['recall_j07']:6.3f} {r['edit']:6.3f} {r['reorder']:6.3f} {r['template']:6.3f} "
              f"{r['precision']:6.3f} {r['unplanted_removed']:9d} {r['seconds']:8.1f} {r['rows_s']:8.0f}")


if __name__ == "__main__":
    main()
