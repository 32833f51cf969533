"""Parameters declared once, checked generically: one constraint system for the stages, the
``train:`` config and the embedder.

What each parameter may be is a list of alternatives (after scikit-learn's
``_parameter_constraints``; ``None`` allows null)::

    constraints = {"n": [Interval(int, 8, 50)], "mode": [Options("token", "word")],
                   "threshold": [Interval(float, 0, 1), None]}

`first_problem` checks given values against such a mapping, in the order given (so a YAML
file's first bad key is the one reported), and returns a `Problem`: the key path to the bad
value and one message, "must be ..., got ...". Each user adds where it happened:

- a stage (``Stage.constraints``, checked in ``Stage.__new__`` before ``__init__``) raises
  ``StageConfigError(param=...)``, which the config loader points at that key's line;
- the train config (``dataguard.train.config.CONSTRAINTS``) raises a ``ConfigError`` at the
  file, line and key path (``p.yaml:6: train.lora.r: must be a positive integer, got 0``);
- the embedder (``dataguard.embed.settings.CONSTRAINTS``) raises ``EmbedderConfigError``.

The defaults live where the values are used (a stage's ``__init__`` signature, the
``TrainConfig`` fields, ``Embedder.__init__``); ``tests/test_defaults_checked.py`` holds every
default to its own constraint, as scikit-learn does. Checks that relate two parameters stay
with their user (a stage's ``__init__``, ``load_train_config``).

`base` holds the protocol and the checker, `scalars` single values, `nested` containers.
"""

from __future__ import annotations

import os

from dataguard.params.base import (
    Allowed,
    Constraint,
    Problem,
    clean,
    describe,
    first_problem,
    must_be,
    path_text,
    problem,
)
from dataguard.params.nested import ListOf, MapOf, OneKey, Section, unknown_key
from dataguard.params.scalars import (
    Flag,
    Folder,
    Interval,
    Options,
    Pattern,
    Satisfies,
    Text,
    numeric_text,
    yaml_number_hint,
)

__all__ = ["FLAG", "FRACTION", "NAME", "NAMES", "NON_NEGATIVE_INT", "OPTIONAL_NAME", "PATH", "POSITIVE_INT",
           "SEED", "SOURCES", "THREADS", "Allowed", "Constraint", "Flag", "Folder", "Interval", "ListOf", "MapOf",
           "OneKey", "Options", "Pattern", "Problem", "Satisfies", "Section", "Text", "clean", "describe",
           "first_problem", "must_be", "numeric_text", "path_text", "problem", "unknown_key", "yaml_number_hint"]

# Common entries, so stages, the train config and the embedder say the same thing the same way.
FRACTION: Allowed = [Interval(float, 0, 1)]
POSITIVE_INT: Allowed = [Interval(int, 1)]
NON_NEGATIVE_INT: Allowed = [Interval(int, 0)]
SEED: Allowed = [Interval(int, 0)]
FLAG: Allowed = [Flag()]
NAME: Allowed = [Text()]
OPTIONAL_NAME: Allowed = [Text(), None]
NAMES: Allowed = [ListOf(Text())]
SOURCES: Allowed = [ListOf(Text()), Text()]  # input names; one name alone is accepted
THREADS: Allowed = [Interval(int, 1), None]
PATH: Allowed = [Satisfies(lambda v: isinstance(v, str | os.PathLike) and bool(str(v)), "a path"), None]
