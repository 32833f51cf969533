"""Which "clean" rows does ``near_dedup`` drop in bench_sft's arm (b), and are they copies?

bench_sft counts a row as clean when nothing was planted in it, so a near copy that the
source data already held counts against the stage. This script lists every near_dedup reject
of a clean row beside the row it was judged a copy of, showing only what differs (the
question after the shared template, and the answer), for a person to judge:

    BENCH_SHARED_DATA=../shared/data python benchmarks/sft_near_pairs.py   # after bench_sft.py (a pipeline_b)

Read on 2026-12-02 (data seed 0, ``pipelines/sft.yaml``'s near_dedup: word 5-shingles,
Jaccard >= 0.7): 124 clean rows dropped, 113 of them against another clean row (the other
11 against a planted row: the original of a planted copy that came later). Of the 113, by
reading each pair:

* 77 are paraphrases with the same answer, i.e. real near copies in the source: GPTeacher
  toolformer ("Find the square root of 144." / "Calculate the square root of 144.", both
  answered ``python('import math; math.sqrt(144)')``), and FastChat's identity set ("Who are
  you?" / "What is your name?", the same "I am Vicuna ..." answer);
* 36 are different requests that share a long tool description ("What is the capital of
  Italy?" / "... of Brazil?", "square root of 256" / "of 49"): the real false positives,
  1.1% of the 3,178 training rows. Word shingles over the whole conversation count the
  template. A per-part rule (prompt and answer each at Jaccard >= 0.7) would drop 35 clean
  rows instead of 124, but mostly by keeping the real paraphrases above (their short answers
  differ by a word or a colon), and it loses 27 of the 104 planted near copies the stage finds
  (one changed word in a short answer): not adopted.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sft  # noqa: E402


def _read(folder: Path) -> pa.Table:
    files = sorted(folder.glob("*.arrow"))
    return pa.concat_tables([ipc.open_stream(f).read_all() for f in files], promote_options="default")


def _split(messages: list[dict[str, str]]) -> tuple[str, str]:
    prompt = "\n".join(m["content"] for m in messages if m["role"] != "assistant")
    return prompt, "\n".join(m["content"] for m in messages if m["role"] == "assistant")


def _differing_tail(a: str, b: str) -> tuple[str, str]:
    """Both texts from the first line where they differ (the shared template left out)."""
    start = a.rfind("\n", 0, len(os.path.commonprefix([a, b]))) + 1
    return a[start:], b[start:]


def main() -> int:
    data = bench_sft.build_data(0)
    inputs, tags = bench_sft.write_inputs(data["train"], bench_sft.RESULTS)
    folder = Path(bench_sft.run_pipeline("b", inputs, tags)["folder"])
    kept, rejected = _read(folder / "data"), _read(folder / "rejected")
    messages = dict(zip(kept.column("id").to_pylist(), kept.column("messages").to_pylist(), strict=True))
    messages.update({r["id"]: json.loads(r["record"])["messages"] for r in rejected.to_pylist()})
    pairs = [(r["id"], re.match(r"near duplicate of (\S+)", r["detail"]).group(1))
             for r in rejected.to_pylist() if r["reason"] == "near_duplicate"]
    clean = [(d, k) for d, k in pairs if tags.get(d) == "clean"]
    both = [(d, k) for d, k in clean if tags.get(k) == "clean"]
    print(f"near_dedup rejects: {len(pairs)}; of clean rows: {len(clean)}; against another clean row: {len(both)}\n")
    for dropped, kept_id in both:
        (pd, ad), (pk, ak) = _split(messages[dropped]), _split(messages[kept_id])
        qd, qk = _differing_tail(pd, pk)
        print(f"{dropped} (dropped) vs {kept_id} (kept)\n  Q: {qd[:100]!r}\n     {qk[:100]!r}\n"
              f"  A: {ad[:100]!r}\n     {ak[:100]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
