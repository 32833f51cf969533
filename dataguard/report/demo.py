"""A realistic synthetic pipeline output folder, for report tests, benchmarks and screenshots.

It writes what the pipeline writes (manifest.json, run.json, data/ and rejected/ Arrow IPC
stream shards) with counts that balance and stage descriptions in the block format of
dataguard/stage.py, so the report can be developed and measured without running the
pipeline. ``payloads=True`` plants script-injection strings in every place dataset text
can reach (records, ids, sources, labels, details, description blocks, input names).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.records import CANONICAL_SCHEMA, REJECTED_SCHEMA, json_dumps

PAYLOADS = (
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=2;document.body.setAttribute(\'data-pwned\',\'2\')">',
    "[click me](javascript:window.__pwned=3) <a href=\"javascript:window.__pwned=3\">link</a>",
    "</textarea></pre></details><script>window.__pwned=4</script>",
    "<svg onload=\"window.__pwned=5\"></svg><!-- </script> --><iframe src=\"https://example.com\"></iframe>",
    "\"'><img src=\"https://example.com/track.gif\"><style>body{display:none}</style>",
)

PAIRS = (
    ("Give three tips for staying healthy.",
     "1. Eat a balanced diet with plenty of fruit and vegetables.\n2. Exercise regularly.\n3. Get enough sleep."),
    ("Translate 'Where is the train station?' into French.", "Où est la gare ?"),
    ("Write a Python function that returns the n-th Fibonacci number.",
     "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"),
    ("Summarize the plot of Romeo and Juliet in two sentences.",
     "Two young lovers from feuding families in Verona marry in secret. A chain of misunderstandings ends "
     "with both taking their own lives, which finally reconciles their families."),
    ("What is the capital of Australia?", "The capital of Australia is Canberra."),
    ("Explain what a hash table is to a beginner.",
     "A hash table stores values under keys. A hash function turns each key into a position in an array, "
     "so looking a key up takes about the same time however many items are stored."),
    ("Classify the sentiment of: 'The battery died after two days.'", "Negative."),
    ("Rewrite this sentence in the passive voice: The committee approved the budget.",
     "The budget was approved by the committee."),
)
GSM8K_ITEM = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips to her "
              "friends in May. How many clips did Natalia sell altogether in April and May?")
INTENTS = ("card_arrival", "lost_or_stolen_card", "exchange_rate", "top_up_failed", "pin_blocked",
           "transfer_timing", "refund_not_showing_up", "cash_withdrawal_charge")
UTTERANCES = ("I am still waiting on my card?", "My card was stolen, what do I do?",
              "What exchange rate do you use?", "Why did my top up fail?", "My PIN is blocked",
              "How long does a transfer take?", "I don't see my refund yet", "Why was I charged for a withdrawal?")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_stream(path: Path, table: pa.Table, batch_rows: int = 4096) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return {"path": str(path.relative_to(path.parent.parent)), "rows": table.num_rows,
            "bytes": path.stat().st_size, "sha256": _sha(path)}


def _conversation(rng: np.random.Generator, i: int, payload: str | None) -> list[dict[str, str]]:
    q, a = PAIRS[int(rng.integers(len(PAIRS)))]
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    if i % 5 == 0:
        msgs.insert(0, {"role": "system", "content": "You are a helpful assistant."})
    if payload:
        msgs[-2]["content"] = f"{q} {payload}"
        msgs[-1]["content"] = f"{a}\n{payload}"
    return msgs


def _rejected_record(reason: str, rng: np.random.Generator, i: int, payload: str | None) -> tuple[str, str]:
    """(detail, record) for one rejected row of the given reason, looking like the real stage's."""
    if reason == "unparseable":
        raw = '{"instruction": "Name a prime number", "output": "7"' + (payload or "") + "  <- truncated line"
        return f"invalid JSON at line {i + 1}: Expecting ',' delimiter", raw
    if reason == "unknown_format":
        return "fields {foo, bar} match no known format", json.dumps({"foo": payload or "x", "bar": [1, 2]})
    msgs = _conversation(rng, i, payload)
    row: dict[str, Any] = {"id": f"alpaca:{i}", "source": "alpaca", "messages": msgs, "label": None,
                           "meta": json.dumps({"line": i + 1})}
    detail = reason
    if reason == "empty_response":
        msgs[-1]["content"] = ""
        detail = "assistant turn is empty"
    elif reason == "unfilled_placeholder":
        msgs[-1]["content"] = "Dear {{name}}, thank you for your order."
        detail = "placeholder {{name}} in assistant turn"
    elif reason == "too_long":
        msgs[-1]["content"] = ("The quick brown fox jumps over the lazy dog. " * 300).strip()
        row["n_tokens"] = 3012
        detail = "3012 tokens > cap 812 (action=drop)"
    elif reason == "too_short":
        msgs[-1]["content"] = "Ok."
        row["n_tokens"] = 5
        detail = "5 tokens < min_tokens 8"
    elif reason == "char_repetition":
        msgs[-1]["content"] = "Sure!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!! " + "ha" * 80
        row["response_char_rep"] = 0.46
        detail = "response char repetition 0.46 >= 0.30"
    elif reason == "too_many_urls":
        msgs[-1]["content"] = "See https://a.example/1 https://b.example/2 https://c.example/3 https://d.example/4"
        row["response_urls"] = 4
        detail = "response has 4 URLs >= 3"
    elif reason == "word_repetition":
        msgs[-1]["content"] = "I think that " * 40
        row["response_word_rep"] = 0.71
        detail = "duplicate 3-gram fraction 0.71 > 0.18"
    elif reason == "contamination":
        msgs[-2]["content"] = GSM8K_ITEM
        row["overlap_ratio"] = 0.97
        row["overlap_ref"] = "gsm8k_test:0"
        detail = "overlap 0.97 >= 0.5 with gsm8k_test item 0 (longest span 41 tokens)"
    elif reason == "low_consistency":
        msgs[-1]["content"] = "Paris is the capital of France."
        row["consistency"] = -0.04
        detail = "consistency -0.04 < threshold 0.12"
    elif reason == "label_issue":
        k = int(rng.integers(len(INTENTS)))
        row["messages"] = [{"role": "user", "content": UTTERANCES[k] + (f" {payload}" if payload else "")}]
        row["label"] = INTENTS[(k + 1) % len(INTENTS)]
        row["label_quality"] = 0.03
        row["suggested_label"] = INTENTS[k]
        detail = f"given {row['label']!r}, suggested {INTENTS[k]!r} (quality 0.03)"
    elif reason == "exact_duplicate":
        detail = "duplicate of alpaca:17"
    if payload:
        detail = f"{detail} {payload}"
        row["source"] = f"alpaca{payload}" if i % 2 else "alpaca"
    return detail, json_dumps(row)


STAGE_REASONS: dict[str, dict[str, float]] = {
    "normalize": {"unparseable": 0.002, "unknown_format": 0.001, "empty_response": 0.004, "unfilled_placeholder": 0.0015},
    "dedup": {"exact_duplicate": 0.012},
    "consistency": {"low_consistency": 0.006},
    "length": {"too_long": 0.01, "too_short": 0.003},
    "quality": {"char_repetition": 0.004, "too_many_urls": 0.0008, "word_repetition": 0.002},
    "overlap": {"contamination": 0.0012},
    "noise": {"label_issue": 0.03},
    "longtail": {},
    "drift": {},
}
SFT = ("normalize", "dedup", "consistency", "length", "quality", "overlap")
CLASSIFICATION = ("normalize", "noise", "longtail", "drift")


def _hist(rng: np.random.Generator, edges: np.ndarray, sample: np.ndarray) -> list[int]:
    return np.histogram(sample, bins=edges)[0].astype(int).tolist()


def _description(name: str, rng: np.random.Generator, rows_in: int, rejected: dict[str, int],
                 payloads: bool) -> dict[str, Any]:
    p = PAYLOADS[0] if payloads else ""
    n = min(rows_in, 20000)
    if name == "normalize":
        return {"title": "Template normalization", "summary": {"sources": 3, "formats_detected": 3,
                                                               "alias_mappings": 2},
                "blocks": [
                    {"type": "table", "title": "Formats per source", "columns": ["source", "alpaca", "sharegpt",
                                                                                  "openai_messages", "unparsed"],
                     "rows": [["alpaca" + p, int(rows_in * 0.5), 0, 0, rejected.get("unparseable", 0)],
                              ["sharegpt", 0, int(rows_in * 0.3), 0, 0],
                              ["messages", 0, 0, rows_in - int(rows_in * 0.5) - int(rows_in * 0.3),
                               rejected.get("unknown_format", 0)]]},
                    {"type": "table", "title": "Alias mappings applied", "columns": ["source", "from", "to", "rows"],
                     "rows": [["alpaca", "question", "instruction", 812], ["alpaca", "answer", "output", 812]]},
                ]}
    if name == "dedup":
        return {"title": "Exact duplicates", "summary": {"duplicate_groups": rejected.get("exact_duplicate", 0) // 2,
                                                        "rows_removed": rejected.get("exact_duplicate", 0)}, "blocks": []}
    if name == "consistency":
        edges = np.linspace(-0.2, 1.0, 49)
        s = np.clip(rng.normal(0.55, 0.17, n), -0.2, 1.0)
        return {"title": "Prompt–response consistency",
                "summary": {"model": "all-MiniLM-L6-v2", "threshold": 0.12, "median": 0.55,
                            "rows_flagged": rejected.get("low_consistency", 0)},
                "blocks": [{"type": "histogram", "title": "Cosine similarity of prompt and response",
                            "edges": edges.round(4).tolist(), "series": {"rows": _hist(rng, edges, s)},
                            "markers": [{"label": "threshold", "value": 0.12}], "x_label": "cosine similarity"},
                           {"type": "examples", "title": "Lowest-scoring rows", "items": [
                               {"id": "alpaca:77", "text": "Q: What is the capital of Australia?\nA: Paris is the capital "
                                "of France." + (" " + p if p else ""), "note": "similarity -0.04"}]}]}
    if name == "length":
        edges = np.unique(np.round(np.geomspace(4, 8192, 41))).astype(float)
        before = np.exp(rng.normal(5.2, 0.9, n))
        after = np.minimum(before, 812)
        return {"title": "Length percentile truncation",
                "summary": {"percentile": 90, "factor": 1.5, "cap": 812, "action": "truncate",
                            "rows_truncated": int(rows_in * 0.06), "rows_dropped": rejected.get("too_long", 0),
                            "rows_too_short": rejected.get("too_short", 0), "share_tokens_removed": 0.0412},
                "blocks": [{"type": "histogram", "title": "Tokens per record, before and after",
                            "edges": edges.tolist(), "series": {"before": _hist(rng, edges, before),
                                                                "after": _hist(rng, edges, after)},
                            "markers": [{"label": "p90", "value": 541}, {"label": "cap", "value": 812},
                                        {"label": "min", "value": 8}], "x_label": "tokens (Qwen tokenizer)"}]}
    if name == "quality":
        e1 = np.linspace(0, 0.6, 31)
        e2 = np.arange(0, 9, 1.0)
        r1 = np.clip(rng.gamma(2, 0.03, n), 0, 0.6)
        r2 = np.clip(rng.poisson(0.3, n), 0, 8)
        text = "Sure!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!! hahahahahahahahahahahahaha"
        return {"title": "Repetition and URL filter",
                "summary": {"char_rep_threshold": 0.3, "url_threshold": 3, "word_rep_threshold": 0.18},
                "blocks": [{"type": "histogram", "title": "Adjacent repeated-character ratio (response)",
                            "edges": e1.round(4).tolist(), "series": {"rows": _hist(rng, e1, r1)},
                            "markers": [{"label": "threshold", "value": 0.3}], "x_label": "ratio"},
                           {"type": "histogram", "title": "URLs per response", "edges": e2.tolist(),
                            "series": {"rows": _hist(rng, e2, r2)}, "markers": [{"label": "threshold", "value": 3}],
                            "x_label": "URLs"},
                           {"type": "examples", "title": "Examples per reason", "items": [
                               {"id": "alpaca:412", "label": "char_repetition", "text": text, "spans": [[5, 35], [36, 62]],
                                "note": "ratio 0.46 >= 0.30"},
                               {"id": "sharegpt:9", "label": "too_many_urls" + p,
                                "text": "See https://a.example/1 https://b.example/2 https://c.example/3 " + p,
                                "spans": [[4, 23], [24, 43], [44, 63]], "note": "4 URLs"}]}]}
    if name == "overlap":
        e = np.linspace(0, 1, 21)
        r = np.clip(rng.beta(0.3, 12, n), 0, 1)
        ref = GSM8K_ITEM
        text = "Here is a problem for you: " + ref.lower().replace(",", "") + " Answer: 72" + (" " + p if p else "")
        return {"title": "Train / benchmark overlap (13-gram)",
                "summary": {"n": 13, "references": 2, "threshold": 0.5, "action": "drop",
                            "rows_contaminated": rejected.get("contamination", 0)},
                "blocks": [{"type": "table", "title": "Contaminated rows per reference set",
                            "columns": ["reference", "items", "rows flagged", "max overlap"],
                            "rows": [["gsm8k_test", 1319, rejected.get("contamination", 0), 0.97], ["mmlu_test", 14042, 0, 0.21]]},
                           {"type": "histogram", "title": "Overlap ratio", "edges": e.round(3).tolist(),
                            "series": {"rows": _hist(rng, e, r)}, "markers": [{"label": "threshold", "value": 0.5}],
                            "x_label": "share of the row's tokens in matching 13-grams"},
                           {"type": "examples", "title": "Examples with the overlapping spans", "items": [
                               {"id": "alpaca:1204", "text": text, "spans": [[27, 27 + len(ref) - 2]],
                                "reference": ref, "reference_spans": [[0, len(ref)]], "reference_id": "gsm8k_test:0",
                                "note": "overlap 0.97, longest span 41 tokens"}]}]}
    if name == "noise":
        k = len(INTENTS)
        m = np.full((k, k), 0.0)
        for i in range(k):
            m[i] = rng.dirichlet(np.full(k, 0.3)) * 0.12
            m[i, i] = 0.0
            m[i] = m[i] / m[i].sum() * 0.12
            m[i, i] = 0.88
        counts = (rng.dirichlet(np.full(k, 2)) * rows_in).astype(int).tolist()
        return {"title": "Confident-learning label noise",
                "summary": {"classifier": "logreg on MiniLM embeddings", "folds": 5,
                            "label_issues": rejected.get("label_issue", 0), "action": "drop"},
                "blocks": [{"type": "bar", "title": "Rows per class", "labels": list(INTENTS),
                            "series": {"given": counts, "after cleaning": [int(c * 0.97) for c in counts]}},
                           {"type": "matrix", "title": "Noise transition P(given | true)",
                            "row_labels": list(INTENTS), "col_labels": list(INTENTS),
                            "values": m.T.round(4).tolist(), "row_title": "given", "col_title": "true"},
                           {"type": "table", "title": "Worst label issues",
                            "columns": ["id", "text", "given", "suggested", "quality"],
                            "rows": [[f"banking:{i}", UTTERANCES[i % k] + (" " + p if p and i == 0 else ""),
                                      INTENTS[(i + 1) % k], INTENTS[i % k], round(0.01 + i * 0.004, 3)] for i in range(8)]}]}
    if name == "longtail":
        k = len(INTENTS)
        counts = [int(rows_in * 0.4 / (i + 1) ** 1.3) + 5 for i in range(k)]
        pri = np.array(counts) / sum(counts)
        return {"title": "Long-tail rebalancing",
                "summary": {"scheme": "effective_number", "beta": 0.999, "tau": 1.0, "imbalance_ratio": round(counts[0] / counts[-1], 1)},
                "blocks": [{"type": "bar", "title": "Class counts and effective counts after weighting", "labels": list(INTENTS),
                            "series": {"before": counts, "weighted": [round(c * (1 - 0.999) / (1 - 0.999 ** c) * 50, 1) for c in counts]}},
                           {"type": "table", "title": "Weights and logit offsets", "columns": ["class", "rows", "prior", "weight", "logit offset"],
                            "rows": [[INTENTS[i], counts[i], round(float(pri[i]), 4), round(float(1 / (pri[i] * k)), 3),
                                      round(math.log(pri[i]), 4)] for i in range(k)]},
                           {"type": "table", "title": "Curriculum", "columns": ["phase", "classes", "rows covered", "tail up-weight"],
                            "rows": [[1, 2, "52%", 1.0], [2, 4, "81%", 1.0], [3, k, "100%", 2.0]]}]}
    if name == "drift":
        return {"title": "Distribution shift (PSI) vs validation split",
                "summary": {"reference": "validation split", "bins": 10, "epsilon": 1e-4},
                "blocks": [{"type": "table", "title": "PSI per column",
                            "columns": ["column", "kind", "PSI before", "verdict before", "PSI after", "verdict after"],
                            "rows": [["n_tokens", "numeric", 0.031, "stable", 0.031, "stable"],
                                     ["label", "categorical", 0.342, "major", 0.062, "stable"],
                                     ["source", "categorical", 0.142, "moderate", 0.142, "moderate"],
                                     ["text (domain classifier AUC 0.58)", "embedding", 0.18, "moderate", None, None]]},
                           {"type": "text", "title": "Reading PSI", "text": "< 0.1 stable · 0.1–0.25 moderate · >= 0.25 major.\n"
                            "Resampling by label brought the label PSI from major to stable." + (" " + p if p else "")}]}
    return {"title": name, "summary": {}, "blocks": []}


def write_demo_output(out_dir: str | Path, rows_in: int = 5000, stages: tuple[str, ...] = SFT, seed: int = 0,
                      payloads: bool = False, kept_rows: int | None = 2000, rejected_shard_rows: int = 50_000,
                      extra_blocks: list[dict] | None = None) -> Path:
    """Write a complete, balanced output folder. ``kept_rows`` caps the kept rows actually
    written (the report only previews them); None writes them all."""
    out = Path(out_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)
    (out / "rejected").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    remaining = rows_in
    stage_entries = []
    all_rej: list[tuple[str, str]] = []
    for name in stages:
        reasons = {}
        for reason, rate in STAGE_REASONS.get(name, {}).items():
            cnt = int(round(rows_in * rate))
            cnt = max(cnt, 1) if rows_in >= 200 else cnt
            reasons[reason] = min(cnt, remaining)
            remaining -= reasons[reason]
        rej = sum(reasons.values())
        stage_rows_in = remaining + rej
        desc = _description(name, rng, rows_in, reasons, payloads)
        if extra_blocks and name == stages[-1]:
            desc["blocks"].extend(extra_blocks)
        stage_entries.append({"name": name, "rows_in": stage_rows_in, "rows_kept": remaining, "rows_rejected": rej,
                              "reasons": reasons, "seconds": round(0.4 + stage_rows_in / 120_000, 3), "description": desc})
        all_rej.extend((name, r) for r, c in reasons.items() for _ in range(c))
    rows_kept = remaining
    rows_rejected = rows_in - rows_kept

    # Rejected shards; the rarest reasons last, so bounded sampling has to look far.
    order = sorted(range(len(all_rej)), key=lambda j: (STAGE_REASONS[all_rej[j][0]][all_rej[j][1]] < 0.001, j))
    cols: dict[str, list] = {k: [] for k in REJECTED_SCHEMA.names}
    for j, idx in enumerate(order):
        stage, reason = all_rej[idx]
        payload = PAYLOADS[j % len(PAYLOADS)] if payloads and j % 3 == 0 else None
        detail, record = _rejected_record(reason, rng, j, payload)
        src = json.loads(record).get("source", "alpaca") if record.startswith("{\"") and "messages" in record else "alpaca"
        cols["id"].append(f"alpaca:{j}" + (f"{payload}" if payload and j % 2 == 0 else ""))
        cols["source"].append(src)
        cols["stage"].append(stage)
        cols["reason"].append(reason)
        cols["detail"].append(detail)
        cols["record"].append(record)
    rej_table = pa.table(cols, schema=REJECTED_SCHEMA)
    rej_files = []
    for k in range(0, max(rej_table.num_rows, 1), rejected_shard_rows):
        rej_files.append(_write_stream(out / "rejected" / f"part-{len(rej_files):05d}.arrow",
                                       rej_table.slice(k, rejected_shard_rows)))

    n_write = rows_kept if kept_rows is None else min(rows_kept, kept_rows)
    kept = []
    for i in range(n_write):
        payload = PAYLOADS[i % len(PAYLOADS)] if payloads and i < 6 else None
        kept.append({"id": f"alpaca:{100000 + i}", "source": "alpaca", "messages": _conversation(rng, i, payload),
                     "label": INTENTS[i % len(INTENTS)] if "noise" in stages else None, "meta": "{}"})
    ktab = pa.Table.from_pylist(kept, schema=CANONICAL_SCHEMA)
    ktab = ktab.append_column("n_tokens", pa.array(rng.integers(20, 800, n_write), pa.int32()))
    ktab = ktab.append_column("consistency", pa.array(rng.uniform(0.2, 0.9, n_write).round(3), pa.float32()))
    data_file = _write_stream(out / "data" / "part-00000.arrow", ktab)
    data_file["rows"] = rows_kept  # with kept_rows capped, the shard stands in for all kept rows

    src_rows = [rows_in // 2, int(rows_in * 0.3)]
    src_rows.append(rows_in - sum(src_rows))
    names = ["alpaca" + (PAYLOADS[1] if payloads else ""), "sharegpt", "messages"]
    inputs = [{"name": nm, "path": f"sample_data/{nm.split('<')[0]}/train.jsonl", "format": "auto",
               "sha256": hashlib.sha256(nm.encode()).hexdigest(), "bytes": r * 412, "rows": r,
               "formats_detected": {fm: r}} for nm, r, fm in zip(names, src_rows, ("alpaca", "sharegpt", "openai_messages"),
                                                                strict=True)]
    manifest = {
        "dataguard_version": "0.1.0",
        "config": {"stages": [{s: {"action": "drop"} if s in ("overlap", "noise") else {}} for s in stages],
                   "workers": 2, "output": str(out), "note": PAYLOADS[3] if payloads else "demo"},
        "inputs": inputs,
        "packages": {"pyarrow": pa.__version__, "numpy": np.__version__, "dataguard": "0.1.0", "tokenizers": "0.22.1"},
        "counts": {"rows_in": rows_in, "rows_kept": rows_kept, "rows_rejected": rows_rejected,
                   "balanced": rows_in == rows_kept + rows_rejected},
        "stages": stage_entries,
        "outputs": {"data": [data_file], "rejected": rej_files},
    }
    if "longtail" in stages:
        manifest["training"] = {"class_priors": {c: round(1 / len(INTENTS), 4) for c in INTENTS}, "tau": 1.0}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False), encoding="utf-8")
    total = sum(s["seconds"] for s in stage_entries)
    run = {"started": "2026-11-29T17:00:00Z", "finished": f"2026-11-29T17:00:{min(59, int(total)):02d}Z",
           "seconds": round(total + 1.3, 3), "stage_seconds": {s["name"]: s["seconds"] for s in stage_entries}}
    (out / "run.json").write_text(json.dumps(run, indent=1), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m dataguard.report.demo OUT``: write a demo output folder and its report
    (and optionally a PNG screenshot of the report's top, e.g. for the README)."""
    import argparse

    from dataguard.report.build import build_report

    ap = argparse.ArgumentParser(description="Write a synthetic output folder and its audit report.")
    ap.add_argument("out", type=Path)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--stages", choices=("sft", "classification"), default="sft")
    ap.add_argument("--payloads", action="store_true", help="plant script-injection strings in the data")
    ap.add_argument("--screenshot", type=Path, help="save a PNG of the top of the report here")
    ap.add_argument("--height", type=int, default=1000, help="screenshot height in CSS pixels")
    ap.add_argument("--existing", action="store_true",
                    help="OUT is a real run's output folder: only (re)build its report (and screenshot)")
    ap.add_argument("--html", type=Path, help="where to write the report (default OUT/audit.html)")
    args = ap.parse_args(argv)
    stages = SFT if args.stages == "sft" else CLASSIFICATION
    out = args.out if args.existing else write_demo_output(args.out, rows_in=args.rows, stages=stages,
                                                           payloads=args.payloads)
    html = build_report(out, args.html)
    print(html)
    if args.screenshot:
        from dataguard.report.browser import Chromium

        with Chromium(width=1280, height=args.height) as browser:
            load = browser.load(html)
            if load.errors:
                raise SystemExit(f"report has console errors: {load.errors}")
            print(browser.screenshot(args.screenshot))


if __name__ == "__main__":
    main()
