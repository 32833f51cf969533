"""The stage contract's declarations: every parameter declared once with its constraints,
every bad value a config error at its own key and line, every reason code declared once.

These walk every registered stage, so a new stage is covered the day it is added.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

from dataguard.config import ConfigError, load_config
from dataguard.params import first_problem
from dataguard.stage import Stage, StageConfigError
from dataguard.stages import STAGE_PATHS, stage_class
from dataguard.stages.normalize import Normalizer

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "sample_data" / "alpaca_en_demo.json"
REFERENCE = REPO / "sample_data" / "banking77" / "test.csv"
# Parameters a stage cannot be built without, and a valid value for each.
REQUIRED: dict[str, dict[str, Any]] = {"drift": {"reference": str(REFERENCE)}}
# Values of every kind a YAML file can hold; each parameter is tried with the first one its
# constraints reject (a mapping, a string, a negative and a huge number, a nested list, a bool).
BAD_VALUES: list[Any] = [{"zz": {"y": 1}}, "zz-not-valid", -7, 10**9, [["x"]], True, 0.5]

STAGES: dict[str, type[Stage]] = {**{name: stage_class(name) for name in STAGE_PATHS}, "normalize": Normalizer}


def _keyword_params(cls: type[Stage]) -> list[str]:
    return [name for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _bad_value(cls: type[Stage], param: str) -> Any:
    for value in BAD_VALUES:
        if first_problem(cls.constraints, {param: value}) is not None:
            return value
    raise AssertionError(f"{cls.name}.{param}: no value of any kind is rejected; its constraint allows anything")


def _cases() -> list[tuple[str, str]]:
    return [(name, param) for name, cls in STAGES.items() for param in _keyword_params(cls)]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_parameter_is_declared_once_with_constraints(name: str) -> None:
    cls = STAGES[name]
    assert set(cls.constraints) == set(_keyword_params(cls)), (
        f"{name}: parameters without constraints: {sorted(set(_keyword_params(cls)) - set(cls.constraints))}; "
        f"constraints for no parameter: {sorted(set(cls.constraints) - set(_keyword_params(cls)))}")


@pytest.mark.parametrize(("name", "param"), _cases())
def test_a_bad_value_is_an_error_at_its_key_and_line(tmp_path: Path, name: str, param: str) -> None:
    """The bad value sits on its own line (after the stage's required parameters): the
    error must name exactly this key and line, whatever kind of value the key takes."""
    cls = STAGES[name]
    bad = _bad_value(cls, param)
    required = [f"      {k}: {json.dumps(v)}" for k, v in REQUIRED.get(name, {}).items() if k != param]
    if name == "normalize":
        head, key, line_no = f"inputs:\n  - {DATA}\nnormalize:\n", f"normalize.{param}", 4
        body = f"  {param}: {json.dumps(bad)}"
    else:
        head = f"inputs:\n  - {DATA}\nstages:\n  - dedup: {{}}\n  - {name}:\n"
        key, line_no = f"stages[1].{name}.{param}", 6 + len(required)
        body = "\n".join([*required, f"      {param}: {json.dumps(bad)}"])
    path = tmp_path / "p.yaml"
    path.write_text(head + body + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    # the key path may go on inside the value, to the bad item (`aliases.zz`, `names[1]`)
    assert re.match(re.escape(f"{path}:{line_no}: {key}") + r"(\.[^.:\[]+|\[\d+\])*: ", message), message
    assert "\n" not in message


def test_the_first_bad_key_in_the_file_is_the_one_reported(tmp_path: Path) -> None:
    """The case issue #13 quoted: `mode` was blamed on `n`'s line."""
    path = tmp_path / "p.yaml"
    path.write_text(f"inputs:\n  - {DATA}\nstages:\n  - overlap: {{n: 13, mode: tokn}}\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:4: stages[0].overlap.mode: must be one of token, word, "
                                                    "got 'tokn'")):
        load_config(path)
    path.write_text(f"inputs:\n  - {DATA}\nstages:\n  - overlap:\n      n: 7\n      mode: tokn\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:5: stages[0].overlap.n: must be an integer in [8, 50]")):
        load_config(path)


def test_python_api_gets_the_same_message_and_the_parameter() -> None:
    with pytest.raises(StageConfigError) as info:
        stage_class("near_dedup")(threshold=1.5)
    assert info.value.param == "threshold"
    assert str(info.value) == "threshold: must be a positive number <= 1, got 1.5"


def test_bool_is_not_a_number_and_ints_are_floats() -> None:
    cls = stage_class("consistency")
    assert first_problem(cls.constraints, {"k": True}) is not None
    assert first_problem(cls.constraints, {"k": 3}) is None
    assert first_problem(cls.constraints, {"k": float("nan")}) is not None


@pytest.mark.parametrize("name", sorted(STAGES))
def test_defaults_pass_their_own_constraints(name: str) -> None:
    cls = STAGES[name]
    defaults = {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
                if n in cls.constraints and p.default is not p.empty}
    assert first_problem(cls.constraints, defaults) is None


def test_reason_codes_are_unique_across_stages() -> None:
    owner: dict[str, str] = {}
    for name, cls in STAGES.items():
        for code in cls.reasons:
            assert code not in owner, f"reason {code!r} declared by both {owner[code]} and {name}"
            owner[code] = name
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", code) for code in owner)


def _readme_reasons() -> dict[str, set[str]]:
    """The README's stage table: stage -> the reason codes its last column lists."""
    table: dict[str, set[str]] = {}
    for line in (REPO / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0] or cells[0].startswith(("stage", "---")):
            continue
        name = re.sub(r"[`*]|\(.*\)", "", cells[0]).strip()
        table[name] = set(re.findall(r"`([a-z][a-z0-9_]*)`", re.sub(r"\([^)]*\)", "", cells[3])))
    return table


def test_readme_reason_table_lists_exactly_the_declared_reasons() -> None:
    readme = _readme_reasons()
    assert set(readme) == set(STAGES), f"README stage table: {sorted(readme)}"
    for name, cls in STAGES.items():
        assert readme[name] == set(cls.reasons), (
            f"{name}: README lists {sorted(readme[name] - set(cls.reasons))} undeclared, "
            f"misses {sorted(set(cls.reasons) - readme[name])}")
    assert all(meaning.strip() for cls in STAGES.values() for meaning in cls.reasons.values())


def test_embedding_stages_use_the_embedders_own_constraints() -> None:
    """One declaration: a stage's embedder knobs are the Embedder's entries, not copies."""
    from dataguard.embed.settings import CONSTRAINTS

    for name in ("consistency", "semantic_dedup", "noise", "drift"):
        shared = {k: v for k, v in stage_class(name).constraints.items() if k in CONSTRAINTS}
        assert shared and all(v is CONSTRAINTS[k] for k, v in shared.items()), name
