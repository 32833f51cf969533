"""Stage parameters declared once, checked generically.

A stage lists what each keyword argument may be in ``Stage.constraints`` (after
scikit-learn's ``_parameter_constraints``)::

    constraints = {"n": [Interval(int, 8, 50)], "mode": [Options("token", "word")],
                   "threshold": [Interval(float, 0, 1), None]}

Each entry is a list of alternatives (``None`` allows null). ``Stage.__new__`` checks every
given argument against its entry *before* ``__init__`` runs, in the order given (so a YAML
file's first bad key is the one reported), and raises ``StageConfigError`` with ``param``
set: the config loader then points at exactly that key's line. Checks that relate two
parameters stay in the stage's ``__init__``, raising ``StageConfigError(..., param=...)``.

The declared defaults live in the ``__init__`` signature (one place); ``Stage.effective_params``
reads them for the manifest.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Constraint:
    """One allowed kind of value; ``text`` completes "must be ..."."""

    text = "a value"

    def ok(self, value: Any) -> bool:
        raise NotImplementedError


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@dataclass(frozen=True)
class Interval(Constraint):
    """A number (``int``: integers only; ``float``: any finite real) within bounds.

    ``closed`` says which bounds are included: "both", "left", "right" or "neither"."""

    kind: type
    low: float | None = None
    high: float | None = None
    closed: str = "both"

    def ok(self, value: Any) -> bool:
        if not (_is_int(value) if self.kind is int else _is_real(value)):
            return False
        lo_in, hi_in = self.closed in ("both", "left"), self.closed in ("both", "right")
        if self.low is not None and (value < self.low or (value == self.low and not lo_in)):
            return False
        return not (self.high is not None and (value > self.high or (value == self.high and not hi_in)))

    @property
    def text(self) -> str:  # type: ignore[override]
        noun = "an integer" if self.kind is int else "a number"
        if self.low is None and self.high is None:
            return noun
        if self.high is None:
            return f"{noun} {'>=' if self.closed in ('both', 'left') else '>'} {_num(self.low)}"
        if self.low is None:
            return f"{noun} {'<=' if self.closed in ('both', 'right') else '<'} {_num(self.high)}"
        left = "[" if self.closed in ("both", "left") else "("
        right = "]" if self.closed in ("both", "right") else ")"
        return f"{noun} in {left}{_num(self.low)}, {_num(self.high)}{right}"


@dataclass(frozen=True)
class Options(Constraint):
    """One of a fixed set of values (strings, usually)."""

    values: tuple[Any, ...]

    def __init__(self, *values: Any) -> None:
        object.__setattr__(self, "values", tuple(values))

    def ok(self, value: Any) -> bool:
        return isinstance(value, str | int | float | bool | type(None)) and any(
            value == v and type(value) is type(v) for v in self.values)

    @property
    def text(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(str(v) for v in self.values)


@dataclass(frozen=True)
class Flag(Constraint):
    """``true`` or ``false`` (not 0/1 or "yes")."""

    text = "true or false"

    def ok(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Text(Constraint):
    """A non-empty string (a name, a column, a path)."""

    text = "a non-empty string"

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and bool(value)


@dataclass(frozen=True)
class ListOf(Constraint):
    """A list (or tuple) whose items each pass ``item``; ``min_len`` items at least;
    ``unique`` forbids repeats. A bare string is never a list here."""

    item: Constraint
    min_len: int = 0
    unique: bool = False
    max_len: int | None = None

    def ok(self, value: Any) -> bool:
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
            return False
        if len(value) < self.min_len or (self.max_len is not None and len(value) > self.max_len):
            return False
        if self.unique and len({repr(v) for v in value}) != len(value):
            return False
        return all(self.item.ok(v) for v in value)

    @property
    def text(self) -> str:  # type: ignore[override]
        size = ("a non-empty list" if self.min_len == 1 else f"a list of at least {self.min_len}"
                if self.min_len else "a list")
        if self.max_len is not None and self.max_len == self.min_len:
            size = f"a list of {self.min_len}"
        return f"{size} of {'distinct ' if self.unique else ''}values each {self.item.text}"


@dataclass(frozen=True)
class MapOf(Constraint):
    """A mapping whose keys pass ``key`` and values pass ``value``."""

    key: Constraint
    value: Constraint
    min_len: int = 0

    def ok(self, value: Any) -> bool:
        return isinstance(value, Mapping) and len(value) >= self.min_len and all(
            self.key.ok(k) and self.value.ok(v) for k, v in value.items())

    @property
    def text(self) -> str:  # type: ignore[override]
        return f"a mapping of {self.key.text} -> {self.value.text}"


@dataclass(frozen=True)
class Satisfies(Constraint):
    """Anything ``test`` accepts: for values whose shape the stage parses itself (a
    reference set spec, an options mapping); ``text`` says what is expected."""

    test: Callable[[Any], bool]
    text: str = "a valid value"  # type: ignore[assignment]

    def ok(self, value: Any) -> bool:
        try:
            return bool(self.test(value))
        except (TypeError, ValueError):
            return False


Allowed = Sequence[Constraint | None]


def describe(allowed: Allowed) -> str:
    """'an integer in [8, 50] or null'."""
    parts = [c.text for c in allowed if c is not None]
    if any(c is None for c in allowed):
        parts.append("null")
    return " or ".join(parts)


def first_problem(constraints: Mapping[str, Allowed], given: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first given parameter (in the order given) whose value no alternative allows,
    as (name, message); None when all pass. Parameters without an entry are not checked."""
    for name, value in given.items():
        allowed = constraints.get(name)
        if allowed is None:
            continue
        if value is None and any(c is None for c in allowed):
            continue
        if any(c is not None and c.ok(value) for c in allowed):
            continue
        return name, f"{name}: must be {describe(allowed)}, got {_short(value)}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# Common entries, so stages say the same thing the same way.
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
# The shared Embedder's knobs (its model folder is checked for existence by the config loader;
# the backend names are `dataguard.embed.settings.BACKENDS`, which a test holds this equal to).
EMBED_BACKENDS = ("torch", "torch-bf16", "onnx", "onnx-int8", "static")
EMBEDDER: dict[str, Allowed] = {
    "model": PATH,
    "batch_size": POSITIVE_INT,
    "threads": THREADS,
    "backend": [Options(*EMBED_BACKENDS)],
    "max_seq_length": [Interval(int, 1, 8192), None],
    "device": [Satisfies(lambda v: isinstance(v, str) and re.fullmatch(r"cpu|cuda(:\d+)?|mps|xpu(:\d+)?", v),
                         "cpu, cuda, cuda:N, mps or xpu")],
}
