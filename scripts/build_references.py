"""Rebuild the shipped reference sets (``dataguard/references/*.jsonl.gz``) from public copies.

    python scripts/build_references.py /path/to/shared/data

Keeps only the text fields that matter for contamination (the prompt the model is
evaluated on and the gold answer), one JSON object per line, gzip-compressed with a fixed
mtime so the files are byte-reproducible. Provenance is in dataguard/references/SOURCE.md,
next to the files. A maintainer's tool, not part of the installed package.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = REPO / "dataguard" / "references"


def _jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def gsm8k(root: Path) -> Iterator[dict]:
    for i, r in enumerate(_jsonl(root / "gsm8k" / "test.jsonl")):
        yield {"id": f"gsm8k_test/{i}", "question": r["question"], "answer": r["answer"]}


def mmlu(root: Path) -> Iterator[dict]:
    per_subject: dict[str, int] = {}
    for r in _jsonl(root / "mmlu" / "mmlu_test.jsonl"):
        k = per_subject.get(r["subject"], 0)
        per_subject[r["subject"]] = k + 1
        yield {"id": f"mmlu_test/{r['subject']}/{k}", "question": r["question"], "choices": "\n".join(r["choices"])}


def humaneval(root: Path) -> Iterator[dict]:
    for r in _jsonl(root / "humaneval" / "HumanEval.jsonl.gz"):
        yield {"id": r["task_id"], "prompt": r["prompt"], "canonical_solution": r["canonical_solution"]}


def truthfulqa(root: Path) -> Iterator[dict]:
    with open(root / "truthfulqa" / "TruthfulQA.csv", encoding="utf-8", newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            yield {"id": f"truthfulqa/{i}", "question": r["Question"], "best_answer": r["Best Answer"]}


def mt_bench(root: Path) -> Iterator[dict]:
    refs = {r["question_id"]: r["choices"][0]["turns"] for r in _jsonl(root / "mt_bench" / "reference_answer_gpt-4.jsonl")}
    for r in _jsonl(root / "mt_bench" / "question.jsonl"):
        row = {"id": f"mt_bench/{r['question_id']}", "turn_1": r["turns"][0], "turn_2": r["turns"][1]}
        ref = refs.get(r["question_id"])
        if ref:
            row["reference_1"] = ref[0]
            row["reference_2"] = ref[1] if len(ref) > 1 else ""
        yield row


BUILDERS = {"gsm8k_test": gsm8k, "mmlu_test": mmlu, "humaneval": humaneval, "truthfulqa": truthfulqa,
            "mt_bench": mt_bench}


def write(name: str, rows: Iterator[dict]) -> Path:
    out = HERE / f"{name}.jsonl.gz"
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as gz:
        for row in rows:
            gz.write((json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
    out.write_bytes(raw.getvalue())
    return out


def main(argv: list[str]) -> None:
    root = Path(argv[0] if argv else REPO.parent / "shared" / "data")
    for name, fn in BUILDERS.items():
        path = write(name, fn(root))
        print(f"{path.name}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
