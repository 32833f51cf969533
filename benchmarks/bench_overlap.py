"""Contamination scan: dataguard's OverlapStage vs lm-eval's Janitor vs datatrove, one run.

Setup (benchmark-only venv, outside the repo; see the script)::

    benchmarks/setup_benchenv_overlap.sh            # -> /work/benchenv-overlap
    /work/benchenv-overlap/bin/python benchmarks/bench_overlap.py [--quick]

``--recall-only`` runs just the first table (GSM8K copies, ours only) and needs nothing
beyond the project's own python.

GSM8K copies (issue #14): one row per field (question, answer) of every item of the shipped
``gsm8k_test`` reference (1,319 items, 2,638 rows per kind), the field as the user turn
(question) or the assistant turn (answer) next to a real alpaca turn. Kinds: verbatim;
edited (case, trailing punctuation, whitespace: ``plant.edit_case_and_spacing``); punct
(every run of punctuation between two letters/digits deleted or changed to another mark:
``plant.edit_punctuation``, ``Zack's`` -> ``Zacks``, ``3/5`` -> ``35``, ``10-foot`` ->
``10·foot``); punct+edited (both); spaced (that punctuation replaced by a space). All five
reference sets are indexed; "clean rows flagged" is the false-positive count on the clean
corpus below (9,272 real rows, none planted). Measured 2026-12-01 with
``nice python benchmarks/bench_overlap.py --recall-only`` in the project python, "before"
being the stage as it was before issue #14 run through the same script (2 shared cores,
load average ~8: CPU seconds are indicative)::

    before  method  verbatim  edited   punct  punct+edited  spaced  clean rows flagged  index n-grams  fit s  clean scan s
        ----------  --------  ------  ------  ------------  ------  ------------------  -------------  -----  ------------
        ours/token       1.0     1.0   0.981        0.9788     1.0                   2        1246951   1.34          0.39
         ours/word    0.9996  0.9996  0.8309        0.8302  0.9996                   0        1027173   0.84          0.15

    after   method  verbatim  edited  punct  punct+edited  spaced  clean rows flagged  index n-grams  fit s  clean scan s
        ----------  --------  ------  -----  ------------  ------  ------------------  -------------  -----  ------------
        ours/token       1.0     1.0    1.0           1.0     1.0                   1        2198746   2.13          0.47
         ours/word       1.0     1.0    1.0           1.0     1.0                   0        1782930   1.27          0.18

What changed: intra-word punctuation is deleted in normalisation (so deleting or changing
it gives the same tokens), items holding such punctuation are also indexed in the split
form (so replacing it by a space still matches: that is where the index grows ~1.75x and
fit ~1.6x), exact copies are caught whatever their length (the word-mode verbatim miss
before was ``gsm8k_test/695#answer``, 12 words, no 13-gram), and the item-coverage bar is
scaled down for items under 5n tokens. The clean row still flagged in token mode is the
gpteacher code row (gpteacher:5072) sharing 19-token idioms with ``HumanEval/96#prompt``
(30.4 % of the prompt).

Then benchmark items shorter than ``exact_min_tokens`` (default 6) stopped counting as exact
copies ("true.", "Who are you?" are chat text). Re-measured 2026-12-01 08:31 UTC, same
command, idle machine: ours/token unchanged (1.0 everywhere, 1 clean row, fit 1.91 s, scan
0.42 s); ours/word verbatim / edited / punct / punct+edited 0.9989 (spaced 1.0, 0 clean rows,
fit 0.99 s, scan 0.17 s): the three missed rows copy one GSM8K answer of 5 words
(``Ruins:220(.40)=88 ... #### 44``), caught again with ``exact_min_tokens: 1``.

The tables below were measured before issue #14 with the comparison venv, which was not
rebuilt for it. Re-measured for ours on the same planted rows (2026-12-01), the "Share of
planted rows flagged" row of ours/token is unchanged and ours/word gives partial 0.99
(one 60 % window of a short HumanEval solution: ``int(a) * int(c)`` now reads ``inta
intc``, so the window holds fewer than 13 words); clean stays 0.0 for both. Index n-gram
counts in the growth table are ~1.75x larger now (split-form variants).

Data (all real, from ../shared/data): reference items of the five shipped sets (GSM8K test
question/answer, MMLU test question+choices, HumanEval prompt/solution, TruthfulQA
question(+best answer), MT-Bench turns/references) planted into alpaca_en_demo rows by
``dataguard.testing.plant`` (kinds: verbatim, edited = case/punctuation/whitespace
edits, embedded in a longer answer, partial = a 60 % window, near_miss = chunks of <= 10
tokens, short rows, clean rows). Every method indexes the same items and scans the same
rows (document-level methods scan the whole conversation as one text).

* ours/token: OverlapStage(mode="token") - Qwen BPE ids of normalised text, n = 13.
* ours/word:  OverlapStage(mode="word") - normalised words, n = 13.
* janitor:    lm_eval.decontamination.janitor.Janitor(ngram_n=13), Python path
  (``register_contaminant_python`` / ``clean_python``; its C++ path is not built and is
  broken upstream). A row is dirty when ``clean_python(text) != [text]``.
* datatrove:  NGramsDecontFilter(n_grams=13) over hashes written exactly as
  NGramsDecontIndexer.compute_hashes does (the indexer itself insists on lighteval, which
  only serves to download tasks). spaCy English word tokenizer, xxhash64.

Throughput: the clean training corpus (alpaca_en_demo + gpteacher toolformer +
glaive toolcall + dpo demo, all turns) scanned against all five sets, best of 3 runs,
one process, CPU seconds of the process (``time.process_time``: the machine is shared, and
wall time swung 2x between identical runs while CPU time stayed within ~5 %). "tokenize only" is ``get_tokenizer().encode_batch`` on the raw
message texts with an empty cache; "token scan, ids reused" runs the token scan with
normalisation off right after that tokenisation, so encode_batch is served from the
per-process token cache (what happens when the scan follows a tokenising stage).

Measured 2026-11-29 with ``/work/benchenv-overlap/bin/python benchmarks/bench_overlap.py``
(2 shared cores, load average 7-11 while measuring: absolute numbers are pessimistic, the
ratios within the run are what matters). "rows flagged" counts rows of the clean corpus
that a method calls contaminated: ours/token's two are gpteacher code rows sharing a
19-20 token idiom with a short HumanEval solution/prompt (30-32 % of it, just over
``ref_threshold=0.3``); the Janitor's 260 are mostly rows under 200 characters::

    index build (s): {'ours/token': 2.47, 'ours/word': 1.21, 'janitor': 1.11, 'datatrove': 31.77}

    Share of planted rows flagged (positives: want 1.0; near_miss/short/clean: want 0.0)
        method  verbatim  edited  embedded  partial  near_miss  short  clean
    ----------  --------  ------  --------  -------  ---------  -----  -----
    ours/token       1.0     1.0       1.0      1.0        0.0    0.0    0.0
     ours/word       1.0     1.0       1.0      1.0        0.0    0.0    0.0
       janitor      0.91    0.98      0.95     0.94       0.01    1.0    0.2
     datatrove       1.0     1.0       1.0      1.0        0.0    0.0    0.0

    Throughput on 9272 clean rows, 5.46 MB, 1182120 Qwen tokens (987717 after normalisation); best of 3
                                method   CPU s  rows/s   MB/s  tokens/s  rows flagged
    ----------------------------------  ------  ------  -----  --------  ------------
             tokenize only (raw texts)   0.571   16225   9.55   2068622             -
                            ours/token    0.62   14964   8.81   1907839             2
                             ours/word   0.206   44940  26.45   5729604             0
                               janitor   2.882    3217   1.89    410164           260
                             datatrove  21.456     432   0.25     55096            17
    ours/token, ids reused (scan only)   0.098   94481  55.61  12045754             -
    ours/word vs janitor: 14.0x faster; ours/token / tokenize-only: 1.08x; token scan with reused ids / tokenize-only: 0.17x

    Growth with reference and training size (scan = apply on one batch, best of runs)
                            references   rows   mode  index n-grams  index MB  fit s  scan s  rows/s
    ----------------------------------  -----  -----  -------------  --------  -----  ------  ------
                                 gsm8k   9272   word         111752       1.7   0.05   0.119   77722
                                 gsm8k   9272  token         189889       2.9   0.13   0.495   18719
                                 gsm8k  18544   word         111752       1.7   0.04   0.253   73161
                                 gsm8k  18544  token         189889       2.9   0.12   1.085   17085
                                 gsm8k  37088   word         111752       1.7   0.04   0.801   46317
                                 gsm8k  37088  token         189889       2.9   0.13   2.782   13333
         gsm8k+humaneval+truthfulqa+mt   9272   word         143272       2.2   0.07    0.13   71512
         gsm8k+humaneval+truthfulqa+mt   9272  token         229184       3.5   0.19   0.492   18861
         gsm8k+humaneval+truthfulqa+mt  18544   word         143272       2.2   0.07   0.322   57636
         gsm8k+humaneval+truthfulqa+mt  18544  token         229184       3.5   0.18   1.207   15363
         gsm8k+humaneval+truthfulqa+mt  37088   word         143272       2.2   0.07   0.669   55401
         gsm8k+humaneval+truthfulqa+mt  37088  token         229184       3.5   0.19   2.984   12427
    gsm8k+mmlu+humaneval+truthfulqa+mt   9272   word        1027173      15.7   0.62   0.157   59066
    gsm8k+mmlu+humaneval+truthfulqa+mt   9272  token        1246951      19.0   1.26   0.586   15833
    gsm8k+mmlu+humaneval+truthfulqa+mt  18544   word        1027173      15.7   0.59    0.37   50176
    gsm8k+mmlu+humaneval+truthfulqa+mt  18544  token        1246951      19.0   1.33    1.52   12200
    gsm8k+mmlu+humaneval+truthfulqa+mt  37088   word        1027173      15.7   0.59    0.94   39444
    gsm8k+mmlu+humaneval+truthfulqa+mt  37088  token        1246951      19.0   1.21   3.136   11826
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "data"

import numpy as np  # noqa: E402

from dataguard.records import canonical_table  # noqa: E402
from dataguard.references import BUILTIN, parse_spec  # noqa: E402
from dataguard.stages.overlap import OverlapStage  # noqa: E402
from dataguard.testing.plant import (  # noqa: E402
    KINDS,
    edit_case_and_spacing,
    edit_punctuation,
    plant,
    row_text,
)
from dataguard.text import tokenizers as tk  # noqa: E402
from dataguard.text.normalize_text import NormalizeConfig, normalize_batch  # noqa: E402

SETS = list(BUILTIN)


def reference_items(sets: list[str]) -> list[tuple[str, str, str]]:
    out = []
    for name in sets:
        out += [(name, i, t) for i, t in parse_spec(name).load().items]
    return out


def load_alpaca(path: Path) -> list[dict[str, str]]:
    return json.loads(path.read_text())


def clean_corpus() -> list[dict]:
    """Real training rows, as canonical row dicts (all turns)."""
    rows: list[dict] = []
    for name, path in [("alpaca", SHARED / "alpaca_en_demo" / "alpaca_en_demo.json"),
                       ("gpteacher", SHARED / "gpteacher_toolformer" / "toolformer-dedupe-only-dataset.json")]:
        for i, a in enumerate(load_alpaca(path)):
            rows.append({"id": f"{name}:{i}", "source": name, "messages": [
                {"role": "user", "content": (a["instruction"] + "\n" + a.get("input", "")).strip()},
                {"role": "assistant", "content": a["output"]}]})
    role = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "tool",
            "system": "system"}
    for name, path in [("glaive", SHARED / "sharegpt_glaive_toolcall" / "glaive_toolcall_en_demo.json"),
                       ("dpo", SHARED / "sharegpt_dpo_demo" / "dpo_en_demo.json")]:
        for i, r in enumerate(json.loads(path.read_text())):
            msgs = [{"role": role.get(t["from"], "user"), "content": t["value"]} for t in r["conversations"]]
            if "chosen" in r:
                msgs.append({"role": "assistant", "content": r["chosen"]["value"]})
            rows.append({"id": f"{name}:{i}", "source": name, "messages": msgs})
    return rows


def count_tokens(text: str) -> int:
    return len(tk.get_tokenizer().encode_batch([" " + text])[0])


# -- methods ----------------------------------------------------------------------------
class Ours:
    def __init__(self, mode: str, sets: list[str], normalize: bool = True) -> None:
        self.stage = OverlapStage(references=sets, mode=mode, normalize=normalize)
        t = time.process_time()
        self.stage.fit([])
        self.fit_s = time.process_time() - t
        self.name = f"ours/{mode}"

    def flags(self, rows: list[dict]) -> np.ndarray:
        out = self.stage.apply(canonical_table(rows))
        return np.array(out.kept.column("contaminated").to_pylist(), dtype=bool)

    def scan(self, table) -> int:
        return sum(self.stage.apply(table).kept.column("contaminated").to_pylist())


class Janitor:
    name = "janitor"

    def __init__(self, items: list[tuple[str, str, str]]) -> None:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from lm_eval.decontamination.janitor import Janitor as LmJanitor
        self.j = LmJanitor(ngram_n=13)
        t = time.process_time()
        for _, _, text in items:
            self.j.register_contaminant_python(text)
        self.fit_s = time.process_time() - t

    def flags(self, rows: list[dict]) -> np.ndarray:
        return np.array([self.j.clean_python(t) != [t] for t in map(row_text, rows)], dtype=bool)

    def scan(self, texts: list[str]) -> int:
        return sum(self.j.clean_python(t) != [t] for t in texts)


class Datatrove:
    name = "datatrove"

    def __init__(self, items: list[tuple[str, str, str]]) -> None:
        from datatrove.pipeline.decont.n_grams import (
            NGramsDecontConfig,
            NGramsDecontFilter,
            NGramsDecontIndexer,
        )

        self.tmp = tempfile.mkdtemp(prefix="dt-index-")
        cfg = NGramsDecontConfig(n_grams=13, find_query_ngrams=True, find_overlap_ngrams=False)
        self.f = NGramsDecontFilter(self.tmp, config=cfg)
        t = time.process_time()
        by_set: dict[str, set[int]] = {}
        for s, _, text in items:
            # NGramsDecontIndexer.compute_hashes, run on the filter (same tokenizer/hash/config)
            by_set.setdefault(s, set()).update(NGramsDecontIndexer.compute_hashes(self.f, text, None))
        for s, hashes in by_set.items():
            np.array(sorted(hashes), dtype=cfg.hash_config.np_descr).tofile(os.path.join(self.tmp, f"{s}.index.hashes"))
        self.f.load_index_hashes()
        self.fit_s = time.process_time() - t

    def flags(self, rows: list[dict]) -> np.ndarray:
        from datatrove.data import Document

        return np.array([self.f.filter(Document(text=row_text(r), id=r["id"])) is not True for r in rows], dtype=bool)

    def scan(self, texts: list[str]) -> int:
        from datatrove.data import Document

        return sum(self.f.filter(Document(text=t, id=str(i))) is not True for i, t in enumerate(texts))


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


# -- experiments --------------------------------------------------------------------------
def recall_table(methods, planted: list[dict]) -> list[list]:
    kinds = np.array([json.loads(r["meta"])["kind"] for r in planted])
    table = []
    for m in methods:
        f = m.flags(planted)
        table.append([m.name] + [round(float(f[kinds == k].mean()), 3) for k in KINDS])
    return table


def throughput(methods, rows: list[dict], repeat: int) -> tuple[list[list], dict]:
    table_rows = canonical_table(rows)
    texts = [row_text(r) for r in rows]
    contents = [m["content"] for r in rows for m in r["messages"]]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tok = tk.get_tokenizer()
    tk.clear_token_cache(0)
    raw_tokens = sum(len(x) for x in tok.encode_batch(contents))
    norm_tokens = sum(len(x) for x in tok.encode_batch(normalize_batch(contents, NormalizeConfig())))
    t_tok = best_of(lambda: tok.encode_batch(contents), repeat)
    out = [["tokenize only (raw texts)", round(t_tok, 3), round(len(rows) / t_tok), round(mb / t_tok, 2),
            round(raw_tokens / t_tok), "-"]]
    extra = {"rows": len(rows), "mb": round(mb, 2), "raw_tokens": raw_tokens, "normalised_tokens": norm_tokens}
    for m in methods:
        if isinstance(m, Ours):
            t = best_of(lambda m=m: m.scan(table_rows), repeat)
        else:
            t = best_of(lambda m=m: m.scan(texts), max(1, repeat - 1))
        flagged = m.scan(table_rows) if isinstance(m, Ours) else m.scan(texts)
        out.append([m.name, round(t, 3), round(len(rows) / t), round(mb / t, 2), round(raw_tokens / t), flagged])
        extra[f"{m.name}_s"] = t
    extra["tokenize_s"] = t_tok
    # the scan right after a tokenising stage: normalisation off, ids from the token cache
    reuse = Ours("token", SETS, normalize=False)
    tk.clear_token_cache(50_000_000)
    times = []
    for _ in range(repeat):
        tk.clear_token_cache()
        tok.encode_batch(contents)  # the earlier stage
        t = time.process_time()
        reuse.scan(table_rows)
        times.append(time.process_time() - t)
    t_reuse = min(times)
    out.append(["ours/token, ids reused (scan only)", round(t_reuse, 3), round(len(rows) / t_reuse),
                round(mb / t_reuse, 2), round(raw_tokens / t_reuse), "-"])
    extra["reuse_scan_s"] = t_reuse
    tk.clear_token_cache(0)
    return out, extra


def scaling_table(rows: list[dict], repeat: int) -> list[list]:
    out = []
    for sets in (["gsm8k_test"], ["gsm8k_test", "humaneval", "truthfulqa", "mt_bench"], SETS):
        for mult in (1, 2, 4):
            # copies get a distinct tag in every message: the tokenizer dedupes identical texts
            big = [dict(r, id=f"{r['id']}#{k}", messages=[dict(m, content=f"{m['content']} [{k}]" if k else m["content"])
                                                           for m in r["messages"]])
                   for k in range(mult) for r in rows]
            table = canonical_table(big)
            for mode in ("word", "token"):
                m = Ours(mode, sets)
                idx = m.stage.fitted().index
                t = best_of(lambda m=m, table=table: m.scan(table), repeat)
                out.append(["+".join(s.split("_")[0] for s in sets), len(big), mode, len(idx),
                            round(idx.nbytes / 2**20, 1), round(m.fit_s, 2), round(t, 3), round(len(big) / t)])
    return out


GSM8K_KINDS = ("verbatim", "edited", "punct", "punct+edited", "spaced")


def gsm8k_copies(alpaca: list[dict[str, str]], seed: int = 0) -> list[dict]:
    """One row per GSM8K test field (question, answer) per kind: a question as the user turn
    with a real alpaca answer, an answer as the assistant turn after a real instruction.
    Kinds: verbatim; edited (case, trailing punctuation, whitespace); punct (every run of
    punctuation inside a word deleted or changed: Zack's -> Zacks, 3/5 -> 35, 10-foot ->
    10·foot); punct+edited (both); spaced (punctuation inside words -> a space)."""
    import random

    rng = random.Random(seed)
    items = parse_spec("gsm8k_test").load().items
    edits = {"verbatim": lambda t: t, "edited": lambda t: edit_case_and_spacing(t, rng),
             "punct": lambda t: edit_punctuation(t, rng),
             "punct+edited": lambda t: edit_case_and_spacing(edit_punctuation(t, rng), rng),
             "spaced": lambda t: edit_punctuation(t, rng, spaced=True)}
    rows = []
    for kind in GSM8K_KINDS:
        for k, (item_id, text) in enumerate(items):
            a = alpaca[k % len(alpaca)]
            copy = edits[kind](text)
            msgs = ([{"role": "user", "content": copy}, {"role": "assistant", "content": a["output"]}]
                    if item_id.endswith("#question") else
                    [{"role": "user", "content": a["instruction"]}, {"role": "assistant", "content": copy}])
            rows.append({"id": f"{kind}:{item_id}", "source": "planted", "messages": msgs,
                         "meta": json.dumps({"kind": kind, "item": item_id})})
    return rows


def gsm8k_recall_table(modes: tuple[str, ...], alpaca: list[dict[str, str]], clean: list[dict],
                       repeat: int) -> list[list]:
    """Per mode: recall on every GSM8K test field per kind, clean-corpus rows flagged, and
    what it costs (index n-grams, fit and clean-scan CPU seconds, best of ``repeat``)."""
    planted = gsm8k_copies(alpaca)
    kinds = np.array([json.loads(r["meta"])["kind"] for r in planted])
    clean_table = canonical_table(clean)
    out = []
    for mode in modes:
        m = Ours(mode, SETS)
        f = m.flags(planted)
        flagged = m.scan(clean_table)
        scan_s = best_of(lambda m=m: m.scan(clean_table), repeat)
        index = m.stage.describe()["summary"]["index_ngrams"]
        out.append([m.name] + [round(float(f[kinds == k].mean()), 4) for k in GSM8K_KINDS]
                   + [flagged, index, round(m.fit_s, 2), round(scan_s, 2)])
    return out


def fmt(header: list[str], rows: list[list]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = lambda r: "  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rows and repeats (smoke run)")
    ap.add_argument("--per-kind", type=int, default=100)
    ap.add_argument("--recall-only", action="store_true",
                    help="only the GSM8K recall / clean-row table for ours (runs in the project python)")
    args = ap.parse_args()
    repeat = 1 if args.quick else 3
    tk.clear_token_cache(0)  # cold tokenizer for every measurement unless stated
    alpaca = load_alpaca(SHARED / "alpaca_en_demo" / "alpaca_en_demo.json")
    clean = clean_corpus()
    print(f"GSM8K test copies: every field of the 1319 items ({2 * 1319} rows per kind), share flagged; "
          f"all five reference sets indexed; clean rows flagged of {len(clean)}; CPU s best of {repeat}")
    print(fmt(["method", *GSM8K_KINDS, "clean rows flagged", "index n-grams", "fit s", "clean scan s"],
              gsm8k_recall_table(("token", "word"), alpaca, clean, repeat)))
    if args.recall_only:
        return

    items = reference_items(SETS)
    planted = plant(alpaca, items, per_kind=20 if args.quick else args.per_kind, seed=13, count_tokens=count_tokens)
    methods = [Ours("token", SETS), Ours("word", SETS), Janitor(items), Datatrove(items)]
    print("index build (s):", {m.name: round(m.fit_s, 2) for m in methods})

    rec = recall_table(methods, planted)
    print("\nShare of planted rows flagged (positives: want 1.0; near_miss/short/clean: want 0.0)")
    print(fmt(["method", *KINDS], rec))

    rows = clean
    if args.quick:
        rows = rows[:2000]
    thr, extra = throughput(methods, rows, repeat)
    print(f"\nThroughput on {extra['rows']} clean rows, {extra['mb']} MB, {extra['raw_tokens']} Qwen tokens "
          f"({extra['normalised_tokens']} after normalisation); best of {repeat}")
    print(fmt(["method", "CPU s", "rows/s", "MB/s", "tokens/s", "rows flagged"], thr))
    print(f"ours/word vs janitor: {extra['janitor_s'] / extra['ours/word_s']:.1f}x faster; "
          f"ours/token / tokenize-only: {extra['ours/token_s'] / extra['tokenize_s']:.2f}x; "
          f"token scan with reused ids / tokenize-only: {extra['reuse_scan_s'] / extra['tokenize_s']:.2f}x")

    scal = scaling_table(rows[:3000] if args.quick else rows, max(1, repeat - 1))
    print("\nGrowth with reference and training size (scan = apply on one batch, best of runs)")
    print(fmt(["references", "rows", "mode", "index n-grams", "index MB", "fit s", "scan s", "rows/s"], scal))


if __name__ == "__main__":
    main()
