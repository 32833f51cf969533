"""Unfilled template slots need a template-slot shape: no false rejects on real posts and prose."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from dataguard.formats import Context, map_batch
from dataguard.formats.placeholders import (
    DEFAULT_STYLES,
    STYLES,
    find_placeholders,
    may_hold_placeholder,
)
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.stage import StageConfigError
from dataguard.stages.normalize import Normalizer

# Row 6810 (sci.crypt/16127) of the 20 Newsgroups test set, verbatim; the full post is in
# ../shared/data/20news_label_errors, past the 600 rows sliced into tests/data. The old rule
# rejected it as unfilled_placeholder for "<< impossible>>".
POST_6810 = ("The clipper chip will make it much more difficult for the\nnon-authorized person to eavesdrop "
             "(note that I DO NOT write << impossible>> ).\nThe privacy will thus improve from the current "
             "situation.")


def _posts(real_data: Path) -> list[dict[str, Any]]:
    folder = real_data / "20news_label_errors"
    rows = []
    for name in ("20news_test_texts.head600.jsonl.gz", "20news_test_texts.text200.jsonl.gz"):
        with gzip.open(folder / name, "rt", encoding="utf-8") as f:
            rows += [json.loads(line) for line in f]
    return rows


def _normalize(records: list[Any], **kwargs: Any):
    return Normalizer(**kwargs).normalize(_raw(records), SourceOptions(name="s"))


def test_real_20news_posts_are_not_rejected(real_data: Path) -> None:
    posts = _posts(real_data)
    assert len(posts) == 600 + 7532
    records = [{"text": p["text"], "label": p["label_name"]} for p in posts] + [{"text": POST_6810, "label": "x"}]
    out = _normalize(records)
    assert out.rejected.num_rows == 0 and out.kept.num_rows == len(records)
    # The posts are full of brackets: the default rule must not be passing them by accident.
    assert sum("<" in r["text"] for r in records) > 1000 and sum("[" in r["text"] for r in records) > 100
    # The same post as the prompt of a chat row (the per-record path, not the fast path) is kept.
    chat = [{"instruction": "Summarise this post.", "input": POST_6810, "output": "It is about the clipper chip."}]
    assert _normalize(chat).rejected.num_rows == 0


def _raw(records: list[Any]) -> RawBatch:
    batch = RawBatch(source="s")
    for i, rec in enumerate(records):
        batch.add(i, rec)
    return batch


def test_opt_in_shapes_on_real_posts_stay_rare_and_slot_like(real_data: Path) -> None:
    """Why {name}/<name>/[name] are opt-in: even on 20 Newsgroups they hit words in brackets."""
    texts = [p["text"] for p in _posts(real_data)]
    hits = [slot for t in texts for slot in find_placeholders(t, STYLES)]
    assert 0 < len(hits) < 100
    assert all(" " not in h.strip("{}<>[]") for h in hits)  # an identifier inside, never prose
    assert not any(h.lower() in ("<br>", "<div>", "[sic]", "[inst]") for h in hits)


@pytest.mark.parametrize(("text", "found"), [
    # real slots, default styles
    ("Dear {{customer_name}}, thanks.", ["{{customer_name}}"]),
    ("Hello, I am {{name}} by {{ author }}.", ["{{name}}", "{{ author }}"]),
    ("{{ user.name | upper }}", ["{{ user.name | upper }}"]),
    ("Dear <<customer_name>>,", ["<<customer_name>>"]),
    # text that only looks bracketed
    (POST_6810, []),
    ("if a < b > c then", []),
    ("I DO NOT write << impossible>>", []),
    ("<< name >>", []),
    ("{{}} and {{ }}", []),
    ("48/2 = <<48/2=24>>24", []),
    ("Llama 2 wraps it in <<SYS>> markers", []),
    ("url: https://ghcr.io/${{ github.repository }}", []),
    ("$\\frac{{a}}{b}$", []),
    ("Use `{{ title }}` in the Vue template.", []),
    ("```json\n{\"user\": {\"name\": \"{{name}}\"}}\n```\nabove is the payload", []),
])
def test_default_rule(text: str, found: list[str]) -> None:
    assert find_placeholders(text) == found
    if found:
        assert may_hold_placeholder(text)


@pytest.mark.parametrize(("text", "found"), [
    ("Our {product} ships today.", ["{product}"]),
    ("Hello <NAME>, your order <order_id> shipped.", ["<NAME>", "<order_id>"]),
    ("Signed, [Your_Name]", ["[Your_Name]"]),
    ("{}", []),
    ("a set {1, 2} and {x}", []),
    ("line one<br>line two <div>box</div> <p>", []),
    ("<tool_call>{\"name\": \"f\"}</tool_call>", []),
    ("List<String> and a[i] and x^{n} and ${HOME} and #{name}", []),
    ("see [1] and [the docs](https://x.y) and [ref][2] and - [x] done", []),
    ("he said [sic] and [INST] hi [/INST]", []),
    ("code: `print(f'{name}')` and ```\n<stdio.h> {value}\n```", []),
    ("a < b > c, x <= y, <a@b.com>", []),
])
def test_opt_in_shapes(text: str, found: list[str]) -> None:
    assert find_placeholders(text, STYLES) == found
    assert find_placeholders(text) == [s for s in found if s.startswith(("{{", "<<"))]  # default: none of these
    if found:
        assert may_hold_placeholder(text, STYLES)


def test_normalizer_styles_and_fast_path_agree(real_data: Path) -> None:
    """Rows the batch path clears hold no slot under the same styles (it is a superset test)."""
    records = json.loads((real_data / "alpaca_en_demo/alpaca_en_demo.json").read_text(encoding="utf-8"))
    records.append({"instruction": "Write to {customer}.", "input": "", "output": "Dear <NAME>, hello."})
    batch = _raw(records)
    for styles in (DEFAULT_STYLES, STYLES):
        groups = map_batch(batch.records, batch.errors, SourceOptions(name="s"),
                           Context(frozenset({"user", "assistant"}), styles))
        cleared = {i for rows in groups for i in rows.index}
        assert len(cleared) > 0.9 * len(records)
        with_slots = {i for i, r in enumerate(records)
                      if find_placeholders(r["instruction"] + "\n" + r["input"], styles) or
                      find_placeholders(r["output"], styles)}
        assert not cleared & with_slots
        out = Normalizer(placeholder_styles=list(styles)).normalize(_raw(records), SourceOptions(name="s"))
        assert out.kept.num_rows + out.rejected.num_rows == len(records)
        assert out.rejected.num_rows == len(with_slots)
        assert set(out.rejected.column("reason").to_pylist()) <= {"unfilled_placeholder"}
    assert len(with_slots) > 1  # the opt-in shapes flag the crafted row and real alpaca letters


def test_placeholder_styles_config_errors() -> None:
    for bad in ("jinja", ["jinja", "percent"], []):
        with pytest.raises(StageConfigError, match="placeholder_styles"):
            Normalizer(placeholder_styles=bad)  # type: ignore[arg-type]
    desc = Normalizer(placeholder_styles=["square", "jinja"])
    assert desc.placeholder_styles == ("jinja", "square")
    assert desc.describe()["summary"]["placeholder_styles"] == ["jinja", "square"]
    assert "placeholder_styles" not in Normalizer().describe()["summary"]
