"""What every template module shares: the mapped record, the reject, the template's entry
points, and the field readers that turn a wrong JSON type into a reason code."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataguard.io.raw import SourceOptions


class Reject(Exception):
    """Raised by a template's ``map`` or by a record check; carries the reason code and detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass
class Mapped:
    """One record mapped to the canonical shape (turns, label, meta), before the checks."""

    fmt: str
    turns: list[tuple[str, str]]
    label: str | None
    meta: dict[str, Any]
    call_turns: list[int] = field(default_factory=list)
    meta_json: str | None = None  # set once the row passed every check


@dataclass
class TwoTurnRows:
    """What a batch map returns: the rows of a batch (indices into it) that map to exactly
    ``[user, assistant]`` with no label and no meta, column-wise."""

    fmt: str
    index: list[int]
    user: list[str]
    assistant: list[str]

    def __len__(self) -> int:
        return len(self.index)

    def mapped(self, j: int) -> Mapped:
        """Row ``j`` as the per-record path maps it (for checks that have no batch form)."""
        return Mapped(self.fmt, [("user", self.user[j]), ("assistant", self.assistant[j])], None, {})

    def keep(self, positions: Sequence[int]) -> TwoTurnRows:
        """Only the rows at ``positions`` (positions into this object, in order)."""
        return TwoTurnRows(self.fmt, [self.index[j] for j in positions], [self.user[j] for j in positions],
                           [self.assistant[j] for j in positions])


BatchMap = Callable[[Sequence[Any], Sequence[str | None], SourceOptions], TwoTurnRows]


@dataclass(frozen=True)
class Template:
    """One input template. ``detect`` says whether an auto-detected record is of this
    template (it may raise ``Reject`` for a near miss worth naming); ``map`` maps one record
    or raises ``Reject``. ``map_batch``, optional, is the column-wise version for a common
    plain shape: it returns only rows that ``detect`` gives to this template (when the
    format is auto) and that ``map`` maps to the same two turns; the record checks then run
    on them column-wise (``dataguard.formats.checks``)."""

    name: str
    anchor: str | None  # the field a forced format needs
    detect: Callable[[dict[str, Any], SourceOptions], bool]
    map: Callable[[Any, SourceOptions], Mapped]
    map_batch: BatchMap | None = None


def label_str(value: Any, name: str) -> str | None:
    """A label as text; an empty or blank string is no label (not a class of its own)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, int):
        return str(value)
    raise Reject("wrong_type", f"field {name!r} must be a string, integer or boolean, got {type(value).__name__}")


def required_label(value: Any, name: str) -> str:
    label = label_str(value, name)
    if label is None:
        raise Reject("missing_field", f"label field {name!r} is empty")
    return label


def opt_str(rec: dict[str, Any], name: str) -> str | None:
    value = rec.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Reject("wrong_type", f"field {name!r} must be a string, got {type(value).__name__}")
    return value


def req_str(rec: dict[str, Any], name: str, missing: str) -> str:
    value = opt_str(rec, name)
    if value is None:
        raise Reject(missing, f"field {name!r} is missing")
    return value


def join(*parts: str | None) -> str:
    """Prompt parts joined by "\\n", empty parts skipped (LLaMA-Factory's convention)."""
    return "\n".join(p for p in parts if p)


def rest(rec: dict[str, Any], used: set[str]) -> dict[str, Any]:
    """The fields no column holds, for ``meta`` (null-valued fields carry nothing)."""
    return {k: v for k, v in rec.items() if k not in used and v is not None}


def system_turns(rec: dict[str, Any]) -> list[tuple[str, str]]:
    """The optional ``system`` field as a leading system turn."""
    system = opt_str(rec, "system")
    return [("system", system)] if system else []
