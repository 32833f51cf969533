"""LanguageStage on real data: an SFT demo set with Chinese rows among English ones."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.records import canonical_table
from dataguard.stage import StageConfigError
from dataguard.stages.language import LanguageStage
from dataguard.stages.normalize import Normalizer

CJK = re.compile(r"[\u3400-\u9fff]")


def _read(folder: Path, kind: str) -> pa.Table:
    files = sorted((folder / kind).glob("*.arrow"))
    tables = [ipc.open_stream(f.read_bytes()).read_all() for f in files]  # Arrow IPC streams
    return pa.concat_tables(tables) if tables else pa.table({})


def _cjk_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(bool(CJK.match(c)) for c in letters) / max(len(letters), 1)


@pytest.fixture(scope="module")
def runs(real_data: Path, tmp_path_factory) -> dict[int, Path]:
    """The same input through the pipeline with one and with two workers."""
    src = real_data / "messages_kto_demo" / "v1_sft_demo.jsonl"
    out = {}
    for workers in (1, 2):
        folder = tmp_path_factory.mktemp(f"lang{workers}") / "out"
        # the set's identity rows hold {{name}} slots: keep them, this test is about languages
        Pipeline([LanguageStage(languages=["en"])], normalizer=Normalizer(check_placeholders=False),
                 workers=workers, batch_rows=120).run([InputSpec(path=str(src))], folder)
        out[workers] = folder
    return out


def test_chinese_rows_are_rejected_and_nothing_is_lost(runs):
    folder = runs[1]
    manifest = json.loads((folder / "manifest.json").read_text())
    counts = manifest["counts"]
    assert counts["rows_in"] == 500 and counts["rows_kept"] + counts["rows_rejected"] == 500
    rejected = _read(folder, "rejected")
    assert set(rejected.column("reason").to_pylist()) == {"wrong_language"}
    wrong = rejected.filter(pa.compute.equal(rejected.column("reason"), "wrong_language"))
    assert wrong.num_rows >= 25  # the set has ~34 Chinese conversations
    for detail, record in zip(wrong.column("detail").to_pylist(), wrong.column("record").to_pylist(), strict=True):
        assert detail.startswith("detected 'zh'") and "allowed: en" in detail
        text = "\n".join(m["content"] for m in json.loads(record)["messages"])
        assert _cjk_share(text) > 0.3, text[:200]  # checked without the detector: mostly Han characters
    kept = _read(folder, "data")
    texts = ["\n".join(m["content"] for m in msgs) for msgs in kept.column("messages").to_pylist()]
    assert sum(_cjk_share(t) > 0.3 for t in texts) <= 2  # at most a couple too short to judge
    assert set(kept.column("language").drop_null().to_pylist()) - {"zh"}  # English (and friends) kept
    assert kept.schema.field("language_confidence").type == pa.float32()


def test_same_bytes_with_one_or_two_workers(runs):
    for kind in ("data", "rejected"):
        one = sorted((runs[1] / kind).glob("*.arrow"))
        two = sorted((runs[2] / kind).glob("*.arrow"))
        assert [f.name for f in one] == [f.name for f in two]
        assert all(a.read_bytes() == b.read_bytes() for a, b in zip(one, two, strict=True))


def test_short_or_unsure_rows_are_kept_unjudged_and_flag_keeps_everything(real_data):
    rows = [{"id": "short", "source": "s", "messages": [{"role": "user", "content": "你好"},
                                                         {"role": "assistant", "content": "hi"}]},
            {"id": "fr", "source": "s", "messages": [
                {"role": "user", "content": "Pouvez-vous m'expliquer comment fonctionne la photosynthèse ?"},
                {"role": "assistant", "content": "La photosynthèse transforme la lumière en énergie chimique."}]},
            {"id": "en", "source": "s", "messages": [
                {"role": "user", "content": "Can you explain how photosynthesis works in plants?"},
                {"role": "assistant", "content": "Plants turn light, water and carbon dioxide into sugar."}]}]
    table = canonical_table(rows)
    stage = pickle.loads(pickle.dumps(LanguageStage(languages=["en", "de"])))
    out = stage.apply(stage.score(table))
    stage.absorb([out.stats])
    assert out.kept.column("id").to_pylist() == ["short", "en"]
    assert out.rejected.column("id").to_pylist() == ["fr"]
    assert out.kept.column("language").to_pylist() == [None, "en"]  # too short: not judged
    desc = stage.describe()
    assert desc["summary"]["rows_not_judged"] == 1 and desc["summary"]["rows_wrong_language"] == 1
    json.dumps(desc)
    flag = LanguageStage(languages=["en"], action="flag")
    assert flag.apply(flag.score(table)).kept.num_rows == 3
    both = LanguageStage(languages=["en", "fr"])
    assert both.apply(both.score(table)).kept.num_rows == 3


@pytest.mark.parametrize("kwargs, param", [
    ({"languages": []}, "languages"), ({"languages": "en"}, "languages"), ({"languages": ["english"]}, "languages"),
    ({"text": "system"}, "text"), ({"min_chars": -1}, "min_chars"), ({"max_chars": 0}, "max_chars"),
    ({"min_confidence": 1.5}, "min_confidence"), ({"action": "relabel"}, "action"),
])
def test_bad_params_name_the_parameter(kwargs, param):
    with pytest.raises(StageConfigError, match=param) as err:
        LanguageStage(**kwargs)
    assert err.value.param == param


def test_config_error_names_the_key_and_line(tmp_path):
    from dataguard.config import ConfigError, load_config

    spec = tmp_path / "p.yaml"
    (tmp_path / "x.jsonl").write_text('{"instruction": "hi", "output": "hello"}\n')
    spec.write_text("inputs:\n  - path: x.jsonl\noutput: out\nstages:\n  - language:\n      languages: [klingon]\n")
    with pytest.raises(ConfigError, match=r"p\.yaml:6.*languages"):
        load_config(spec)


def test_known_codes_are_the_models_own():
    """`languages` is validated without loading the model; the list must be the model's."""
    from dataguard.stages.language import KNOWN_LANGUAGES, supported_languages

    assert KNOWN_LANGUAGES == set(supported_languages())
