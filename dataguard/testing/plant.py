"""Plant real benchmark items into real training rows, to measure a contamination scan.

Used by the tests and by ``benchmarks/bench_overlap.py`` (same data for every method), and
useful to anyone who wants to check a scan configuration on their own data. Kinds:

* ``verbatim``  - the user turn is the item, the answer is the training row's answer.
* ``edited``    - the item with case, punctuation and whitespace edits (upper/title-cased
  words, trailing punctuation removed, curly quotes straightened, runs of spaces, tabs and
  newlines between words).
* ``embedded``  - the item pasted into the middle of the training row's (longer) answer.
* ``partial``   - a contiguous window of ``partial_share`` of the item's words (default 60 %)
  inside the training answer.
* ``near_miss`` - the item's (normalised) words in chunks of at most ``near_miss_tokens``
  tokens (default 10, counted by ``count_tokens``; words when not given) with a training
  word between chunks: it shares no run of 13 tokens, so it must NOT be flagged.
* ``short``     - a row with fewer than 13 tokens in total (must not be flagged).
* ``clean``     - an untouched training row (must not be flagged).

:func:`edit_punctuation` makes a harder edit for benchmarks: every run of punctuation inside a
word (``Zack's``, ``3/5``, ``10-foot``, ``<<16-3-4=9>>``) deleted or changed to another mark,
or split by a space with ``spaced=True``.

Only items with at least ``min_words`` words are planted, so a 60 % window still spans more
than 13 tokens (shorter items cannot be found by any 13-gram method).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

KINDS = ("verbatim", "edited", "embedded", "partial", "near_miss", "short", "clean")
POSITIVE_KINDS = ("verbatim", "edited", "embedded", "partial")
SHORT_TEXTS = [("Hi!", "Hello! How can I help?"), ("Thanks.", "You're welcome."), ("2+2?", "4"),
               ("Say yes.", "Yes."), ("Translate 'chat'.", "Cat.")]


def edit_case_and_spacing(text: str, rng: random.Random) -> str:
    """The ``edited`` kind's edit: case, trailing punctuation, whitespace."""
    return _edit(text, rng)


def _edit(text: str, rng: random.Random) -> str:
    words = text.replace("’", "'").replace("“", '"').replace("”", '"').split()
    out = []
    for w in words:
        r = rng.random()
        if r < 0.25:
            w = w.upper()
        elif r < 0.45:
            w = w.capitalize()
        if rng.random() < 0.5:
            w = w.rstrip(".,;:?!") or w
        out.append(w)
    seps = [" ", "  ", "\n", " \t ", " "]
    return "".join(w + rng.choice(seps) for w in out).strip()


_INTRA_WORD = re.compile(r"(?<=[^\W_])(?:[^\w\s]|_)+(?=[^\W_])")
_MARKS = ("'", "-", "/", ".", ",", ":", "’", "–", "·")


def edit_punctuation(text: str, rng: random.Random, spaced: bool = False) -> str:
    """``text`` with every run of punctuation between two letters/digits deleted (half of
    them) or replaced by another mark (the other half); ``spaced``: replaced by a space."""
    def swap(m: re.Match[str]) -> str:
        if spaced:
            return " "
        if rng.random() < 0.5:
            return ""
        return rng.choice([c for c in _MARKS if c != m.group()])

    return _INTRA_WORD.sub(swap, text)


def _near_miss_chunks(text: str, budget: int, count: Callable[[str], int]) -> list[str]:
    from dataguard.text.normalize_text import NormalizeConfig, normalize_batch

    words = normalize_batch([text], NormalizeConfig())[0].split()
    chunks: list[list[str]] = [[]]
    for w in words:
        if chunks[-1] and count(" ".join([*chunks[-1], w])) > budget:
            chunks.append([])
        chunks[-1].append(w)
    return [" ".join(c) for c in chunks if c]


def plant(train: Sequence[dict[str, str]], items: Sequence[tuple[str, str, str]], per_kind: int,
          seed: int = 0, partial_share: float = 0.6, min_words: int = 25,
          count_tokens: Callable[[str], int] | None = None, near_miss_tokens: int = 10) -> list[dict[str, Any]]:
    """Canonical row dicts (id, source, messages, meta with ``kind``/``set``/``item``).

    ``train`` holds Alpaca rows (instruction/input/output); ``items`` (set, item id, text).
    """
    count = count_tokens or (lambda s: len(s.split()))
    rng = random.Random(seed)
    usable = [it for it in items if len(it[2].split()) >= min_words]
    rng.shuffle(usable)
    rows: list[dict[str, Any]] = []
    t_rows = list(train)
    rng.shuffle(t_rows)
    t_idx = 0

    def next_train() -> dict[str, str]:
        nonlocal t_idx
        row = t_rows[t_idx % len(t_rows)]
        t_idx += 1
        return row

    def add(kind: str, user: str, assistant: str, item: tuple[str, str, str] | None) -> None:
        meta = {"kind": kind, "set": item[0] if item else None, "item": item[1] if item else None}
        rows.append({"id": f"planted:{len(rows)}", "source": "planted", "label": None,
                     "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
                     "meta": json.dumps(meta, sort_keys=True)})

    k = 0
    for kind in KINDS:
        for _ in range(per_kind):
            t = next_train()
            prompt = (t["instruction"] + ("\n" + t["input"] if t.get("input") else "")).strip()
            if kind in ("short", "clean"):
                if kind == "short":
                    u, a = SHORT_TEXTS[rng.randrange(len(SHORT_TEXTS))]
                    add(kind, u, a, None)
                else:
                    add(kind, prompt, t["output"], None)
                continue
            item = usable[k % len(usable)]
            k += 1
            text = item[2]
            if kind == "verbatim":
                add(kind, text, t["output"], item)
            elif kind == "edited":
                add(kind, _edit(text, rng), t["output"], item)
            elif kind == "embedded":
                out = t["output"]
                cut = out.rfind(". ", 0, max(1, len(out) // 2)) + 1 or len(out) // 2
                add(kind, prompt, out[:cut].rstrip() + "\n\nFor example:\n" + text + "\n\n" + out[cut:].lstrip(), item)
            elif kind == "partial":
                words = text.split()
                m = max(1, round(len(words) * partial_share))
                start = rng.randrange(0, len(words) - m + 1)
                add(kind, prompt, t["output"] + "\n\n" + " ".join(words[start:start + m]), item)
            elif kind == "near_miss":
                fillers = [w for w in t["output"].split() if w.isalpha()] or ["and"]
                parts = []
                for j, chunk in enumerate(_near_miss_chunks(text, near_miss_tokens, count)):
                    parts += [chunk, fillers[j % len(fillers)]]
                add(kind, prompt, " ".join(parts), item)
    return rows


def row_text(row: dict[str, Any]) -> str:
    """The whole conversation as one text (what document-level methods scan)."""
    return "\n".join(m["content"] for m in row["messages"])
