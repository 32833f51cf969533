"""The batch path (plain Alpaca rows, mapped column-wise) gives exactly what the per-record path
gives, and both run the one list of record checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dataguard import formats
from dataguard.formats import checks
from dataguard.formats.base import Mapped, Reject, TwoTurnRows
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.stages.normalize import Normalizer
from dataguard.stages.normalize_stats import totals

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


def _taken(records: list[Any], options: SourceOptions, norm: Normalizer) -> list[int]:
    """Batch indices the batch path maps and clears."""
    groups = formats.map_batch(records, [None] * len(records), options, norm._context)
    return [i for rows in groups for i in rows.index]


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the batch path ran")


def _both_paths(monkeypatch, records: list[Any], options: SourceOptions, errors_at: tuple[int, ...] = (),
                **kwargs: Any):
    fast = Normalizer(**kwargs).normalize(_batch(records, errors_at), options)
    with monkeypatch.context() as m:
        m.setattr(formats, "map_batch", lambda *a, **k: [])
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
    taken = _taken(records, SourceOptions(name="s"), Normalizer(check_placeholders=check_placeholders))
    assert 0 < len(taken) < len(records)  # both paths really ran


def test_real_alpaca_data_same_result_and_mostly_fast(monkeypatch, real_data: Path) -> None:
    records = json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())
    records += json.loads((real_data / "gpteacher_toolformer" / "toolformer-dedupe-only-dataset.head1000.json").read_text())
    for options in (SourceOptions(name="s"), SourceOptions(name="s", format="alpaca")):
        fast, slow = _both_paths(monkeypatch, records, options)
        _assert_same(fast, slow)
    assert len(_taken(records, SourceOptions(name="s"), Normalizer())) > 0.95 * len(records)


@pytest.mark.parametrize("options, roles", [
    (SourceOptions(name="s", format="dolly"), None),
    (SourceOptions(name="s", aliases={"question": "instruction"}), None),
    (SourceOptions(name="s"), ["user", "system"]),
])
def test_fast_path_steps_aside(monkeypatch, options: SourceOptions, roles: list[str] | None) -> None:
    kwargs = {"allowed_roles": roles} if roles else {}
    records = CRAFTED[:3]
    norm = Normalizer(**kwargs)
    if options.aliases:  # aliases change what a record holds: the stage keeps the input off the batch path
        with monkeypatch.context() as m:
            m.setattr(formats, "map_batch", _never)
            norm.normalize(_batch(records), options)
    else:
        assert _taken(records, options, norm) == []
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
    assert _taken(records, SourceOptions(name="s"), Normalizer()) == [0, 1, 2, 3]


def _mentions_paris(mapped: Mapped, ctx: checks.Context) -> None:
    if any("Paris" in text for _, text in mapped.turns):
        raise Reject("mentions_paris", "a turn mentions Paris")


def _real_alpaca(real_data: Path) -> list[dict[str, Any]]:
    return json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())


@pytest.mark.parametrize("with_batch_form", [False, True])
def test_a_check_added_to_the_list_applies_to_both_paths(monkeypatch, real_data: Path,
                                                         with_batch_form: bool) -> None:
    """One list of checks: a check appended to RECORD_CHECKS rejects plain rows that the batch
    path would otherwise have kept, whether or not the check has a batch form."""
    records = _real_alpaca(real_data)
    paris = {i for i, r in enumerate(records) if "Paris" in r["instruction"] + r["input"] + r["output"]}
    assert paris
    options = SourceOptions(name="s")
    before = _taken(records, options, Normalizer())
    assert paris <= set(before)  # without the new check, the batch path keeps them
    calls: list[int] = []

    def batch_form(rows: TwoTurnRows, ctx: checks.Context) -> list[int]:
        calls.append(len(rows))
        return [j for j, (u, a) in enumerate(zip(rows.user, rows.assistant, strict=True)) if "Paris" in u + a]

    new = checks.Check("paris", ("mentions_paris",), _mentions_paris, batch_form if with_batch_form else None)
    monkeypatch.setattr(checks, "RECORD_CHECKS", [*checks.RECORD_CHECKS, new])
    after = _taken(records, options, Normalizer())
    assert set(after) == set(before) - paris  # the batch path hands them to the per-record path
    assert bool(calls) is with_batch_form
    fast, slow = _both_paths(monkeypatch, records, options)
    _assert_same(fast, slow)
    rejected = fast.rejected.to_pylist()
    assert {int(r["id"].split(":")[1]) for r in rejected if r["reason"] == "mentions_paris"} == paris
    assert totals(fast.stats)["reasons"]["mentions_paris"] == len(paris)


def test_batch_forms_flag_every_row_their_row_form_rejects(real_data: Path) -> None:
    """Each check's batch form may over-approximate but never miss a row its row form rejects."""
    plain = [r for r in CRAFTED + _real_alpaca(real_data) if type(r) is dict and r.keys() <= {"instruction", "input", "output"}]
    rows = formats.alpaca.map_batch(plain, [None] * len(plain), SourceOptions(name="s"))
    assert len(rows) > 900
    for allowed in (frozenset({"user", "assistant"}), frozenset({"user", "system"})):
        for styles in (None, ("jinja", "double_angle"), ("jinja", "double_angle", "brace", "angle", "square")):
            ctx = checks.Context(allowed, styles)
            for check in checks.RECORD_CHECKS:
                if check.batch is None or not check.applies(rows.fmt):
                    continue
                flagged = set(check.batch(rows, ctx))
                failing = {j for j in range(len(rows)) if checks._fails(check, rows.mapped(j), ctx)}
                assert failing <= flagged, check.name


def test_over_approximating_batch_form_changes_nothing(monkeypatch) -> None:
    """A batch form that flags every row sends every row to the per-record path: same result."""
    records = CRAFTED * 2
    expected = Normalizer().normalize(_batch(records), SourceOptions(name="s"))
    first = checks.RECORD_CHECKS[0]
    everything = checks.Check(first.name, first.reasons, first.row, lambda rows, ctx: range(len(rows)))
    monkeypatch.setattr(checks, "RECORD_CHECKS", [everything, *checks.RECORD_CHECKS[1:]])
    assert _taken(records, SourceOptions(name="s"), Normalizer()) == []
    _assert_same(Normalizer().normalize(_batch(records), SourceOptions(name="s")), expected)
