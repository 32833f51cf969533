"""Every bad config is one ConfigError naming FILE:LINE and the key, found at load time.

Each case here reproduced a crash (a traceback, a RecursionError, minutes of CPU and GBs of
memory) or a late failure in a worker before it was fixed.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from dataguard.config import MAX_DEPTH, ConfigError, _blamed_param, _Located, load_config
from dataguard.stage import StageConfigError

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "sample_data" / "alpaca_en_demo.json"
VALIDATION = REPO / "sample_data" / "messages_kto_demo.json"


def _config(tmp_path: Path, text: str | bytes, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _error(path: Path, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def _located(message: str, path: Path, line: int, key: str | None = None) -> str:
    """Assert the `FILE:LINE: key: ` head of a message; return the rest."""
    head = f"{path}:{line}: " + (f"{key}: " if key else "")
    assert message.startswith(head), f"expected {head!r} at the start of {message!r}"
    return message[len(head):]


# -------------------------------------------------------------------- bytes and YAML
def test_invalid_utf8_names_file_line_and_byte(tmp_path: Path) -> None:
    path = _config(tmp_path, f"inputs:\n  - {DATA}\n# caf\xe9 in latin-1\n".encode("latin-1"))
    rest = _located(_error(path), path, 3)
    assert rest.startswith("not valid UTF-8 (byte 0xe9 at offset") and "save the config as UTF-8" in rest


def test_utf8_bom_is_fine(tmp_path: Path) -> None:
    path = _config(tmp_path, b"\xef\xbb\xbf" + f"inputs:\n  - {DATA}\n".encode())
    assert load_config(path).inputs[0].path == DATA


@pytest.mark.parametrize("text", ["[" * 20000, "a:\n" + "".join(" " * i + "- \n" for i in range(1, 200)),
                                  "{a: " * 5000 + "1" + "}" * 5000])
def test_deep_nesting_is_refused_without_recursion(tmp_path: Path, text: str) -> None:
    path = _config(tmp_path, text)
    rest = _error(path)
    assert re.match(rf"{re.escape(str(path))}:\d+: nested deeper than {MAX_DEPTH} levels", rest), rest


def test_nesting_just_under_the_limit_is_a_normal_error(tmp_path: Path) -> None:
    path = _config(tmp_path, "x: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n")
    assert "x: unknown key" in _error(path)


BILLION_LAUGHS = "\n".join(
    [f"a0: &a0 [{','.join(['lol'] * 9)}]"]
    + [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]) + "\n"


def test_billion_laughs_fails_fast_and_clearly(tmp_path: Path) -> None:
    path = _config(tmp_path, BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 500
    start = time.perf_counter()
    rest = _error(path)
    assert time.perf_counter() - start < 2.0
    assert re.match(rf"{re.escape(str(path))}:\d+: the config holds more than 100,000 values", rest), rest
    assert "aliases" in rest


def test_alias_cycle_and_undefined_alias(tmp_path: Path) -> None:
    cycle = _config(tmp_path, "inputs: &a [*a]\n", "cycle.yaml")
    assert "refers to a value that contains it" in _located(_error(cycle), cycle, 1)
    undefined = _config(tmp_path, f"inputs: [{DATA}]\nstages: *nope\n", "undef.yaml")
    assert "the alias *nope has no anchor" in _located(_error(undefined), undefined, 2)


def test_aliases_that_share_settings_still_work(tmp_path: Path) -> None:
    path = _config(tmp_path, (
        f"inputs: [{DATA}]\n"
        "stages:\n"
        "  - dedup: &d {action: flag}\n"
        "  - dedup: *d\n"
        "  - quality: &q {char_repeat_threshold: 0.3}\n"
        "  - quality: {<<: *q, url_count_threshold: 3}\n"))
    config = load_config(path)
    assert [s.name for s in config.stages] == ["dedup", "dedup", "quality", "quality"]


def test_error_inside_an_aliased_value_points_at_the_alias(tmp_path: Path) -> None:
    path = _config(tmp_path, (
        f"inputs: [{DATA}]\n"
        "stages:\n"
        "  - quality: &q {char_repeat_threshold: 0.3}\n"
        "  - dedup: *q\n"))
    rest = _located(_error(path), path, 4, "stages[1].dedup.char_repeat_threshold")
    assert rest.startswith("unknown parameter")


def test_line_lookup_does_not_expand_aliases() -> None:
    import yaml

    node = yaml.compose(BILLION_LAUGHS)  # composing shares nodes; only a walk would expand them
    start = time.perf_counter()
    located = _Located("x.yaml", node)
    assert time.perf_counter() - start < 1.0
    assert len(located.lines) < 200
    assert located.line(("a8", 0, 0)) == 8  # inside the anchored value: where it is written
    assert located.line(("a9", 3, 2, 1)) == 9  # through an alias: where the anchored value is written


@pytest.mark.parametrize("text, line, needle", [
    ("inputs: [x]\ninputs: [y\n", 3, "invalid YAML"),
    ("a: \x00\n", 1, "invalid YAML"),
    ("--- {inputs: [x]}\n--- {inputs: [y]}\n", 2, "invalid YAML"),
    ("inputs: [x]\nstages: !!int 1" + "0" * 5000 + "\n", 2, "invalid YAML value"),
    ("inputs: [x]\nstages: !!timestamp 2024-13-45\n", 2, "invalid YAML value"),
    ("? [a, b]\n: 1\n", 1, "invalid YAML"),
])
def test_yaml_errors_are_one_line_with_a_line_number(tmp_path: Path, text: str, line: int, needle: str) -> None:
    path = _config(tmp_path, text)
    assert needle in _located(_error(path), path, line)


def test_non_json_values_are_refused_at_their_key(tmp_path: Path) -> None:
    path = _config(tmp_path, f"inputs: [{DATA}]\noutput: !!binary aGVsbG8=\n")
    assert _located(_error(path), path, 2, "output").startswith("unsupported value of type bytes")
    dates = _config(tmp_path, f"inputs: [{DATA}]\nreport: 2024-01-01\n", "dates.yaml")
    assert load_config(dates).report == Path("2024-01-01")  # an unquoted date is just text


# -------------------------------------------------------------------- the config file itself
def test_config_path_problems(tmp_path: Path) -> None:
    assert _error(tmp_path / "missing.yaml") == f"{tmp_path / 'missing.yaml'}: config file not found"
    assert _error(tmp_path).startswith(f"{tmp_path}: is a folder")
    empty = _config(tmp_path, "# nothing\n", "empty.yaml")
    assert _error(empty) == f"{empty}: the config is empty"
    huge = _config(tmp_path, "#" * (2 << 20), "huge.yaml")
    assert "this is not a pipeline config" in _error(huge)


def test_unreadable_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _config(tmp_path, f"inputs: [{DATA}]\n")
    real_open = open

    def denied(file, *args, **kwargs):
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", denied)
    assert _error(path) == f"{path}: cannot read the config: Permission denied"


# -------------------------------------------------------------------- stage parameters
def _stage_config(tmp_path: Path, stage_yaml: str) -> Path:
    return _config(tmp_path, f"inputs:\n  - {DATA}\nstages:\n  - dedup: {{}}\n{stage_yaml}")


def test_missing_tokenizer_is_a_config_error_at_its_line(tmp_path: Path) -> None:
    path = _stage_config(tmp_path, "  - length:\n      percentile: 90\n      tokenizer: foo\n")
    rest = _located(_error(path), path, 7, "stages[1].length.tokenizer")
    assert rest.startswith("no such tokenizer: 'foo' is neither a known name ('qwen', ")
    assert "nor an existing Hugging Face tokenizer folder or tokenizer.json" in rest


def test_tokenizer_folder_must_hold_a_tokenizer(tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    path = _stage_config(tmp_path, f"  - length: {{tokenizer: {folder}}}\n")
    assert "is a folder without tokenizer.json" in _located(_error(path), path, 5, "stages[1].length.tokenizer")
    (folder / "tokenizer.json").write_text("{}")
    assert load_config(path).stages[1].tokenizer_spec == str(folder)  # checked, not loaded


def test_qwen_names_are_accepted(tmp_path: Path) -> None:
    path = _stage_config(tmp_path, "  - length: {tokenizer: Qwen2.5}\n")
    assert load_config(path).stages[1].name == "length"


def test_overlap_tokenizer_is_checked_too(tmp_path: Path) -> None:
    path = _stage_config(tmp_path, "  - overlap:\n      tokenizer: /no/such/tokenizer.json\n")
    assert "no such tokenizer" in _located(_error(path), path, 6, "stages[1].overlap.tokenizer")


@pytest.mark.parametrize("stage", ["consistency", "noise"])
def test_missing_embedding_model_is_a_config_error(tmp_path: Path, stage: str) -> None:
    path = _stage_config(tmp_path, f"  - {stage}:\n      model: /no/such/model\n")
    rest = _located(_error(path), path, 6, f"stages[1].{stage}.model")
    assert rest.startswith("no such model folder: '/no/such/model'")


def test_model_folder_without_model_files(tmp_path: Path) -> None:
    (tmp_path / "empty_model").mkdir()
    path = _stage_config(tmp_path, f"  - consistency: {{model: {tmp_path / 'empty_model'}}}\n")
    assert "has no modules.json or config.json" in _located(_error(path), path, 5, "stages[1].consistency.model")


def test_unknown_device_is_a_config_error(tmp_path: Path) -> None:
    path = _stage_config(tmp_path, "  - consistency: {device: gpu0}\n")
    assert "must be cpu, cuda, cuda:N" in _located(_error(path), path, 5, "stages[1].consistency.device")


def test_error_is_blamed_on_the_key_the_message_starts_with(tmp_path: Path) -> None:
    # `n` appears inside "must be one of" - the key guess used to pick it.
    path = _config(tmp_path, f"inputs: [{DATA}]\nstages:\n  - overlap: {{n: 13, mode: tokn}}\n")
    rest = _located(_error(path), path, 3, "stages[0].overlap.mode")
    assert rest.startswith("must be one of token, word, got 'tokn'")


def test_blamed_param_prefers_explicit_then_prefix_then_word() -> None:
    explicit = StageConfigError("threshold too high for n")
    explicit.param = "n"  # type: ignore[attr-defined]
    assert _blamed_param(explicit, {"n": 1, "threshold": 2}) == "n"
    assert _blamed_param(StageConfigError("near_duplicate: bad"), {"n": 1, "near_duplicate": 2}) == "near_duplicate"
    assert _blamed_param(StageConfigError("n: must be in 8..50"), {"n": 1, "mode": 2}) == "n"
    assert _blamed_param(StageConfigError("the mode is wrong"), {"n": 1, "mode": 2}) == "mode"
    assert _blamed_param(StageConfigError("something else"), {"n": 1}) is None


# -------------------------------------------------------------------- inputs
def test_folder_that_is_not_a_dataset(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("hello")
    path = _config(tmp_path, f"inputs:\n  - name: notes\n    path: {folder}\n")
    rest = _located(_error(path), path, 3, "inputs[0].path")
    assert "is a folder but not a saved Hugging Face dataset" in rest


def test_dataset_dict_folder_names_a_split(tmp_path: Path) -> None:
    folder = tmp_path / "dd"
    (folder / "train").mkdir(parents=True)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    path = _config(tmp_path, f"inputs: [{folder}]\n")
    assert f"give one split's folder (e.g. {folder / 'train'})" in _located(_error(path), path, 1, "inputs[0].path")


def test_saved_dataset_folder_passes_the_cheap_check(tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    path = _config(tmp_path, f"inputs: [{folder}]\n")
    assert load_config(path).inputs[0].path == folder


def test_input_whose_format_cannot_be_told(tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("hello\n")
    path = _config(tmp_path, f"inputs:\n  - path: {data}\n")
    assert "set `reader:`" in _located(_error(path), path, 2, "inputs[0].path")


def test_duplicate_input_names(tmp_path: Path) -> None:
    path = _config(tmp_path, f"inputs:\n  - {{path: {DATA}, name: a}}\n  - {{path: {VALIDATION}, name: a}}\n")
    assert "duplicate input name 'a'" in _located(_error(path), path, 3, "inputs[1].name")


# -------------------------------------------------------------------- --input and named inputs
def test_replaced_inputs_need_not_exist_but_keep_their_shape(tmp_path: Path) -> None:
    path = _config(tmp_path, "inputs:\n  - nowhere/train.jsonl\nstages:\n  - dedup: {}\n")
    config = load_config(path, replace_inputs=[str(DATA)])
    assert [(s.path, s.name) for s in config.inputs] == [(DATA, DATA.name)]
    assert config.raw["inputs"] == [{"path": str(DATA), "name": DATA.name}]
    bad_shape = _config(tmp_path, "inputs:\n  - {path: nowhere.jsonl, format: alpacca}\n", "shape.yaml")
    assert "unknown format" in _located(_error(bad_shape, replace_inputs=[str(DATA)]), bad_shape, 2,
                                        "inputs[0].format")


def test_replacing_inputs_without_inputs_in_the_config(tmp_path: Path) -> None:
    path = _config(tmp_path, "stages:\n  - dedup: {}\n")
    assert load_config(path, replace_inputs=[str(DATA)]).inputs[0].path == DATA
    assert "missing required key `inputs`" in _error(path)


def test_validation_source_must_name_an_input(tmp_path: Path) -> None:
    path = _config(tmp_path, f"inputs:\n  - {{path: {DATA}, name: train}}\nstages:\n"
                             "  - overlap: {validation_sources: [val]}\n")
    rest = _located(_error(path), path, 4, "stages[0].overlap.validation_sources")
    assert rest == "no input named 'val' (the config's inputs: 'train')"


DECONTAMINATE = (f"inputs:\n  - {{path: {DATA}, name: train}}\n  - {{path: %s, name: val}}\nstages:\n"
                 "  - overlap: {references: [], validation_sources: [val]}\n")


def test_replacing_inputs_keeps_the_validation_split(tmp_path: Path) -> None:
    path = _config(tmp_path, DECONTAMINATE % VALIDATION)
    config = load_config(path, replace_inputs=[str(DATA)])
    assert [s.name for s in config.inputs] == [DATA.name, "val"]
    assert config.kept_inputs == ["val"]


def test_kept_validation_split_must_exist(tmp_path: Path) -> None:
    path = _config(tmp_path, DECONTAMINATE % "gone/val.jsonl")
    rest = _located(_error(path, replace_inputs=[str(DATA)]), path, 3, "inputs[1].path")
    assert rest.startswith("file not found") and "kept beside --input" in rest


def test_replacement_named_like_a_kept_input_gets_its_path_as_name(tmp_path: Path) -> None:
    path = _config(tmp_path, DECONTAMINATE.replace("name: val", f"name: {DATA.name}").replace(
        "[val]", f"[{DATA.name}]") % VALIDATION)
    config = load_config(path, replace_inputs=[str(DATA)])
    assert [s.name for s in config.inputs] == [str(DATA.resolve()), DATA.name]


def test_shipped_pipelines_load_from_the_repo() -> None:
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        for path in sorted((REPO / "pipelines").glob("*.yaml")):
            config = load_config(path.relative_to(REPO))
            assert config.inputs and config.stages, path
    finally:
        os.chdir(cwd)


def test_duplicate_keys_are_an_error_not_silently_dropped(tmp_path: Path) -> None:
    path = _config(tmp_path, f"inputs: [{DATA}]\nstages:\n  - dedup: {{}}\nstages: []\n")
    assert _error(path) == f"{path}:4: stages: duplicate key (first on line 2); YAML would silently keep only the last"
    inline = _config(tmp_path, f"inputs: [{DATA}]\nstages:\n  - dedup: {{action: flag, action: drop}}\n", "in.yaml")
    assert "action: duplicate key" in _located(_error(inline), inline, 3)


def test_pyyaml_own_depth_refusal_reads_as_ours(tmp_path: Path) -> None:
    """PyYAML >= 6.0.4 refuses deep flow nesting in its scanner before our event walk sees it;
    the user reads the same one line, whichever layer refused."""
    import yaml

    from dataguard.config_yaml import _yaml_error

    mark = yaml.Mark("p.yaml", 0, 0, 1000, None, None)
    exc = yaml.scanner.ScannerError("while increasing flow level", mark, "exceeded maximum nesting depth", mark)
    message = str(_yaml_error(exc, "p.yaml", "[" * 2000))
    assert message == f"p.yaml:1: nested deeper than {MAX_DEPTH} levels; a pipeline config needs only a few"
