"""Issue 25: one constraint system (`dataguard.params`) for the stages, the ``train:`` config
and the embedder, so the same bad value reads the same wherever it is given, and every config
error names its file, line and key."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from dataguard.config import ConfigError, load_config
from dataguard.embed.settings import EmbedderConfigError, check_settings
from dataguard.params import (
    Interval,
    ListOf,
    MapOf,
    OneKey,
    Options,
    Section,
    Text,
    clean,
    first_problem,
    problem,
)
from dataguard.train.config import CONSTRAINTS, load_train_config

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data" / "alpaca_en_demo.json"


def _write(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def _message(error: Exception) -> str:
    """The part after 'file:line: key: '."""
    return str(error).split(": ", 2)[2]


@pytest.mark.parametrize(("stage", "train_key", "bad"), [
    ("semantic_dedup: {batch_size: 0}", "batch_size", "0"),         # a positive integer, both sides
    ("semantic_dedup: {batch_size: abc}", "grad_accum", "abc"),
])
def test_a_stage_and_the_train_config_say_the_same_thing(tmp_path, stage, train_key, bad):
    pipeline = _write(tmp_path, f"inputs:\n  - {{path: {SAMPLE}}}\nstages:\n  - {stage}\n", "p.yaml")
    with pytest.raises(ConfigError) as from_stage:
        load_config(pipeline)
    train = _write(tmp_path, f"task: sft\nmodel: tiny-causal-lm\ndata: d\n{train_key}: {bad}\n", "t.yaml")
    with pytest.raises(ConfigError) as from_train:
        load_train_config(train)
    assert re.match(rf"{re.escape(str(pipeline))}:4: stages\[0\]\.semantic_dedup\.batch_size: ", str(from_stage.value))
    assert str(from_train.value).startswith(f"{train}:4: {train_key}: ")
    assert _message(from_stage.value) == _message(from_train.value)


def test_the_embedder_says_it_the_same_way_too():
    with pytest.raises(EmbedderConfigError) as err:
        check_settings(batch_size=0)
    assert err.value.param == "batch_size"
    assert str(err.value) == f"batch_size: {problem(CONSTRAINTS['batch_size'], 0).message}"
    assert str(err.value) == "batch_size: must be a positive integer, got 0"


def test_yaml_text_numbers_get_the_same_hint_everywhere():
    allowed = [Interval(float, 0, closed="right", ceiling=10)]
    assert problem(allowed, "2e-5").message == "must be a positive number <= 10, got '2e-5' " \
                                               "(YAML reads it as text: write 2.0e-5)"
    assert problem(allowed, "1e300").message.endswith("got '1e300' (a number out of range)")
    assert problem(allowed, -1).message == "must be a positive number, got -1"  # the ceiling only when it matters
    assert problem([Interval(int, 1, ceiling=100), None], "1e3").message == \
        "must be a positive integer <= 100 or null, got '1e3' (a number out of range)"


def test_containers_point_at_the_bad_item():
    section = Section({"r": [Interval(int, 1)], "kind": [Options("a", "b")]}, required=("kind",))
    assert first_problem({"x": [ListOf(section)]}, {"x": [{"kind": "a"}, {"kind": "a", "r": 0}]}).path == ("x", 1, "r")
    assert str(first_problem({"x": [section]}, {"x": {"kind": "a", "rank": 4}})) == \
        "x.rank: unknown key (expected one of: r, kind)"
    assert str(first_problem({"x": [section]}, {"x": {"r": 4}})) == "x: missing required key: kind"
    rules = MapOf(Options("mlp"), (OneKey(("value", "norm"), Interval(float, 0, closed="right")), None))
    assert str(first_problem({"c": [rules]}, {"c": {"mlp": {"norm": -1}}})) == \
        "c.mlp.norm: must be a positive number, got -1"
    assert str(first_problem({"c": [rules]}, {"c": {"mlp": {"max": 1}}})).startswith(
        "c.mlp: must be {value: X} or {norm: X}")


def test_cleaning_fills_defaults_and_makes_numbers_floats():
    lora = Section({"r": [Interval(int, 1)], "alpha": [Interval(float, 0, closed="right")],
                    "targets": [ListOf(Text(), min_len=1, lone=True)], "quantize": [Options("none", "4bit", False)]},
                   defaults={"r": 8, "alpha": 16}, switch=True, unset={"quantize": ("none", False)})
    assert clean([lora, None], True) == {"r": 8, "alpha": 16}
    assert clean([lora, None], False) is None and clean([lora, None], None) is None
    got = clean([lora], {"alpha": 4, "targets": "q_proj", "quantize": False})
    assert got == {"r": 8, "alpha": 4.0, "targets": ["q_proj"]} and isinstance(got["alpha"], float)


def test_every_train_key_is_declared_with_params_constraints():
    from dataguard.params import Constraint

    assert all(isinstance(c, Constraint) or c is None for allowed in CONSTRAINTS.values() for c in allowed)


def test_a_cleaned_section_reads_in_its_declared_order():
    """Recorded configs (the run folder's config) read the same whatever order they were written in."""
    from dataguard.train.config_checks import FAULT, LR_MULTIPLIERS

    assert list(clean([FAULT], {"kind": "nan_loss", "step": 3})) == ["step", "kind", "layer", "factor"]
    assert list(clean([LR_MULTIPLIERS], {"norm": 0, "mlp": 2})) == ["embeddings", "attention", "mlp", "other",
                                                                    "head", "norm"]
