"""Field aliases at any depth: ``source path -> destination``, applied before template detection.

Syntax of a source path: keys joined by ``.``; ``key[]`` steps into every element of the
list under ``key``. Examples, with where the destination goes:

* ``question -> instruction``: a top-level rename (the flat case, unchanged and as fast).
* ``entities.uid -> user_id``: a nested key *moved*; a destination without ``[]`` is a path
  from the record's top level, so ``user_id`` lands at the top level
  (``entities.uid -> entities.user_id`` renames in place). A parent dict left empty by the
  move is dropped (nothing remains to keep in meta).
* ``conversations[].speaker -> from``, ``messages[].text -> content``: inside every element of
  the list; the destination is relative to the element (``conversations[].from`` is accepted
  as the same thing). Paths may nest further: ``data.turns[].meta.who -> role``.

Rules: a value already at the destination is kept beside it as ``"<key>:shadowed"`` (as for
top-level aliases); a null or missing source value is absent (nothing moves, nothing is
counted); elements that are not objects are left alone. Top-level renames run first, all at
once (as before); nested aliases then run in the order written, each seeing the previous
one's result. A source written with dots that is itself a top-level key (a flattened CSV
header ``entities.uid``) is renamed as that key. Records are never modified in place.

A record counts once per alias it matched (``aliases_applied``); ``Normalizer.absorb``
turns the per-input counts into a one-line error for an alias that matched no record of
its input, without reading anything twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dataguard.io.alias_syntax import NestedAlias, Path, parse_alias
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.stage import StageConfigError


@dataclass(frozen=True, eq=False)
class AliasPlan:
    """Aliases of one input (global + per-input), split into the flat renames and the rest."""

    flat: dict[str, str]
    nested: tuple[NestedAlias, ...]

    def __bool__(self) -> bool:
        return bool(self.flat or self.nested)


@lru_cache(maxsize=256)
def _plan(items: tuple[tuple[str, str], ...]) -> AliasPlan:
    flat: list[tuple[str, str]] = []
    nested: list[NestedAlias] = []
    for src, dst in items:
        parsed = parse_alias(src, dst)
        (nested if isinstance(parsed, NestedAlias) else flat).append(parsed)  # type: ignore[arg-type]
    return AliasPlan(dict(flat), tuple(nested))


def alias_key(src: str, dst: str) -> str:
    """How an alias is counted in ``aliases_applied`` and shown: ``"src->dst"``."""
    return f"{src}->{dst}"


def alias_plan(global_aliases: Mapping[str, str], input_aliases: Mapping[str, str], input_name: str) -> AliasPlan:
    """The plan for one input: global aliases, then the input's own (which win on the same
    source). Raises StageConfigError naming the alias and the input."""
    merged = {**global_aliases, **input_aliases}
    try:
        return _plan(tuple(merged.items()))
    except ValueError as exc:
        raise StageConfigError(f"aliases of input {input_name!r}: {exc}", param="aliases") from None


def apply_aliases(rec: dict[str, Any], plan: AliasPlan, applied: Counter[str]) -> dict[str, Any]:
    """``rec`` with the plan's aliases applied (a new dict when anything moved)."""
    if plan.flat:
        rec = _apply_flat(rec, plan.flat, applied)
    for alias in plan.nested:
        if alias.literal is not None and rec.get(alias.literal) is not None:  # a flattened column "a.b"
            rest = {k: v for k, v in rec.items() if k != alias.literal}
            rec, moved = _put(rest, alias.dst, rec[alias.literal]), True
        else:
            rec, moved = _walk(rec, alias.lists, alias.src, alias.dst)
        if moved:
            applied[alias.key] += 1
    return rec


def _apply_flat(rec: dict[str, Any], aliases: dict[str, str], applied: Counter[str]) -> dict[str, Any]:
    """Rename top-level fields; a renamed field wins over one already there (kept shadowed)."""
    if not any(k in rec for k in aliases):
        return rec
    out = {k: v for k, v in rec.items() if k not in aliases}
    for src, dst in aliases.items():
        if src in rec:
            if dst in out and dst not in aliases:
                out[f"{dst}:shadowed"] = out[dst]
            out[dst] = rec[src]
            applied[f"{src}->{dst}"] += 1
    return out


def _get(node: Any, path: Path) -> Any:
    for k in path:
        if not isinstance(node, dict):
            return None
        node = node.get(k)
    return node


def _walk(node: dict[str, Any], lists: tuple[Path, ...], src: Path, dst: Path) -> tuple[dict[str, Any], bool]:
    """Apply the move in ``node`` (or in every element of the lists below it)."""
    if not lists:
        value = _get(node, src)
        if value is None:
            return node, False
        return _put(_remove(node, src), dst, value), True
    seq = _get(node, lists[0])
    if not isinstance(seq, list):
        return node, False
    items, changed = [], False
    for item in seq:
        if isinstance(item, dict):
            item, moved = _walk(item, lists[1:], src, dst)
            changed |= moved
        items.append(item)
    return (_replace(node, lists[0], items), True) if changed else (node, False)


def _replace(node: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """Copy of ``node`` with the existing value at ``path`` replaced (copy on write)."""
    out = dict(node)
    out[path[0]] = value if len(path) == 1 else _replace(node[path[0]], path[1:], value)
    return out


def _remove(node: dict[str, Any], path: Path) -> dict[str, Any]:
    """Copy of ``node`` without the value at ``path``; parents left empty are dropped."""
    out = dict(node)
    if len(path) == 1:
        del out[path[0]]
        return out
    child = _remove(node[path[0]], path[1:])
    if child:
        out[path[0]] = child
    else:
        del out[path[0]]
    return out


def _put(node: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """Copy of ``node`` with ``value`` at ``path``; what was there is kept as "<key>:shadowed"."""
    out = dict(node)
    key = path[0]
    if len(path) == 1:
        if out.get(key) is not None:
            out[f"{key}:shadowed"] = out[key]
        out[key] = value
        return out
    child = out.get(key)
    if child is not None and not isinstance(child, dict):
        out[f"{key}:shadowed"] = child
        child = None
    out[key] = _put(child or {}, path[1:], value)
    return out


def alias_counts(batch: RawBatch, options: SourceOptions, global_aliases: dict[str, str],
                  applied: Counter[str]) -> dict[str, Any]:
    """Per-input alias counts of one batch (zeros included), for the unmatched-alias check."""
    own = options.aliases
    return {
        "path": options.path,
        "records": sum(1 for r, e in zip(batch.records, batch.errors, strict=True) if e is None and isinstance(r, dict)),
        "input": {k: applied.get(k, 0) for k in (alias_key(a, b) for a, b in own.items())},
        "global": {k: applied.get(k, 0) for k in (alias_key(a, b) for a, b in global_aliases.items() if a not in own)},
    }


def unmatched_alias(per_input: dict[str, dict[str, Any]]) -> str | None:
    """One line about the first alias that matched nothing (inputs with no parsed record are
    not judged: their problem is elsewhere), or None."""
    for source, c in sorted(per_input.items()):
        if c["records"]:
            for key, n in c["input"].items():
                if not n:
                    where = f" ({c['path']})" if c["path"] else ""
                    return (f"alias {_shown(key)!r} of input {source!r}{where} matched none of its "
                            f"{c['records']} records; check the field path (keys joined by '.', 'key[]' "
                            "for every element of a list)")
    read = {s: c for s, c in per_input.items() if c["records"]}
    global_keys = sorted({k for c in read.values() for k in c["global"]})
    for key in global_keys:
        if not any(c["global"].get(key, 0) for c in read.values()):
            files = ", ".join(f"{s} ({c['path']})" if c["path"] else s for s, c in sorted(read.items())
                              if key in c["global"])
            return f"alias {_shown(key)!r} of normalize.aliases matched no record of any input: {files}"
    return None


def _shown(key: str) -> str:
    return key.replace("->", " -> ", 1)
