"""Typed JSON schema nodes: check a parsed JSON value and name the key path of a problem.

Why its own module: `dataguard.train.data.manifest_schema` declares what the runner reads of a
pipeline's manifest with these nodes (ints, numbers, choices, shapes, lists, maps); the nodes
know nothing of manifests, so they stay small and reusable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from dataguard.config_yaml import Located
from dataguard.train.errors import TrainDataError

KeyPath = tuple[Any, ...]
MAX_LOCATE_BYTES = 32 << 20  # a document larger than this is reported without line numbers


class ManifestError(TrainDataError):
    """A manifest value the runner cannot use: ``FILE[:LINE]: key.path: message``."""


# ------------------------------------------------------------------ where: file, line, key path
class _Where:
    """Builds errors for one manifest file; finds the line of a key path only when an error
    is raised (JSON is YAML's flow style, so the YAML locator reads it)."""

    def __init__(self, path: Path | str, text: str | None) -> None:
        self.path = str(path)
        self.text = text

    def error(self, keys: KeyPath, message: str) -> ManifestError:
        node = None
        if self.text is not None and len(self.text) <= MAX_LOCATE_BYTES:
            import yaml

            try:
                node = yaml.compose(self.text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            except (yaml.YAMLError, RecursionError):
                node = None  # text YAML cannot read (a hand-written JSON quirk): no line then
        return ManifestError(str(Located(self.path, node).error(keys, message)))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------ the typed nodes
class Node:
    """One kind of value; ``check`` raises through ``where`` naming ``keys``."""

    text = "a value"

    def check(self, value: Any, keys: KeyPath, where: _Where) -> None:
        if not self.ok(value):
            raise where.error(keys, f"must be {self.text}, got {_short(value)}")

    def ok(self, value: Any) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Node):
    """An integer (not a bool) >= ``lo``."""

    lo: int = 0

    @property
    def text(self) -> str:  # type: ignore[override]
        return "a positive integer" if self.lo == 1 else f"an integer >= {self.lo}"

    def ok(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= self.lo


@dataclass(frozen=True)
class Num(Node):
    """A finite number in [lo, hi] (NaN and inf are what a hand edit or ``float('nan')``
    leave behind; the pipeline writes null for "no value")."""

    lo: float = -math.inf
    hi: float = math.inf

    @property
    def text(self) -> str:  # type: ignore[override]
        if self.lo == -math.inf and self.hi == math.inf:
            return "a finite number"
        if self.hi == math.inf:
            return f"a finite number >= {self.lo:g}"
        return f"a number in [{self.lo:g}, {self.hi:g}]"

    def ok(self, value: Any) -> bool:
        return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
                and self.lo <= value <= self.hi)


@dataclass(frozen=True)
class Text(Node):
    """A non-empty string; ``what`` names it in messages (``a class name``)."""

    what: str = "a non-empty string"

    @property
    def text(self) -> str:  # type: ignore[override]
        return self.what

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and bool(value)


@dataclass(frozen=True)
class Flag(Node):
    text = "true or false"

    def ok(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Choice(Node):
    options: tuple[str, ...]

    @property
    def text(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(self.options)

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.options


@dataclass(frozen=True)
class Sha256(Node):
    text = "a sha256 hex digest (64 hex digits)"

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value) is not None


@dataclass(frozen=True)
class ShardPath(Node):
    """A relative path inside the run folder (a foreign manifest must not point the runner
    at files elsewhere)."""

    text = "a relative path inside the run folder"

    def ok(self, value: Any) -> bool:
        if not isinstance(value, str) or not value or "\\" in value:
            return False
        p = PurePosixPath(value)
        return not p.is_absolute() and ".." not in p.parts and not re.match(r"[A-Za-z]:", value)


class _Shaped(Node):
    """A container: its own shape is checked first, then each item at its own key path."""

    def ok(self, value: Any) -> bool:
        """The container's own shape (its items are checked by ``check``)."""
        raise NotImplementedError

    def check(self, value: Any, keys: KeyPath, where: _Where) -> None:
        super().check(value, keys, where)
        for key, item, node in self.items(value):
            node.check(item, keys + (key,), where)

    def items(self, value: Any) -> Iterable[tuple[Any, Any, Node]]:
        raise NotImplementedError


@dataclass(frozen=True)
class Optional(Node):
    """``inner``, or null."""

    inner: Node

    @property
    def text(self) -> str:  # type: ignore[override]
        return f"{self.inner.text} or null"

    def ok(self, value: Any) -> bool:
        return value is None or self.inner.ok(value)

    def check(self, value: Any, keys: KeyPath, where: _Where) -> None:
        super().check(value, keys, where)
        if value is not None:
            self.inner.check(value, keys, where)


@dataclass(frozen=True)
class ListOf(_Shaped):
    item: Node
    min_len: int = 0

    @property
    def text(self) -> str:  # type: ignore[override]
        return "a non-empty list" if self.min_len else "a list"

    def ok(self, value: Any) -> bool:
        return isinstance(value, list) and len(value) >= self.min_len

    def items(self, value: Any) -> Iterable[tuple[Any, Any, Node]]:
        return ((i, item, self.item) for i, item in enumerate(value))


@dataclass(frozen=True)
class Fields(_Shaped):
    """A mapping with these keys (each may be absent unless ``required``); other keys are
    not the runner's business and pass."""

    fields: Mapping[str, Node]
    required: tuple[str, ...] = ()
    text = "a mapping"

    def ok(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, keys: KeyPath, where: _Where) -> None:
        Node.check(self, value, keys, where)
        for name in self.required:
            if name not in value:
                raise where.error(keys, f"missing required key: {name}")
        super().check(value, keys, where)

    def items(self, value: Any) -> Iterable[tuple[Any, Any, Node]]:
        return ((name, value[name], node) for name, node in self.fields.items() if name in value)


@dataclass(frozen=True)
class MapOf(_Shaped):
    """A mapping whose every value passes ``value``."""

    value: Node
    text = "a mapping"

    def ok(self, value: Any) -> bool:
        return isinstance(value, dict)

    def items(self, value: Any) -> Iterable[tuple[Any, Any, Node]]:
        return ((name, item, self.value) for name, item in value.items())


@dataclass(frozen=True)
class Names(Node):
    """A name, or a list of names (an overlap stage's ``validation_sources``)."""

    text = "an input name or a list of input names"

    def ok(self, value: Any) -> bool:
        return (isinstance(value, str) and bool(value)) or (
            isinstance(value, list) and all(isinstance(v, str) and v for v in value))


@dataclass(frozen=True)
class Fractions(Node):
    """Increasing fractions in (0, 1] (the curriculum's boundaries, like the config's)."""

    text = "increasing fractions in (0, 1]"

    def ok(self, value: Any) -> bool:
        return (isinstance(value, list) and all(Num(0, 1).ok(b) and b > 0 for b in value)
                and all(a < b for a, b in zip(value, value[1:], strict=False)))
