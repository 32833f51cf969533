"""Field aliases at any depth, on real rows from tests/data reshaped into nested layouts."""

from __future__ import annotations

import copy
import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dataguard.config import ConfigError, load_config
from dataguard.io.bounded import InputError
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stage import StageConfigError
from dataguard.stages.dedup import DedupStage
from dataguard.stages.normalize import Normalizer
from dataguard.stages.normalize_aliases import NestedAlias, parse_alias
from dataguard.stages.normalize_stats import totals


def _batch(records: list[Any]) -> RawBatch:
    batch = RawBatch(source="s")
    for i, rec in enumerate(records):
        batch.add(i, rec)
    return batch


def _norm(records: list[Any], aliases: dict[str, str] | None = None, normalizer: Normalizer | None = None):
    norm = normalizer or Normalizer()
    return norm.normalize(_batch(records), SourceOptions(name="s", aliases=aliases or {}))


def _sharegpt(real_data: Path) -> list[dict[str, Any]]:
    return json.loads((real_data / "sharegpt_fastchat_dummy/dummy_conversation.json").read_text(encoding="utf-8"))


def test_list_element_keys_renamed_inside_every_turn(real_data: Path) -> None:
    records = _sharegpt(real_data)
    nested = [{"id": r["id"], "conversations": [{"speaker": t["from"], "text": t["value"]} for t in r["conversations"]]}
              for r in records]
    before = copy.deepcopy(nested)
    want = _norm(records)
    got = _norm(nested, {"conversations[].speaker": "from", "conversations[].text": "conversations[].value"})
    assert got.kept.equals(want.kept) and got.rejected.num_rows == want.rejected.num_rows == 0
    assert totals(got.stats)["aliases"] == {"conversations[].speaker->from": len(records),
                                    "conversations[].text->conversations[].value": len(records)}
    assert nested == before  # input records are never modified


def test_messages_text_to_content_keeps_extra_turn_fields(real_data: Path) -> None:
    records = json.loads((real_data / "messages_kto_demo/kto_en_demo.head100.json").read_text(encoding="utf-8"))
    nested = [{**r, "messages": [{"role": m["role"], "text": m["content"], "lang": "en"} for m in r["messages"]]}
              for r in records]
    got = _norm(nested, {"messages[].text": "content"}).kept.to_pylist()
    want = _norm(records).kept.to_pylist()
    assert [g["messages"] for g in got] == [w["messages"] for w in want]
    assert [g["label"] for g in got] == [w["label"] for w in want]
    # the turn's own extra key is still kept in meta, as for any turn field
    assert all(json.loads(g["meta"])["turn_fields"]["0"] == {"lang": "en"} for g in got)


def test_nested_key_moved_to_top_level_and_parent_dropped_when_empty(real_data: Path) -> None:
    records = json.loads((real_data / "alpaca_en_demo/alpaca_en_demo.json").read_text(encoding="utf-8"))[:200]
    nested = [{"task": {"instruction": r["instruction"], "input": r["input"]}, "output": r["output"],
               "entities": {"uid": f"u{i}", "team": "t"}} for i, r in enumerate(records)]
    out = _norm(nested, {"task.instruction": "instruction", "task.input": "input", "entities.uid": "user_id"})
    want = _norm(records).kept
    got = out.kept
    assert got.column("messages").equals(want.column("messages"))
    metas = [json.loads(m) for m in got.column("meta").to_pylist()]
    # "task" emptied by the moves is gone; "entities" keeps what was not moved
    assert metas[7] == {"user_id": "u7", "entities": {"team": "t"}}
    assert totals(out.stats)["aliases"]["entities.uid->user_id"] == len(records)


def test_flattened_dotted_column_and_shadowing(real_data: Path) -> None:
    with (real_data / "banking77/test.csv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))[:300]
    # a CSV flattened by pandas.json_normalize has a column literally named "intent.name"
    flat = [{"text": r["text"], "intent.name": r["category"]} for r in rows]
    got = _norm(flat, {"intent.name": "label"}).kept
    assert got.column("label").to_pylist() == [r["category"] for r in rows]
    # a nested destination that already has a value keeps it beside, as for top-level aliases
    rec = {"conversations": [{"from": "human", "speaker": "user", "value": "hi"}, {"from": "gpt", "value": "ho"}]}
    out = _norm([rec], {"conversations[].speaker": "from"})
    assert out.kept.column("messages")[0].as_py()[0] == {"role": "user", "content": "hi"}
    assert json.loads(out.kept.column("meta")[0].as_py())["turn_fields"] == {"0": {"from:shadowed": "human"}}


@pytest.mark.parametrize(("src", "dst", "message"), [
    ("conversations[]", "x", "must end with a key"),
    ("a..b", "c", "bad source path"),
    ("a[x].b", "c", "bad source path"),
    ("messages[].text", "turns[].content", "repeat the source's list path"),
    ("speaker", "conversations[].from", "repeat the source's list path"),
    ("a[].b", "a[].c[].d", "no deeper into lists"),
    ("a.b", "a.b", "the same field"),
    (" a.b", "c", "surrounding spaces"),
    ("", "c", "non-empty"),
])
def test_bad_alias_paths(src: str, dst: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_alias(src, dst)
    with pytest.raises(StageConfigError, match="aliases") as err:
        Normalizer(aliases={src: dst})
    assert err.value.param == "aliases"
    assert isinstance(parse_alias("conversations[].speaker", "from"), NestedAlias)
    assert parse_alias("question", "instruction") == ("question", "instruction")


def test_config_error_is_one_line_at_the_alias(tmp_path: Path, real_data: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"inputs:\n  - path: {real_data / 'sharegpt_fastchat_dummy/dummy_conversation.json'}\n"
                   "    aliases: {'conversations[]': from}\nstages: []\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{cfg}:3: inputs[0].aliases") and "must end with a key" in text
    cfg.write_text(f"inputs:\n  - path: {real_data / 'sharegpt_fastchat_dummy/dummy_conversation.json'}\n"
                   "normalize:\n  aliases: {'a..b': c}\nstages: []\n")
    with pytest.raises(ConfigError, match=r"p.yaml:4: normalize.aliases"):
        load_config(cfg)


def _write(tmp_path: Path, name: str, records: list[Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def test_unmatched_alias_is_one_line_naming_alias_input_and_file(tmp_path: Path, real_data: Path) -> None:
    records = _sharegpt(real_data)[:120]
    path = _write(tmp_path, "chat.json", records)
    spec = InputSpec(path=path, name="chat", aliases={"conversations[].speaker": "from"})  # nothing has "speaker"
    with pytest.raises(InputError) as err:
        Pipeline([DedupStage()], workers=1, batch_rows=50).run([spec], tmp_path / "out")
    text = str(err.value)
    assert "\n" not in text
    assert "'conversations[].speaker -> from'" in text and "'chat'" in text and "120 records" in text
    assert str(path) in text  # the input's file is named
    # it stops right after the first segment: the dedup fit and the next segment never run
    assert (tmp_path / "out" / "_work" / "seg00").is_dir() and not (tmp_path / "out" / "_work" / "seg01").exists()
    # the same check on the normalizer directly
    norm = Normalizer()
    batch = _batch(records)
    options = SourceOptions(name="chat", aliases={"conversations[].speaker": "from"}, path=str(path))
    with pytest.raises(InputError) as direct:
        norm.absorb([norm.normalize(batch, options).stats])
    assert f"of input 'chat' ({path}) matched none of its 120 records" in str(direct.value)
    # the same alias on a file that has the field runs, and is counted once per record
    nested = [{"conversations": [{"speaker": t["from"], "value": t["value"]} for t in r["conversations"]]}
              for r in records]
    ok = InputSpec(path=_write(tmp_path, "nested.json", nested), name="nested",
                   aliases={"conversations[].speaker": "from"})
    result = Pipeline([], workers=1, batch_rows=50).run([ok], tmp_path / "out2", fresh=True)
    assert result.manifest["counts"]["rows_kept"] == len(records)
    table = next(b for b in result.manifest["stages"][0]["description"]["blocks"] if b["title"] == "Field aliases applied")
    assert table["rows"] == [["conversations[].speaker->from", len(records)]]


def test_global_aliases_need_a_match_in_some_input(tmp_path: Path, real_data: Path) -> None:
    records = _sharegpt(real_data)[:60]
    nested = [{"conversations": [{"speaker": t["from"], "value": t["value"]} for t in r["conversations"]]}
              for r in records]
    plain, renamed = _write(tmp_path, "plain.json", records), _write(tmp_path, "renamed.json", nested)
    normalizer = Normalizer(aliases={"conversations[].speaker": "from"})
    result = Pipeline([], normalizer=normalizer, workers=1).run(
        [InputSpec(path=plain, name="plain"), InputSpec(path=renamed, name="renamed")], tmp_path / "out")
    counts = result.manifest["counts"]
    assert counts["rows_in"] == counts["rows_kept"] == 2 * len(records)
    with pytest.raises(InputError, match="normalize.aliases matched no record of any input: plain"):
        Pipeline([], normalizer=Normalizer(aliases={"conversations[].speaker": "from"}), workers=1).run(
            [InputSpec(path=plain, name="plain")], tmp_path / "out2")


def test_per_input_alias_wins_over_global_and_flat_counts_unchanged(real_data: Path) -> None:
    with (real_data / "banking77/test.csv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))[:100]
    norm = Normalizer(aliases={"category": "intent"})
    out = norm.normalize(_batch(rows), SourceOptions(name="s", aliases={"category": "label"}))
    assert out.kept.num_rows == 100 and totals(out.stats)["aliases"] == {"category->label": 100}
    assert Counter(out.kept.column("label").to_pylist()) == Counter(r["category"] for r in rows)
    assert totals(out.stats)["alias_inputs"]["s"]["input"] == {"category->label": 100}
    assert totals(out.stats)["alias_inputs"]["s"]["global"] == {}
    # no aliases: no per-input bookkeeping at all (the flat fast path stays as it was)
    assert "alias_inputs" not in totals(_norm(rows).stats)
