"""The syntax of a field alias (``source path -> destination``), parsed on its own.

Why its own module: the config loader checks aliases when it reads a YAML file, and the
normaliser applies them to records; the config must not import a stage to do the first
(`dataguard.stages.normalize_aliases` has the semantics and the examples).
"""

from __future__ import annotations

from dataclasses import dataclass

Path = tuple[str, ...]


@dataclass(frozen=True)
class NestedAlias:
    """One parsed alias with a ``.`` or ``[]`` in its source: move ``src`` to ``dst`` inside
    the dict reached through ``lists`` (dict paths to lists, walked element by element)."""

    key: str  # "src->dst" as written, for counts and messages
    literal: str | None  # a dotted source without [] as written, also tried as a top-level key
    lists: tuple[Path, ...]
    src: Path
    dst: Path


def _keys(path: str, what: str, alias: str) -> list[tuple[str, bool]]:
    """``a[].b`` -> [("a", True), ("b", False)]; raises ValueError saying what is wrong."""
    if not path or path != path.strip():
        raise ValueError(f"alias {alias!r}: the {what} must be a non-empty path without surrounding spaces")
    out = []
    for part in path.split("."):
        is_list = part.endswith("[]")
        key = part[:-2] if is_list else part
        if not key or "[" in key or "]" in key:
            raise ValueError(f"alias {alias!r}: bad {what} path {path!r} (keys joined by '.', "
                             "'key[]' for every element of a list)")
        out.append((key, is_list))
    return out


def parse_alias(src: str, dst: str) -> tuple[str, str] | NestedAlias:
    """A flat ``(src, dst)`` rename or a ``NestedAlias``; ValueError names the alias."""
    alias = f"{src} -> {dst}"
    if not isinstance(src, str) or not isinstance(dst, str):
        raise ValueError(f"alias {src!r}: source and destination must be strings")
    if "." not in src and "[" not in src and "." not in dst and "[" not in dst:
        if not src or not dst:
            raise ValueError(f"alias {alias!r}: source and destination must be non-empty")
        return src, dst
    s, d = _keys(src, "source", alias), _keys(dst, "destination", alias)
    if s[-1][1] or d[-1][1]:
        raise ValueError(f"alias {alias!r}: a path must end with a key, not a list[]")
    cut = max((i + 1 for i, (_, is_list) in enumerate(s) if is_list), default=0)
    lists: list[Path] = []
    start = 0
    for i, (_, is_list) in enumerate(s[:cut]):
        if is_list:
            lists.append(tuple(k for k, _ in s[start:i + 1]))
            start = i + 1
    if any(is_list for _, is_list in d):
        if not cut or d[:cut] != s[:cut] or any(is_list for _, is_list in d[cut:]):
            raise ValueError(f"alias {alias!r}: a destination with [] must repeat the source's list path "
                             "and go no deeper into lists; or write it relative to the list element")
        d = d[cut:]
    rel_src, rel_dst = tuple(k for k, _ in s[cut:]), tuple(k for k, _ in d)
    if rel_src == rel_dst:
        raise ValueError(f"alias {alias!r}: source and destination are the same field")
    literal = src if not lists and len(rel_src) > 1 else None
    return NestedAlias(f"{src}->{dst}", literal, tuple(lists), rel_src, rel_dst)


