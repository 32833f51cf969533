"""YAML (or dict) config -> validated Pipeline, with errors that name key, file and line.

A config error is a user's typo, not a crash: every problem becomes one `ConfigError`
whose message reads like ``pipelines/sft.yaml:14: stages[1].length.percentil: unknown
parameter (expected one of: action, factor, ...)``.

Relative paths are taken from the working directory (like datatrove and data-juicer);
an input path that only exists next to the config file is found there too.

Hostile files are bounded before anything walks them: the file size, the nesting depth and
the number of values after YAML aliases are expanded (a 400-byte "billion laughs" file
would otherwise expand to billions of values in any walk over the data, and in the
manifest, which stores the config as JSON).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dataguard.io.readers import READERS, InputError, InputSpec
from dataguard.stage import Stage, StageConfigError
from dataguard.stages import STAGE_PATHS, stage_class
from dataguard.stages.normalize_aliases import parse_alias

TOP_LEVEL: dict[str, str] = {
    "inputs": "list of inputs (required)",
    "output": "output folder",
    "stages": "list of stages, each {name: {params}}",
    "normalize": "normalizer parameters",
    "workers": "worker processes (default: all cores)",
    "batch_rows": "rows per work unit",
    "shard_rows": "max rows per output shard",
    "shard_bytes": "max bytes per output shard",
    "report": "path of the HTML audit report, or false",
    "executor": "local (process pool, default) or ray",
    "ray_address": "address of a running Ray cluster (default: start one locally)",
    "train": "training runner settings, read by `dataguard train` (not by `dataguard run`)",
}
INPUT_KEYS = ("path", "name", "format", "reader", "aliases", "text_field", "label_field", "json_key")
FORMATS = ("auto", "alpaca", "sharegpt", "messages", "dolly", "prompt_completion", "labelled_text")

# Bounds on a config file. Real pipeline configs are a few KB, a handful of levels deep and
# a few hundred values; these leave orders of magnitude of room and stop hostile files early.
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 100_000

# Stage parameters that name inputs of the run (by `name:`), per stage. Such inputs must
# exist in `inputs:`, and `--input` keeps them (see `load_config(replace_inputs=...)`).
INPUT_NAME_PARAMS: dict[str, tuple[str, ...]] = {"overlap": ("validation_sources",),
                                                  "near_dedup": ("validation_sources",),
                                                  "semantic_dedup": ("validation_sources",)}

# Markers of a folder that `datasets.load_from_disk` can read (a saved Dataset).
DATASET_FOLDER_FILES = ("dataset_info.json", "state.json")

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


@dataclass
class LoadedConfig:
    """A validated config: what `dataguard run` needs to build and run a Pipeline."""

    path: Path | None
    inputs: list[InputSpec]
    stages: list[Stage]
    normalizer: Stage
    output: Path | None
    report: Path | None | bool
    workers: int | None
    batch_rows: int
    shard_rows: int
    shard_bytes: int | None
    executor: str = "local"
    ray_address: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    kept_inputs: list[str] = field(default_factory=list)  # config inputs kept beside --input

    def pipeline(self, progress: bool = False, workers: int | None = None):
        from dataguard.pipeline import Pipeline

        return Pipeline(self.stages, normalizer=self.normalizer,
                        workers=workers if workers is not None else self.workers,
                        batch_rows=self.batch_rows, shard_rows=self.shard_rows, shard_bytes=self.shard_bytes,
                        progress=progress, config=self.raw, executor=self.executor,
                        ray_address=self.ray_address)


class _Located:
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
        todo: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())]
        while todo:
            node, path = todo.pop()
            self.lines.setdefault(path, node.start_mark.line + 1)
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in reversed(node.value):
                    key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                    if path + (key,) not in self.lines:  # the last of merged (<<) and own keys wins
                        self.lines[path + (key,)] = key_node.start_mark.line + 1
                        todo.append((value_node, path + (key,)))
            elif isinstance(node, yaml.SequenceNode):
                todo.extend((item, path + (i,)) for i, item in reversed(list(enumerate(node.value))))

    def line(self, path: tuple[Any, ...]) -> int | None:
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        return self.lines.get(probe)

    def error(self, path: tuple[Any, ...], message: str) -> ConfigError:
        line = self.line(path)
        where = f"{self.filename}:{line}" if line else self.filename
        key = _path_text(path)
        return ConfigError(f"{where}: {key}: {message}" if key else f"{where}: {message}")


Located = _Located  # the public name: other config loaders (train) use it for their errors


def _path_text(path: tuple[Any, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def load_config(source: str | Path | dict[str, Any], *,
                replace_inputs: Sequence[str | Path] | None = None) -> LoadedConfig:
    """Parse and validate a YAML file (or an already-parsed dict).

    ``replace_inputs`` (what `--input` passes) replaces the config's inputs: theirs are
    then checked for shape only, not for existence, so a config runs from any folder -
    except inputs that a stage names (an overlap stage's ``validation_sources``): those are
    kept beside the replacements and must exist, so a held-out split is never dropped.
    """
    if isinstance(source, dict):
        return _validate(source, _Located("<config>", None), Path.cwd(), None, replace_inputs)
    path = Path(source)
    data, loc = load_yaml_document(path)
    return _validate(data, loc, path.parent, path, replace_inputs)


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
    todo = [root]
    while todo:
        node = todo.pop()
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
                todo.append(value_node)
        elif isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)


def _yaml_error(exc: yaml.YAMLError, filename: str, text: str) -> ConfigError:
    """A YAML error as one line: file, line, what is wrong and where it started."""
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    if line is None and isinstance(getattr(exc, "position", None), int):  # a ReaderError
        line = text.count("\n", 0, exc.position) + 1
    problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc)
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if context:
        where = f" at line {context_mark.line + 1}" if context_mark is not None else ""
        problem = f"{problem} ({context}{where})"
    return ConfigError(f"{filename}{f':{line}' if line else ''}: invalid YAML: {_one_line(problem)}")


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
                raise ConfigError(f"{filename}:{line}: nested deeper than {MAX_DEPTH} levels; "
                                  "a pipeline config needs only a few")
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


# ------------------------------------------------------------------ validation
def _validate(data: Any, loc: _Located, base: Path, path: Path | None,
              replace_inputs: Sequence[str | Path] | None = None) -> LoadedConfig:
    if not isinstance(data, dict):
        raise loc.error((), "the config must be a mapping of keys (inputs, stages, ...)")
    for key in data:
        if key not in TOP_LEVEL:
            raise loc.error((key,), f"unknown key (expected one of: {', '.join(TOP_LEVEL)})")
    replacing = replace_inputs is not None
    if "inputs" not in data and not replacing:
        raise loc.error((), "missing required key `inputs`")
    items = _input_items(data.get("inputs"), loc, required=not replacing)
    referenced = _referenced_inputs(data.get("stages"), items, loc)
    keep = [i for i, item in enumerate(items) if not replacing or item["name"] in referenced]
    inputs = [_kept_input_spec(items[i], ("inputs", i), loc, base, replacing) for i in keep]
    raw = data
    if replace_inputs is not None:
        extra = replacement_specs(replace_inputs, {str(s.name) for s in inputs})
        raw = {**data, "inputs": [{"path": str(s.path), "name": s.name} for s in extra]
               + [data["inputs"][i] for i in keep]}
        inputs = extra + inputs
    stages = _stages(data.get("stages") or [], loc)
    normalizer = _normalizer(data.get("normalize") or {}, loc)
    output = data.get("output")
    if output is not None and (not isinstance(output, str) or not output):
        raise loc.error(("output",), f"must be a path string, got {output!r}")
    report = data.get("report", True)
    if report is not True and report is not False and not (isinstance(report, str) and report):
        raise loc.error(("report",), "must be a path string or false")
    ints = {}
    for key, default in (("workers", None), ("batch_rows", 5000), ("shard_rows", 100_000), ("shard_bytes", None)):
        value = data.get(key, default)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise loc.error((key,), f"must be a positive integer, got {value!r}")
        ints[key] = value
    executor = _executor(data.get("executor", "local"), loc)
    ray_address = data.get("ray_address")
    if ray_address is not None and not isinstance(ray_address, str):
        raise loc.error(("ray_address",), "must be a string such as 'auto' or 'ray://host:10001'")
    return LoadedConfig(
        executor=executor, ray_address=ray_address,
        path=path, inputs=inputs, stages=stages, normalizer=normalizer,
        output=Path(output) if output else None,
        report=Path(report) if isinstance(report, str) else report,
        workers=ints["workers"], batch_rows=ints["batch_rows"], shard_rows=ints["shard_rows"],
        shard_bytes=ints["shard_bytes"], raw=raw,
        kept_inputs=[items[i]["name"] for i in keep] if replacing else [],
    )


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


def _executor(value: Any, loc: _Located) -> str:
    if value not in ("local", "ray"):
        raise loc.error(("executor",), f"must be 'local' or 'ray', got {value!r}")
    if value == "ray" and importlib.util.find_spec("ray") is None:
        raise loc.error(("executor",), "the ray package is not installed (pip install 'ray[default]')")
    return value


# ------------------------------------------------------------------ inputs
def _input_items(value: Any, loc: _Located, required: bool = True) -> list[dict[str, Any]]:
    """The inputs as mappings, each checked for shape (keys and types), not for existence."""
    if value is None and not required:
        return []
    if not isinstance(value, list) or not value:
        raise loc.error(("inputs",), "must be a non-empty list of inputs")
    items = []
    for i, item in enumerate(value):
        here = ("inputs", i)
        if isinstance(item, str):
            item = {"path": item}
        if not isinstance(item, dict):
            raise loc.error(here, "each input must be a path or a mapping with `path`")
        for key in item:
            if key not in INPUT_KEYS:
                raise loc.error(here + (key,), f"unknown key (expected one of: {', '.join(INPUT_KEYS)})")
        if "path" not in item:
            raise loc.error(here, "missing required key `path`")
        if not isinstance(item["path"], str) or not item["path"]:
            raise loc.error(here + ("path",), "must be a non-empty string")
        for key in ("name", "text_field", "label_field", "json_key"):
            if key in item and not (isinstance(item[key], str) and item[key]):
                raise loc.error(here + (key,), "must be a non-empty string")
        fmt = item.get("format", "auto")
        if fmt not in FORMATS:
            raise loc.error(here + ("format",), f"unknown format {fmt!r} (expected one of: {', '.join(FORMATS)})")
        reader = item.get("reader", "auto")
        if reader not in READERS:
            raise loc.error(here + ("reader",), f"unknown reader {reader!r} (expected one of: {', '.join(READERS)})")
        aliases = item.get("aliases", {}) or {}
        if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in aliases.items()):
            raise loc.error(here + ("aliases",), "must be a mapping of source field -> canonical field")
        for src, dst in aliases.items():  # path syntax: dataguard/stages/normalize_aliases.py
            try:
                parse_alias(src, dst)
            except ValueError as exc:
                raise loc.error(here + ("aliases", src), str(exc)) from None
        name = item.get("name") or Path(item["path"]).name
        if name in (other["name"] for other in items):
            raise loc.error(here + ("name",), f"duplicate input name {name!r}; names must be unique")
        items.append({**item, "name": name})
    return items


def _input_spec(item: dict[str, Any], here: tuple[Any, ...], loc: _Located, base: Path) -> InputSpec:
    """The InputSpec of one checked input mapping, once its path is found and readable."""
    path = Path(item["path"]).expanduser()
    if not path.is_absolute() and not os.path.exists(path) and os.path.exists(base / path):
        path = base / path  # relative to the config file's folder as a fallback
    problem = input_problem(path, item.get("reader", "auto"), item.get("json_key"))
    if problem:
        raise loc.error(here + ("path",), problem)
    try:
        return InputSpec(path=path, name=item["name"], format=item.get("format", "auto"),
                         reader=item.get("reader", "auto"), aliases=item.get("aliases") or {},
                         text_field=item.get("text_field"), label_field=item.get("label_field"),
                         json_key=item.get("json_key"))
    except InputError as exc:
        raise loc.error(here, str(exc)) from None


def _kept_input_spec(item: dict[str, Any], here: tuple[Any, ...], loc: _Located, base: Path,
                     replacing: bool) -> InputSpec:
    """`_input_spec`, saying why a config input matters although --input replaced the rest."""
    try:
        return _input_spec(item, here, loc, base)
    except ConfigError as exc:
        if not replacing:
            raise
        raise ConfigError(f"{exc} (kept beside --input because a stage reads it by name; run from the folder "
                          "its path is relative to, or edit the config)") from None


def input_problem(path: Path, reader: str = "auto", json_key: str | None = None) -> str | None:
    """Why ``path`` cannot be an input (missing, unreadable, a folder that is not a saved
    dataset, a name whose format cannot be told), or None. Cheap: reads no rows."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return f"file not found: {path}"
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}: {path}"
    if not os.access(path, os.R_OK):
        return f"permission denied: {path}"
    if stat.S_ISDIR(mode):
        try:
            return _folder_problem(path)
        except OSError as exc:
            return f"cannot read the folder: {exc.strerror or exc}: {path}"
    if not stat.S_ISREG(mode):
        return f"not a regular file: {path}"
    if reader != "auto":
        return None
    try:
        InputSpec(path=path, json_key=json_key).resolved_reader()
    except InputError as exc:
        return str(exc)
    except Exception:  # noqa: BLE001 - damaged bytes are the reader's to report, row by row
        return None
    return None


def _folder_problem(path: Path) -> str | None:
    """A folder input must be a `datasets` Dataset saved with save_to_disk."""
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if p.is_dir())
        example = f"{path / splits[0]}" if splits else f"{path}/train"
        return f"{path} is a DatasetDict; give one split's folder (e.g. {example})"
    if any((path / name).is_file() for name in DATASET_FOLDER_FILES) or any(path.glob("*.arrow")):
        return None
    return (f"{path} is a folder but not a saved Hugging Face dataset (no dataset_info.json, state.json "
            "or *.arrow); give a data file or a dataset saved with save_to_disk")


def replacement_specs(paths: Sequence[str | Path], taken: set[str]) -> list[InputSpec]:
    """InputSpecs for `--input` paths (already checked by the caller), named by file name;
    a name that is taken falls back to the absolute path, so inputs stay apart."""
    specs: list[InputSpec] = []
    names = set(taken)
    for p in paths:
        name = Path(p).name
        if name in names:
            name = str(Path(p).resolve())
        if name in names:
            raise ConfigError(f"--input {p}: given twice")
        names.add(name)
        specs.append(InputSpec(path=Path(p), name=name))
    return specs


def _referenced_inputs(stages: Any, items: list[dict[str, Any]], loc: _Located) -> set[str]:
    """Input names that stages refer to (INPUT_NAME_PARAMS); each must be an input."""
    names = [item["name"] for item in items]
    referenced: set[str] = set()
    for i, item in enumerate(stages if isinstance(stages, list) else []):
        if not isinstance(item, dict) or len(item) != 1:
            continue
        (stage, params), = item.items()
        for param in INPUT_NAME_PARAMS.get(stage, ()):
            value = params.get(param) if isinstance(params, dict) else None
            wanted = [value] if isinstance(value, str) else value if isinstance(value, list) else []
            for name in (n for n in wanted if isinstance(n, str)):  # other shapes: the stage says why
                if name not in names:
                    known = ", ".join(repr(n) for n in names) or "none"
                    raise loc.error(("stages", i, stage, param),
                                    f"no input named {name!r} (the config's inputs: {known})")
                referenced.add(name)
    return referenced


# ------------------------------------------------------------------ stages
def _stages(value: Any, loc: _Located) -> list[Stage]:
    if not isinstance(value, list):
        raise loc.error(("stages",), "must be a list like [{length: {percentile: 90}}]")
    stages = []
    for i, item in enumerate(value):
        here = ("stages", i)
        if isinstance(item, str):
            item = {item: {}}
        if not isinstance(item, dict) or len(item) != 1:
            raise loc.error(here, "each stage must be one `name: {params}` mapping")
        (name, params), = item.items()
        if name not in STAGE_PATHS:
            raise loc.error(here + (name,), f"unknown stage (expected one of: {', '.join(STAGE_PATHS)})")
        stages.append(_build(stage_class(name), params, loc, here + (name,)))
    return stages


def _normalizer(params: Any, loc: _Located) -> Stage:
    from dataguard.stages.normalize import Normalizer

    return _build(Normalizer, params, loc, ("normalize",))


def _path_checks() -> dict[str, Callable[[Any], None]]:
    """Parameters that name local files, checked here for every stage that takes them
    (raise ValueError starting with the parameter name), so a missing tokenizer or model
    is a config error at its line, not a worker's crash an hour into the run."""
    from dataguard.text.embeddings import check_model_path
    from dataguard.text.tokenizers import check_tokenizer_spec

    return {"tokenizer": check_tokenizer_spec, "model": check_model_path}


def _build(cls: type[Stage], params: Any, loc: _Located, here: tuple[Any, ...]) -> Stage:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise loc.error(here, "stage parameters must be a mapping")
    accepted = _accepted_params(cls)
    for key in params:
        if accepted is not None and key not in accepted:
            raise loc.error(here + (key,), f"unknown parameter (expected one of: {', '.join(sorted(accepted))})")
    for key, check in _path_checks().items():
        if params.get(key) is not None:
            try:
                check(params[key])
            except ValueError as exc:
                raise loc.error(here + (key,), _strip_param(str(exc), key)) from None
            except OSError as exc:  # e.g. a folder on the way that we may not enter
                raise loc.error(here + (key,), f"cannot read: {exc.strerror or exc}: {params[key]}") from None
    try:
        return cls(**params)
    except StageConfigError as exc:
        bad = _blamed_param(exc, params)
        message = _strip_param(str(exc), bad) if bad else str(exc)
        raise loc.error(here + ((bad,) if bad else ()), _one_line(message)) from None
    except (TypeError, ValueError) as exc:
        raise loc.error(here, f"invalid parameters: {_one_line(str(exc))}") from None
    except OSError as exc:  # a stage reading a file it was given (e.g. a reference set)
        raise loc.error(here, _one_line(f"{exc.strerror or exc}: {exc.filename or ''}")) from None


def _blamed_param(exc: StageConfigError, params: dict[str, Any]) -> str | None:
    """The parameter a StageConfigError is about: its ``param`` attribute when set, else
    the key its message starts with ("mode: must be ..."), else a key it names as a word."""
    param = getattr(exc, "param", None)
    if isinstance(param, str) and param in params:
        return param
    message = str(exc)
    keys = sorted((k for k in params if isinstance(k, str)), key=len, reverse=True)
    starts = next((k for k in keys if re.match(rf"{re.escape(k)}\b", message)), None)
    if starts is not None:
        return starts
    return next((k for k in keys if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", message)), None)


def _strip_param(message: str, param: str) -> str:
    """'mode: must be ...' -> 'must be ...' (the key path already names the parameter)."""
    prefix = f"{param}:"
    return message[len(prefix):].strip() if message.startswith(prefix) else message


def _accepted_params(cls: type[Stage]) -> set[str] | None:
    sig = inspect.signature(cls.__init__)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return {name for name, p in sig.parameters.items() if name != "self"
            and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}
