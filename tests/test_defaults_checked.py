"""Every default satisfies its own constraint, as scikit-learn checks: a default no user could
type would otherwise pass unchecked (the constraints of the stages, the train config and the
embedder only see values that were given)."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest

from dataguard.config_yaml import _Located
from dataguard.params import first_problem
from dataguard.stages import STAGE_PATHS, stage_class
from dataguard.train.config import CONSTRAINTS, TrainConfig, checked_setting


@pytest.mark.parametrize("name", sorted(STAGE_PATHS))
def test_every_stage_default_passes_its_constraint(name: str) -> None:
    cls = stage_class(name)
    defaults = {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()
                if p.name != "self" and p.default is not p.empty}
    unconstrained = sorted(set(defaults) - set(cls.constraints))
    assert unconstrained == [], f"{name}: parameters without a constraint: {unconstrained}"
    assert first_problem(cls.constraints, defaults) is None


def test_every_train_config_default_passes_its_check() -> None:
    where = _Located("<defaults>", None)
    defaults = TrainConfig(task="sft", model="tiny-causal-lm", data="d", output="o")
    for f in fields(TrainConfig):
        value = getattr(defaults, f.name)
        assert first_problem(CONSTRAINTS, {f.name: value}) is None, f.name
        assert checked_setting(f.name, value, (f.name,), where) == value, f.name  # checked and unchanged


def test_every_embedder_default_passes_its_constraint() -> None:
    from dataguard.embed import Embedder
    from dataguard.embed.settings import CONSTRAINTS

    defaults = {p.name: p.default for p in inspect.signature(Embedder.__init__).parameters.values()
                if p.name != "self" and p.default is not p.empty}
    assert sorted(defaults) == sorted(CONSTRAINTS)  # every knob constrained, every constraint a knob
    assert first_problem(CONSTRAINTS, defaults) is None


def test_a_default_that_fails_its_constraint_is_caught() -> None:
    """The checks above can fail: a constraint a default does not meet is reported."""
    from dataguard.params import Interval

    assert first_problem({"n": [Interval(int, 1)]}, {"n": 0}) is not None
