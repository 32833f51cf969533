"""The constraint protocol and the one checker: whether a value is allowed, and if not, where
inside it the problem is and the one message that says so ("KEY must be ..., got ...").

Stages (`dataguard.stage`), the train config (`dataguard.train.config`) and the embedder
(`dataguard.embed.settings`) all report through `problem`, so the same bad value reads the
same everywhere; the callers only add the file and line (or the parameter name).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Constraint:
    """One allowed kind of value; ``text`` completes "must be ..."."""

    text = "a value"

    def ok(self, value: Any) -> bool:
        raise NotImplementedError

    def text_for(self, value: Any) -> str:
        """What "must be ..." says to this value (a ceiling is named only to a value it concerns)."""
        return self.text

    def note(self, value: Any) -> str:
        """Said after "got VALUE": why a value that looks right is not (YAML read it as text)."""
        return ""

    def inner(self, value: Any) -> Problem | None:
        """For containers: the first problem inside a value of their shape (a mapping's bad
        key), so the message points at it rather than repeating the whole container."""
        return None

    def clean(self, value: Any) -> Any:
        """The value to keep once ``ok``: a float for a number, defaults filled in."""
        return value


Allowed = Sequence[Constraint | None]


@dataclass(frozen=True)
class Problem:
    """What is wrong: ``path`` leads from the checked key to the bad value, ``message`` reads
    "must be ..., got ..." (or "unknown key (...)")."""

    path: tuple[Any, ...]
    message: str

    def under(self, *keys: Any) -> Problem:
        return Problem(tuple(keys) + self.path, self.message)

    def __str__(self) -> str:
        key = path_text(self.path)
        return f"{key}: {self.message}" if key else self.message


def path_text(path: Sequence[Any]) -> str:
    """('stages', 1, 'length') -> 'stages[1].length'."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _alternatives(allowed: Allowed) -> list[Constraint]:
    return [c for c in allowed if c is not None]


def describe(allowed: Allowed, value: Any = None) -> str:
    """'an integer in [8, 50] or null' (what "must be" says to ``value``)."""
    parts = [c.text_for(value) for c in _alternatives(allowed)]
    if any(c is None for c in allowed):
        parts.append("null")
    return " or ".join(parts)


def must_be(allowed: Allowed, value: Any) -> str:
    """The one message shape: 'must be a positive integer, got 0'."""
    note = next((n for c in _alternatives(allowed) if (n := c.note(value))), "")
    return f"must be {describe(allowed, value)}, got {short(value)}{note}"


def problem(allowed: Allowed, value: Any) -> Problem | None:
    """None when some alternative allows ``value`` (``None`` in ``allowed`` allows null); else
    the first problem inside it that a container alternative finds, else 'must be ...'."""
    if value is None and any(c is None for c in allowed):
        return None
    alternatives = _alternatives(allowed)
    if any(c.ok(value) for c in alternatives):
        return None
    for c in alternatives:
        found = c.inner(value)
        if found is not None:
            return found
    return Problem((), must_be(allowed, value))


def clean(allowed: Allowed, value: Any) -> Any:
    """The value to keep, as cleaned by the first alternative that allows it (checked first)."""
    for c in _alternatives(allowed):
        if c.ok(value):
            return c.clean(value)
    return copy.deepcopy(value)


def first_problem(constraints: Mapping[str, Allowed], given: Mapping[str, Any]) -> Problem | None:
    """The first given parameter (in the order given) that its entry does not allow, its path
    starting with the parameter's name; None when all pass. Parameters without an entry
    are not checked."""
    for name, value in given.items():
        allowed = constraints.get(name)
        found = None if allowed is None else problem(allowed, value)
        if found is not None:
            return found.under(name)
    return None
