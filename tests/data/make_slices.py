"""Regenerate tests/data/ from the project's shared data (a dev tool, not a test).

    python tests/data/make_slices.py [/path/to/shared/data]      # default: ../shared/data

The test suite itself never reads ../shared: it reads only the files written here. Each
dataset folder has a SOURCE.md (provenance, licence, which slice was taken and how); this
script is the exact recipe. Slices are deterministic (gzip mtime 0), so re-running it on
the same shared data gives byte-identical files.

Kinds of slice:
- copy:        the whole file, byte for byte.
- json_head:   the first N items of a JSON array, written in the source's own layout
               (indent 2, same ensure_ascii), so a whole file would come out byte-identical.
- lines_head:  the first N lines of a JSONL / CSV file (CSV: header + N records), bytes unchanged.
- json_keys:   a JSON object keeping only some keys, each list optionally cut to its first N items.
- gz_lines_head / gz_text_prefix: gzip JSONL, first N rows unchanged / every row with
               ``text`` cut to its first K characters (all other fields unchanged).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# (dataset folder, source file, destination file, kind, argument)
SLICES: list[tuple[str, str, str, str, Any]] = [
    ("alpaca_en_demo", "alpaca_en_demo.json", "alpaca_en_demo.json", "copy", None),
    ("alpaca_en_demo", "identity.json", "identity.json", "copy", None),
    ("alpaca_seed_tasks", "seed_tasks.jsonl", "seed_tasks.jsonl", "copy", None),
    ("sharegpt_glaive_toolcall", "glaive_toolcall_en_demo.json", "glaive_toolcall_en_demo.json", "copy", None),
    ("sharegpt_fastchat_dummy", "dummy_conversation.json", "dummy_conversation.json", "copy", None),
    ("sharegpt_dpo_demo", "dpo_en_demo.json", "dpo_en_demo.head160.json", "json_head", 160),
    ("messages_kto_demo", "v1_sft_demo.jsonl", "v1_sft_demo.jsonl", "copy", None),
    ("messages_kto_demo", "kto_en_demo.json", "kto_en_demo.head100.json", "json_head", 100),
    ("gpteacher_toolformer", "toolformer-dedupe-only-dataset.json",
     "toolformer-dedupe-only-dataset.head1000.json", "json_head", 1000),
    ("gpteacher_toolformer", "toolformer-similarity-0.6-dataset.json",
     "toolformer-similarity-0.6-dataset.head300.json", "json_head", 300),
    ("banking77", "train.csv", "train.csv", "copy", None),
    ("banking77", "test.csv", "test.csv", "copy", None),
    ("clinc150", "data_full.json", "data_full.test.json", "json_keys", {"test": None}),
    ("clinc150", "data_imbalanced.json", "data_imbalanced.train200.json", "json_keys", {"train": 200}),
    ("gsm8k", "test.jsonl", "test.head100.jsonl", "lines_head", 100),
    ("humaneval", "HumanEval.jsonl.gz", "HumanEval.jsonl.gz", "copy", None),
    ("mmlu", "mmlu_validation.jsonl", "mmlu_validation.head200.jsonl", "lines_head", 200),
    # the first 20 test questions longer than 25 words are rows 0..44 (test_overlap picks them)
    ("mmlu", "mmlu_test.jsonl", "mmlu_test.head45.jsonl", "lines_head", 45),
    ("truthfulqa", "TruthfulQA.csv", "TruthfulQA.head200.csv", "csv_head", 200),
    ("20news_label_errors", "20news_mturk.json", "20news_mturk.json", "copy", None),
    ("20news_label_errors", "20news_test_set_pyx.npy", "20news_test_set_pyx.npy", "copy", None),
    ("20news_label_errors", "20news_test_texts.jsonl.gz", "20news_test_texts.text200.jsonl.gz", "gz_text_prefix", 200),
    ("20news_label_errors", "20news_test_texts.jsonl.gz", "20news_test_texts.head600.jsonl.gz", "gz_lines_head", 600),
]


def _json_layout(text: str) -> bool:
    """ensure_ascii of the source array (both sources here are indent=2)."""
    data = json.loads(text)
    for ensure_ascii in (False, True):
        if json.dumps(data, indent=2, ensure_ascii=ensure_ascii) in (text, text.rstrip("\n")):
            return ensure_ascii
    raise SystemExit("unexpected JSON layout; add a case to make_slices.py")


def _gzip_bytes(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
        f.write(data)
    return buf.getvalue()


def make(src: Path, dst: Path, kind: str, arg: Any) -> None:
    if kind == "copy":
        shutil.copyfile(src, dst)
    elif kind == "json_head":
        text = src.read_text(encoding="utf-8")
        ensure_ascii = _json_layout(text)
        end = "\n" if text.endswith("\n") else ""
        dst.write_text(json.dumps(json.loads(text)[:arg], indent=2, ensure_ascii=ensure_ascii) + end,
                       encoding="utf-8")
    elif kind == "lines_head":
        lines = src.read_bytes().splitlines(keepends=True)
        dst.write_bytes(b"".join(lines[:arg]))
    elif kind == "csv_head":  # header + first N records; records may span several lines
        text = src.read_text(encoding="utf-8")
        reader = csv.reader(io.StringIO(text, newline=""))
        next(reader)
        for _ in range(arg):
            next(reader)
        # csv.reader consumed exactly the header and N records: cut the text at that point
        consumed = reader.line_num
        dst.write_bytes(b"".join(src.read_bytes().splitlines(keepends=True)[:consumed]))
    elif kind == "json_keys":
        data = json.loads(src.read_text(encoding="utf-8"))
        out = {k: data[k] if n is None else data[k][:n] for k, n in arg.items()}
        dst.write_text(json.dumps(out, ensure_ascii=False) + "\n", encoding="utf-8")
    elif kind == "gz_lines_head":
        with gzip.open(src, "rb") as f:
            lines = f.read().splitlines(keepends=True)
        dst.write_bytes(_gzip_bytes(b"".join(lines[:arg])))
    elif kind == "gz_text_prefix":
        out = []
        with gzip.open(src, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                row["text"] = row["text"][:arg]
                out.append(json.dumps(row, ensure_ascii=False) + "\n")
        dst.write_bytes(_gzip_bytes("".join(out).encode("utf-8")))
    else:
        raise ValueError(kind)


# Which tests read each folder, and the expected values that come from the slice (not the full file).
NOTES: dict[str, str] = {
    "alpaca_en_demo": "Whole files. Used by test_readers, test_normalize, test_normalize_flat, test_dedup, "
                      "test_pipeline, test_ray_executor, test_length, test_quality, test_consistency, "
                      "test_overlap, test_ngrams, test_repetition_kernel. Expected values (999 rows, 14 exact "
                      "duplicates, 91 identity rows) are those of the upstream files.",
    "alpaca_seed_tasks": "Whole file (175 nested Self-Instruct rows). Used by test_normalize (all rejected as "
                         "unknown_format).",
    "sharegpt_glaive_toolcall": "Whole file (300 rows, 211 function_call turns, 35 exact duplicates). Used by "
                                "test_readers, test_normalize, test_dedup, test_pipeline, test_quality, "
                                "test_repetition_kernel.",
    "sharegpt_fastchat_dummy": "Whole file (500 rows). Used by test_normalize and test_length.",
    "sharegpt_dpo_demo": "First 160 of 300 rows. Used by test_normalize and test_dedup. Counts in the slice, "
                         "re-derived from the slice with plain Python (json + Counter): 43 `system` turns "
                         "(80 in the full file), 1 repeated prompt (row 157 repeats row 13; 5 in the full file).",
    "messages_kto_demo": "v1_sft_demo.jsonl whole (500 rows, 50 with `{{name}}`-style slots, 1 exact duplicate); "
                         "kto_en_demo: first 100 of 300 rows, labels 54 true / 46 false (150/150 in the full "
                         "file; counted with json + Counter). Used by test_readers, test_normalize, test_dedup, "
                         "test_pipeline, test_ray_executor.",
    "gpteacher_toolformer": "Row prefixes. dedupe-only: first 1000 of 7,673 rows (test_normalize_flat, and the "
                            "kill-and-resume run in test_pipeline); similarity-0.6: first 300 of 2,396 rows "
                            "(test_normalize; its oracle counts rejections from the slice itself). The "
                            "similarity-0.6 prefix holds none of that file's mojibake rows.",
    "banking77": "Whole files (train 10,003 rows / 77 classes, 35..187 per class; test 3,080). Used by "
                 "test_readers, test_normalize, test_pipeline, test_noise, test_drift, test_longtail.",
    "clinc150": "data_full.test.json: only the `test` key of data_full.json (all 4,500 pairs; the reader test "
                "still reads an array inside an object via json_key). data_imbalanced.train200.json: only "
                "`train`, first 200 of 10,525 pairs. Both re-serialised compactly (json.dumps, "
                "ensure_ascii=False). Used by test_readers, test_drift, test_normalize.",
    "gsm8k": "First 100 of 1,319 lines of test.jsonl (test_ngrams reads the first 100 questions).",
    "humaneval": "Whole file (164 rows). Used by test_readers and test_repetition_kernel.",
    "mmlu": "validation: first 200 of 1,531 lines (test_overlap uses the first 200). test: first 45 of 14,042 "
            "lines; rows 0..44 hold the first 20 questions longer than 25 words, which are the ones "
            "test_overlap picks, so that test sees the same items as with the full file.",
    "truthfulqa": "Header + first 200 of 817 records (test_readers counts 200 rows; records may span lines, "
                  "so the cut is made after the 200th record as csv.reader sees it).",
    "20news_label_errors": "20news_mturk.json and 20news_test_set_pyx.npy whole (test_noise checks the published "
                           "95 flags / 55 confirmed errors, which need all 7,532 rows). The texts come in two "
                           "slices of 20news_test_texts.jsonl.gz: text200 = all 7,532 rows with `text` cut to "
                           "its first 200 characters (test_noise only reads `text[:200]`); head600 = the first "
                           "600 rows unchanged (test_repetition_kernel reads the first 600 full texts).",
}


def _count(src: Path, kind: str) -> str:
    if kind in ("json_head",):
        return f"{len(json.loads(src.read_text(encoding='utf-8'))):,}"
    if kind == "lines_head":
        return f"{len(src.read_bytes().splitlines()):,}"
    if kind == "csv_head":
        with open(src, newline="", encoding="utf-8") as f:
            return f"{sum(1 for _ in csv.reader(f)) - 1:,}"
    if kind in ("gz_lines_head", "gz_text_prefix"):
        with gzip.open(src, "rb") as f:
            return f"{len(f.read().splitlines()):,}"
    return ""


def _describe(src: Path, kind: str, arg: Any) -> str:
    total = _count(src, kind)
    if kind == "copy":
        return "whole file, byte-identical"
    if kind == "json_head":
        return f"first {arg} of {total} array items, same layout (indent 2)"
    if kind == "lines_head":
        return f"first {arg} of {total} lines, bytes unchanged"
    if kind == "csv_head":
        return f"header + first {arg} of {total} records, bytes unchanged"
    if kind == "json_keys":
        return "; ".join(f"key `{k}`: " + ("all items" if n is None else f"first {n} items") for k, n in arg.items())
    if kind == "gz_lines_head":
        return f"first {arg} of {total} rows, lines unchanged, re-gzipped (mtime 0)"
    if kind == "gz_text_prefix":
        return f"all {total} rows, `text` cut to its first {arg} characters, other fields unchanged, re-gzipped"
    raise ValueError(kind)


def write_source_md(shared: Path, folder: str, rows: list[tuple[str, str, str, int, str]]) -> None:
    upstream = (shared / folder / "SOURCE.md").read_text(encoding="utf-8")
    upstream = "\n".join("#" + line if line.startswith("#") else line for line in upstream.splitlines())
    table = "\n".join(f"| {dst} | `{src}` | {how} | {size:,} | `{digest}` |" for dst, src, how, size, digest in rows)
    text = (f"# {folder} — test slice\n\n"
            f"Small slice of the project's shared copy `../shared/data/{folder}/` for the test suite, made by "
            f"`python tests/data/make_slices.py` (the tests never read ../shared). Provenance and licence "
            f"are those of the upstream files, below.\n\n"
            f"| file | taken from | slice | bytes | sha256 (16) |\n|---|---|---|---|---|\n{table}\n\n"
            f"{NOTES[folder]}\n\n---\n\n## Upstream SOURCE.md (verbatim, headings shifted one level)\n\n"
            f"{upstream}\n")
    (HERE / folder / "SOURCE.md").write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    shared = Path(argv[0]) if argv else HERE.parents[2] / "shared" / "data"
    if not shared.is_dir():
        print(f"shared data not found: {shared}", file=sys.stderr)
        return 2
    done: dict[str, list[tuple[str, str, str, int, str]]] = {}
    for folder, src_name, dst_name, kind, arg in SLICES:
        (HERE / folder).mkdir(exist_ok=True)
        dst = HERE / folder / dst_name
        make(shared / folder / src_name, dst, kind, arg)
        digest = hashlib.sha256(dst.read_bytes()).hexdigest()[:16]
        size = dst.stat().st_size
        print(f"{folder}/{dst_name}: {size:,} bytes sha256 {digest}  ({kind} {arg or ''})")
        done.setdefault(folder, []).append((dst_name, src_name, _describe(shared / folder / src_name, kind, arg),
                                            size, digest))
    for folder, rows in done.items():
        write_source_md(shared, folder, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
