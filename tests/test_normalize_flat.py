"""The column-wise fast path for plain Alpaca rows gives exactly what the per-record path gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.stages import normalize as normalize_mod
from dataguard.stages.normalize import Normalizer
from dataguard.stages.normalize_flat import FlatRows, plain_alpaca_rows

CRAFTED: list[Any] = [
    {"instruction": "Name a colour.", "input": "", "output": "Blue."},
    {"instruction": "Add.", "input": "2 + 2", "output": "4"},
    {"instruction": "", "input": "only the input", "output": "ok"},
    {"instruction": "", "input": "", "output": "no prompt"},
    {"instruction": "   ", "input": "\x1c", "output": "whitespace prompt"},
    {"instruction": "Say nothing.", "input": "", "output": " \u3000 "},
    {"instruction": "Greet {{name}}.", "input": "", "output": "Hello!"},
    {"instruction": "Compute.", "input": "", "output": "48/2 = <<48/2=24>>24"},
    {"instruction": "Template", "input": "", "output": "Use `{{ x }}` in Jinja."},
    {"instruction": "Math", "input": "", "output": "a < b and b << c"},
    {"instruction": "x", "input": None, "output": "input is null"},
    {"instruction": "x", "output": "no input key"},
    {"instruction": "x", "input": 3, "output": "wrong input type"},
    {"instruction": 7, "input": "", "output": "wrong instruction type"},
    {"instruction": "x", "input": "", "output": ["not", "a", "string"]},
    {"instruction": "x", "input": ""},
    {"instruction": "x", "input": "", "output": "has an id", "id": "own-7"},
    {"instruction": "x", "input": "", "output": "extra key", "source_url": "http://a.b"},
    {"instruction": "x", "input": "", "output": "with system", "system": "Be brief."},
    {"instruction": "x", "input": "", "output": "labelled", "label": "good"},
    {"instruction": "x", "input": "", "output": "history", "history": [["hi", "hello"]]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
    ["not", "an", "object"],
    "a bare string",
]


def _batch(records: list[Any], errors_at: tuple[int, ...] = ()) -> RawBatch:
    batch = RawBatch(source="s")
    for i, rec in enumerate(records):
        if i in errors_at:
            batch.add_error(i, "invalid_json", "line 1: broken", "{oops")
        else:
            batch.add(i, rec)
    return batch


def _both_paths(monkeypatch, records: list[Any], options: SourceOptions, errors_at: tuple[int, ...] = (),
                **kwargs: Any):
    fast = Normalizer(**kwargs).normalize(_batch(records, errors_at), options)
    with monkeypatch.context() as m:
        m.setattr(normalize_mod, "plain_alpaca_rows", lambda *a, **k: FlatRows([], [], []))
        slow = Normalizer(**kwargs).normalize(_batch(records, errors_at), options)
    return fast, slow


def _assert_same(fast, slow) -> None:
    assert fast.kept.schema == slow.kept.schema
    assert fast.kept.to_pylist() == slow.kept.to_pylist()
    assert fast.kept.equals(slow.kept)
    assert fast.rejected.equals(slow.rejected)
    assert fast.stats == slow.stats


@pytest.mark.parametrize("check_placeholders", [True, False])
def test_crafted_rows_same_result_on_both_paths(monkeypatch, check_placeholders: bool) -> None:
    records = CRAFTED * 3  # interleaved fast and slow rows, in input order
    fast, slow = _both_paths(monkeypatch, records, SourceOptions(name="s"), errors_at=(5, 30),
                             check_placeholders=check_placeholders)
    _assert_same(fast, slow)
    assert fast.kept.num_rows + fast.rejected.num_rows == len(records)
    taken = plain_alpaca_rows([r for r in records], [None] * len(records), SourceOptions(name="s"),
                              Normalizer().allowed_roles, check_placeholders)
    assert 0 < len(taken.index) < len(records)  # both paths really ran


def test_real_alpaca_data_same_result_and_mostly_fast(monkeypatch, real_data: Path) -> None:
    records = json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())
    records += json.loads((real_data / "gpteacher_toolformer" / "toolformer-dedupe-only-dataset.head1000.json").read_text())
    for options in (SourceOptions(name="s"), SourceOptions(name="s", format="alpaca")):
        fast, slow = _both_paths(monkeypatch, records, options)
        _assert_same(fast, slow)
    taken = plain_alpaca_rows(records, [None] * len(records), SourceOptions(name="s"), Normalizer().allowed_roles, True)
    assert len(taken.index) > 0.95 * len(records)


@pytest.mark.parametrize("options, roles", [
    (SourceOptions(name="s", format="dolly"), None),
    (SourceOptions(name="s", aliases={"question": "instruction"}), None),
    (SourceOptions(name="s"), ["user", "system"]),
])
def test_fast_path_steps_aside(monkeypatch, options: SourceOptions, roles: list[str] | None) -> None:
    kwargs = {"allowed_roles": roles} if roles else {}
    records = CRAFTED[:3]
    norm = Normalizer(**kwargs)
    assert plain_alpaca_rows(records, [None] * 3, options, norm.allowed_roles, True).index == []
    fast, slow = _both_paths(monkeypatch, records, options, **kwargs)
    _assert_same(fast, slow)


def test_surrogate_rows_leave_the_fast_path_with_the_same_result(monkeypatch) -> None:
    """Records built in Python may hold lone surrogates; both paths reject them alike."""
    records = [
        {"instruction": "fine", "input": "", "output": "ok"},
        {"instruction": "bad \ud800", "input": "", "output": "ok"},
        {"instruction": "fine", "input": "caf\u00e9", "output": "bad \udcff"},
        {"instruction": "caf\u00e9", "input": "", "output": "ok"},
    ]
    fast, slow = _both_paths(monkeypatch, records, SourceOptions(name="s"))
    _assert_same(fast, slow)
    assert fast.kept.column("id").to_pylist() == ["s:0", "s:3"]
    assert fast.rejected.column("reason").to_pylist() == ["invalid_unicode", "invalid_unicode"]
    assert plain_alpaca_rows(records, [None] * 4, SourceOptions(name="s"), Normalizer().allowed_roles,
                             True).index == [0, 1, 2, 3]
