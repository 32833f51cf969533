"""Constraints on single values: numbers in ranges, fixed options, flags, strings, patterns,
folders.

A number that YAML 1.1 (PyYAML) leaves as text (``2e-5``, ``1e300``: no dot, or an exponent
without a sign) is refused with a note saying so and how to write it, since the user meant a
number: ``got '2e-5' (YAML reads it as text: write 2.0e-5)``.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataguard.params.base import Constraint

_NUMERIC_TEXT = re.compile(r"[-+]?(\d[\d_]*)?(\.\d*)?([eE][-+]?\d+)?")
_EXPONENT_TEXT = re.compile(r"([-+]?\d+)(?:\.(\d*))?[eE]([-+]?)(\d+)")


def numeric_text(value: Any) -> float | None:
    """The number a string such as ``'1e300'`` spells (inf when too large for a float), or
    None when ``value`` is not such a string."""
    if not isinstance(value, str) or not _NUMERIC_TEXT.fullmatch(value.strip()) \
            or not any(ch.isdigit() for ch in value):
        return None
    return float(value.strip().replace("_", ""))


def yaml_number_hint(text: str) -> str:
    """How to write ``text`` so that YAML 1.1 reads a number: ``2e-5`` -> ``2.0e-5``."""
    m = _EXPONENT_TEXT.fullmatch(text.strip())
    if not m:
        return "it without quotes"
    whole, frac, sign, exp = m.groups()
    return f"{whole}.{frac or 0}e{sign or '+'}{exp}"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def yaml_text(value: Any) -> str:
    """A value as YAML spells it: true, false, null, else str()."""
    return {True: "true", False: "false", None: "null"}.get(value, str(value)) \
        if isinstance(value, bool | type(None)) else str(value)


@dataclass(frozen=True)
class Interval(Constraint):
    """A number (``int``: integers only; ``float``: any finite real) within bounds.

    ``closed`` says which bounds are included: "both", "left", "right" or "neither".
    ``ceiling`` (included) is a safety limit far above any real value, so that nothing
    downstream overflows: it is named only to a value above it or a number written as text,
    so ``lr: -1`` reads "must be a positive number", not a range nobody asked about."""

    kind: type
    low: float | None = None
    high: float | None = None
    closed: str = "both"
    ceiling: float | None = None

    def _inside(self, x: float) -> bool:
        lo_in, hi_in = self.closed in ("both", "left"), self.closed in ("both", "right")
        if self.low is not None and (x < self.low or (x == self.low and not lo_in)):
            return False
        if self.high is not None and (x > self.high or (x == self.high and not hi_in)):
            return False
        return self.ceiling is None or x <= self.ceiling

    def ok(self, value: Any) -> bool:
        if self.kind is int:
            return _is_int(value) and self._inside(value)
        return _is_number(value) and math.isfinite(float(value)) and self._inside(float(value))

    @property
    def text(self) -> str:  # type: ignore[override]
        return self._text(self.high, self.closed in ("both", "right"))

    def text_for(self, value: Any) -> str:
        above = _is_number(value) and self.ceiling is not None and float(value) > self.ceiling
        if self.ceiling is not None and (above or numeric_text(value) is not None):
            return self._text(self.ceiling, True)
        return self.text

    def _text(self, high: float | None, hi_in: bool) -> str:
        integer = self.kind is int
        noun = "an integer" if integer else "a number"
        lo_in = self.closed in ("both", "left")
        le = "<=" if hi_in else "<"
        if self.low == (1 if integer and lo_in else 0) and (lo_in if integer else not lo_in):
            positive = f"a positive {'integer' if integer else 'number'}"
            return positive if high is None else f"{positive} {le} {_num(high)}"
        if self.low is None:
            return noun if high is None else f"{noun} {le} {_num(high)}"
        if high is None:
            return f"{noun} {'>=' if lo_in else '>'} {_num(self.low)}"
        return f"{noun} in {'[' if lo_in else '('}{_num(self.low)}, {_num(high)}{']' if hi_in else ')'}"

    def note(self, value: Any) -> str:
        x = numeric_text(value)
        if x is None:
            return ""
        if not (math.isfinite(x) and self._inside(x)):
            return " (a number out of range)"
        if self.kind is int:
            return f" (YAML reads it as text: write {int(x)})" if x.is_integer() else ""
        return f" (YAML reads it as text: write {yaml_number_hint(value)})"

    def clean(self, value: Any) -> Any:
        return value if self.kind is int else float(value)


@dataclass(frozen=True)
class Options(Constraint):
    """One of a fixed set of values (strings, usually; the same type, so 1 is not true)."""

    values: tuple[Any, ...]

    def __init__(self, *values: Any) -> None:
        object.__setattr__(self, "values", tuple(values))

    def ok(self, value: Any) -> bool:
        return isinstance(value, str | int | float | bool | type(None)) and any(
            value == v and type(value) is type(v) for v in self.values)

    @property
    def text(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(yaml_text(v) for v in self.values)


@dataclass(frozen=True)
class Flag(Constraint):
    """``true`` or ``false`` (not 0/1 or "yes")."""

    text = "true or false"

    def ok(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Text(Constraint):
    """A non-empty string (a name, a column, a path); ``blank=False`` refuses spaces only too."""

    blank: bool = True

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and bool(value if self.blank else value.strip())

    @property
    def text(self) -> str:  # type: ignore[override]
        return "a non-empty string" if self.blank else "a non-blank string"


@dataclass(frozen=True)
class Pattern(Constraint):
    """A regular expression that compiles (a YAML key such as ``1`` is taken as its text)."""

    text = "a regular expression"

    def ok(self, value: Any) -> bool:
        return self.note(value) == ""

    def note(self, value: Any) -> str:
        try:
            re.compile(str(value))
        except re.error as exc:
            return f" ({exc})"
        return ""

    def clean(self, value: Any) -> Any:
        return str(value)


@dataclass(frozen=True)
class Folder(Constraint):
    """An existing local folder (``~`` expanded); looked at, not loaded."""

    text: str = "an existing folder"  # type: ignore[assignment]

    def ok(self, value: Any) -> bool:
        return isinstance(value, str | os.PathLike) and bool(str(value)) and Path(value).expanduser().is_dir()


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
