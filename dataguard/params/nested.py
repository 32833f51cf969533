"""Constraints on containers: lists, mappings, sections of named keys. Each points a problem
at the item or key inside (``faults[0].kind``, ``lora.r``) instead of repeating the whole
value, and cleans what it holds (numbers as floats, a section's defaults filled in)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataguard.params.base import Allowed, Constraint, Problem, clean, describe, problem, short
from dataguard.params.scalars import Options


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | Mapping)


def unknown_key(known: Sequence[Any]) -> str:
    return f"unknown key (expected one of: {', '.join(str(k) for k in known)})"


@dataclass(frozen=True)
class ListOf(Constraint):
    """A list (or tuple) whose items each pass ``item``; ``min_len`` items at least;
    ``unique`` forbids repeats; ``increasing`` asks for strictly increasing items. A bare
    string is never a list here, but ``lone`` accepts one item alone (kept as a list)."""

    item: Constraint
    min_len: int = 0
    unique: bool = False
    max_len: int | None = None
    increasing: bool = False
    lone: bool = False

    def _shape_ok(self, value: Any) -> bool:
        if len(value) < self.min_len or (self.max_len is not None and len(value) > self.max_len):
            return False
        if self.unique and len({repr(v) for v in value}) != len(value):
            return False
        return not (self.increasing and any(a >= b for a, b in zip(value, value[1:], strict=False)))

    def ok(self, value: Any) -> bool:
        if not _is_list(value):
            return self.lone and self.item.ok(value)
        return all(self.item.ok(v) for v in value) and self._shape_ok(value)

    def inner(self, value: Any) -> Problem | None:
        if not _is_list(value):
            return None
        return next((p.under(i) for i, v in enumerate(value) if (p := problem([self.item], v))), None)

    @property
    def text(self) -> str:  # type: ignore[override]
        size = ("a non-empty list" if self.min_len == 1 else f"a list of at least {self.min_len}"
                if self.min_len else "a list")
        if self.max_len is not None and self.max_len == self.min_len:
            size = f"a list of {self.min_len}"
        order = "distinct " if self.unique else "increasing " if self.increasing else ""
        alone = ", or one such value alone" if self.lone else ""
        return f"{size} of {order}values each {self.item.text}{alone}"

    def clean(self, value: Any) -> Any:
        return [self.item.clean(v) for v in value] if _is_list(value) else [self.item.clean(value)]


@dataclass(frozen=True)
class MapOf(Constraint):
    """A mapping whose keys pass ``key`` and values pass ``value`` (one constraint, or a
    tuple of alternatives where ``None`` allows null: a null value means "not set" and is
    left out when cleaned)."""

    key: Constraint
    value: Constraint | tuple[Constraint | None, ...]
    min_len: int = 0

    @property
    def _values(self) -> Allowed:
        return self.value if isinstance(self.value, tuple) else (self.value,)

    def ok(self, value: Any) -> bool:
        return isinstance(value, Mapping) and len(value) >= self.min_len and all(
            self.key.ok(k) and problem(self._values, v) is None for k, v in value.items())

    def inner(self, value: Any) -> Problem | None:
        if not isinstance(value, Mapping):
            return None
        for k, v in value.items():
            if not self.key.ok(k):
                return Problem((k,), unknown_key(self.key.values) if isinstance(self.key, Options)
                               else f"key must be {self.key.text}, got {short(k)}{self.key.note(k)}")
            found = problem(self._values, v)
            if found is not None:
                return found.under(k)
        return None

    @property
    def text(self) -> str:  # type: ignore[override]
        return f"a mapping of {self.key.text} -> {describe(self._values)}"

    def clean(self, value: Any) -> Any:
        return {self.key.clean(k): clean(self._values, v) for k, v in value.items() if v is not None}


@dataclass(frozen=True)
class Section(Constraint):
    """A mapping of named keys, each with its own allowed values (a settings block such as
    ``lora:``). Cleaning gives the given keys and the defaults of the others, in the order of
    ``fields`` (so a recorded config reads the same whatever order it was written in);
    values listed in ``unset`` for their key mean "not set" and are left out (so a record
    written before the key existed still matches). With ``switch``, ``true``
    means all the defaults and ``false`` means off (cleaned to None)."""

    fields: Mapping[str, Allowed]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    unset: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    switch: bool = False

    def ok(self, value: Any) -> bool:
        return (self.switch and isinstance(value, bool)) or (isinstance(value, Mapping) and self.inner(value) is None)

    def inner(self, value: Any) -> Problem | None:
        if not isinstance(value, Mapping):
            return None
        unknown = next((k for k in value if k not in self.fields), None)
        if unknown is not None:
            return Problem((unknown,), unknown_key(list(self.fields)))
        missing = [k for k in self.required if k not in value]
        if missing:
            return Problem((), f"missing required key{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
        return next((p.under(k) for k, v in value.items() if (p := problem(self.fields[k], v))), None)

    @property
    def text(self) -> str:  # type: ignore[override]
        keys = f"a mapping with keys {', '.join(self.fields)}"
        return f"true, false or {keys}" if self.switch else keys

    def clean(self, value: Any) -> Any:
        if isinstance(value, bool):
            return copy.deepcopy(dict(self.defaults)) if value else None
        given = {k: clean(self.fields[k], v) for k, v in value.items()
                 if not any(v == u and type(v) is type(u) for u in self.unset.get(k, ()))}
        return {k: given[k] if k in given else copy.deepcopy(self.defaults[k])
                for k in self.fields if k in given or k in self.defaults}


@dataclass(frozen=True)
class OneKey(Constraint):
    """A mapping of exactly one of ``keys`` to a value passing ``value``: ``{norm: 1.0}``."""

    keys: tuple[str, ...]
    value: Constraint

    def _key(self, value: Any) -> str | None:
        if isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in self.keys:
            return next(iter(value))
        return None

    def ok(self, value: Any) -> bool:
        key = self._key(value)
        return key is not None and self.value.ok(value[key])

    def inner(self, value: Any) -> Problem | None:
        key = self._key(value)
        found = None if key is None else problem([self.value], value[key])
        return None if found is None else found.under(key)

    @property
    def text(self) -> str:  # type: ignore[override]
        return " or ".join(f"{{{k}: X}}" for k in self.keys) + f" with X {self.value.text}"

    def clean(self, value: Any) -> Any:
        key = next(iter(value))
        return {key: self.value.clean(value[key])}
