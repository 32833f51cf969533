"""Reading a config file safely, and pointing at its lines.

A config error is a user's typo, not a crash: `Located` maps a key path such as
``("stages", 1, "length", "percentil")`` to its line, so every problem becomes one
`ConfigError` reading ``pipelines/sft.yaml:14: stages[1].length.percentil: ...``.

Hostile files are bounded before anything walks them: the file size, the nesting depth and
the number of values after YAML aliases are expanded (a 400-byte "billion laughs" file
would otherwise expand to billions of values in any walk over the data, and in the
manifest, which stores the config as JSON).
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from dataguard.params import Allowed, clean, path_text, problem

# Bounds on a config file. Real pipeline configs are a few KB, a handful of levels deep and
# a few hundred values; these leave orders of magnitude of room and stop hostile files early.
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 100_000

_BASE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~20x faster
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"


class _Loader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """The safe loader, reading unquoted dates as text (a config has no use for dates, and
    `2024-13-45` would otherwise fail without a line) and remembering the node it builds,
    so a value that cannot be built (a 5000-digit integer) is reported at its line."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
        for first, resolvers in _BASE_LOADER.yaml_implicit_resolvers.items()
    }
    last_node: yaml.Node | None = None

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        self.last_node = node
        return super().construct_object(node, deep)


class ConfigError(ValueError):
    """One clear message naming the file, the line and the key."""


class Located:
    """Maps a key path like ('stages', 1, 'length') to its line in the YAML file."""

    def __init__(self, filename: str, node: yaml.Node | None) -> None:
        self.filename = filename
        self.lines: dict[tuple[Any, ...], int] = {}
        if node is not None:
            self._walk(node)

    def _walk(self, root: yaml.Node) -> None:
        """Record the line of every key path, depth first in document order. A node reached
        again through an alias is not entered again (paths inside it fall back to the
        alias's key, or to where the anchored value is written), so the walk is linear in
        the file, never in the aliases' expansion."""
        seen: set[int] = set()
        pending: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())]
        while pending:
            node, path = pending.pop()
            self.lines.setdefault(path, node.start_mark.line + 1)
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in reversed(node.value):
                    key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                    if path + (key,) not in self.lines:  # the last of merged (<<) and own keys wins
                        self.lines[path + (key,)] = key_node.start_mark.line + 1
                        pending.append((value_node, path + (key,)))
            elif isinstance(node, yaml.SequenceNode):
                pending.extend((item, path + (i,)) for i, item in reversed(list(enumerate(node.value))))

    def line(self, path: tuple[Any, ...]) -> int | None:
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        return self.lines.get(probe)

    def error(self, path: tuple[Any, ...], message: str) -> ConfigError:
        line = self.line(path)
        where = f"{self.filename}:{line}" if line else self.filename
        key = path_text(path)
        return ConfigError(f"{where}: {key}: {message}" if key else f"{where}: {message}")

    def checked(self, path: tuple[Any, ...], allowed: Allowed, value: Any) -> Any:
        """``value`` cleaned (`dataguard.params.clean`), or the ConfigError at the line of the
        bad value's key path (inside ``value`` when a container points there)."""
        found = problem(allowed, value)
        if found is not None:
            raise self.error(path + found.path, found.message)
        return clean(allowed, value)


_Located = Located  # the name the test suite and the training config used


def load_yaml_document(path: Path) -> tuple[Any, Located]:
    """Read, bound and parse one YAML config file into plain data plus its line locator.

    Shared by the pipeline and the train config so both refuse the same bad files (invalid
    UTF-8, deep nesting, alias bombs, non-JSON values) with the same one-line errors.
    """
    node, data = _parse(_read_text(path), str(path))
    if data is None:
        raise ConfigError(f"{path}: the config is empty")
    loc = _Located(str(path), node)
    _check_plain(data, (), loc)
    return data, loc


# ------------------------------------------------------------------ reading and parsing
def _read_text(path: Path) -> str:
    """The config's text, or a ConfigError that says why it cannot be read."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{path}: is a folder; give the pipeline YAML file inside it")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 1024} KiB; this is not a pipeline config")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                          "save the config as UTF-8") from None


def _parse(text: str, filename: str) -> tuple[yaml.Node | None, Any]:
    """Compose and construct one YAML document, after `_check_bounds` proved it small."""
    try:
        _check_bounds(text, filename)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, filename, text) from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_duplicate_keys(node, filename)
        data = loader.construct_document(node) if node is not None else None
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, filename, text) from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. !!int with 5000 digits
        line = f":{loader.last_node.start_mark.line + 1}" if loader.last_node is not None else ""
        raise ConfigError(f"{filename}{line}: invalid YAML value: {_one_line(str(exc))}") from None
    finally:
        loader.dispose()
    return node, data


def _check_duplicate_keys(root: yaml.Node, filename: str) -> None:
    """A key written twice in one mapping is a mistake YAML forgives silently (the last
    wins): a second `stages:` would drop the first list without a word."""
    seen: set[int] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE:
                    key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
                    if key in first:
                        raise ConfigError(f"{filename}:{line}: {key_node.value}: duplicate key (first on line "
                                          f"{first[key]}); YAML would silently keep only the last")
                    first[key] = line
                pending.append(value_node)
        elif isinstance(node, yaml.SequenceNode):
            pending.extend(node.value)


def _yaml_error(exc: yaml.YAMLError, filename: str, text: str) -> ConfigError:
    """A YAML error as one line: file, line, what is wrong and where it started."""
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    if line is None and isinstance(getattr(exc, "position", None), int):  # a ReaderError
        line = text.count("\n", 0, exc.position) + 1
    problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc)
    if "nesting depth" in str(problem):  # PyYAML >= 6.0.4 refuses deep flow nesting in its scanner
        return ConfigError(f"{filename}{f':{line}' if line else ''}: {_too_deep()}")
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if context:
        where = f" at line {context_mark.line + 1}" if context_mark is not None else ""
        problem = f"{problem} ({context}{where})"
    return ConfigError(f"{filename}{f':{line}' if line else ''}: invalid YAML: {_one_line(problem)}")


def _too_deep() -> str:
    """One wording for a too-deep document, whichever layer (ours or PyYAML's) refused it."""
    return f"nested deeper than {MAX_DEPTH} levels; a pipeline config needs only a few"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _check_bounds(text: str, filename: str) -> None:
    """Walk the event stream once (no recursion, no expansion) and refuse documents nested
    deeper than MAX_DEPTH or holding more than MAX_VALUES values once aliases are
    expanded. Each anchor's expanded size is remembered, so an alias costs O(1)."""
    sizes: dict[str, int] = {}  # anchor -> expanded size of its node
    open_anchors: set[str] = set()
    stack: list[list[Any]] = []  # open collections: [anchor, expanded size so far]
    total = 0
    for event in yaml.parse(text, Loader=_Loader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise ConfigError(f"{filename}:{line}: {_too_deep()}")
            stack.append([event.anchor, 1])
            if event.anchor:
                open_anchors.add(event.anchor)
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, size = stack.pop()
            if anchor:
                open_anchors.discard(anchor)
                sizes[anchor] = size
        elif isinstance(event, yaml.ScalarEvent):
            size = 1
            if event.anchor:
                sizes[event.anchor] = size
        elif isinstance(event, yaml.AliasEvent):
            size = _alias_size(event.anchor, sizes, open_anchors, filename, line)
        else:
            continue
        if stack:
            stack[-1][1] += size
            grown = stack[-1][1]
        else:
            total += size
            grown = total
        if grown > MAX_VALUES:
            raise ConfigError(f"{filename}:{line}: the config holds more than {MAX_VALUES:,} values once its "
                              "YAML aliases (*name) are expanded; write the repeated parts out or simplify it")


def _alias_size(anchor: str, sizes: dict[str, int], open_anchors: set[str], filename: str, line: int) -> int:
    if anchor in open_anchors:
        raise ConfigError(f"{filename}:{line}: the alias *{anchor} refers to a value that contains it "
                          "(a cycle)")
    if anchor not in sizes:
        raise ConfigError(f"{filename}:{line}: invalid YAML: the alias *{anchor} has no anchor &{anchor} "
                          "before it")
    return sizes[anchor]


_PLAIN_SCALARS = (str, int, float, bool, type(None))


def _check_plain(value: Any, path: tuple[Any, ...], loc: _Located) -> None:
    """Only JSON-like values: the config is stored in the manifest as JSON, and YAML's
    dates, sets and binary values would fail there, after the whole run."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, _PLAIN_SCALARS):
                raise loc.error(path, f"unsupported key of type {type(key).__name__}; quote it")
            _check_plain(item, path + (key,), loc)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_plain(item, path + (i,), loc)
    elif not isinstance(value, _PLAIN_SCALARS):
        raise loc.error(path, f"unsupported value of type {type(value).__name__}; write it as a quoted string "
                              "or a number")
