"""YAML (or dict) config -> validated Pipeline, with errors that name key, file and line.

A config error is a user's typo, not a crash: every problem becomes one `ConfigError`
whose message reads like ``pipelines/sft.yaml:14: stages[1].length.percentil: unknown
parameter (expected one of: action, factor, ...)``.

Relative paths are taken from the working directory (like datatrove and data-juicer);
an input path that only exists next to the config file is found there too.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dataguard.io.readers import READERS, InputSpec
from dataguard.stage import Stage, StageConfigError
from dataguard.stages import STAGE_PATHS, stage_class

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
}
INPUT_KEYS = ("path", "name", "format", "reader", "aliases", "text_field", "label_field", "json_key")
FORMATS = ("auto", "alpaca", "sharegpt", "messages", "dolly", "prompt_completion", "labelled_text")


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
            self._walk(node, ())

    def _walk(self, node: yaml.Node, path: tuple[Any, ...]) -> None:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = key_node.value
                self.lines[path + (key,)] = key_node.start_mark.line + 1
                self._walk(value_node, path + (key,))
                self.lines[path + (key,)] = key_node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, path + (i,))

    def error(self, path: tuple[Any, ...], message: str) -> ConfigError:
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        where = f"{self.filename}:{line}" if line else self.filename
        key = _path_text(path)
        return ConfigError(f"{where}: {key}: {message}" if key else f"{where}: {message}")


def _path_text(path: tuple[Any, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def load_config(source: str | Path | dict[str, Any]) -> LoadedConfig:
    """Parse and validate a YAML file (or an already-parsed dict)."""
    if isinstance(source, dict):
        return _validate(source, _Located("<config>", None), Path.cwd(), None)
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    text = path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    if data is None:
        raise ConfigError(f"{path}: the config is empty")
    return _validate(data, _Located(str(path), node), path.parent, path)


def _validate(data: Any, loc: _Located, base: Path, path: Path | None) -> LoadedConfig:
    if not isinstance(data, dict):
        raise loc.error((), "the config must be a mapping of keys (inputs, stages, ...)")
    for key in data:
        if key not in TOP_LEVEL:
            raise loc.error((key,), f"unknown key (expected one of: {', '.join(TOP_LEVEL)})")
    if "inputs" not in data:
        raise loc.error((), "missing required key `inputs`")
    inputs = _inputs(data["inputs"], loc, base)
    stages = _stages(data.get("stages") or [], loc)
    normalizer = _normalizer(data.get("normalize") or {}, loc)
    output = data.get("output")
    if output is not None and not isinstance(output, str):
        raise loc.error(("output",), f"must be a path string, got {type(output).__name__}")
    report = data.get("report", True)
    if report is not True and report is not False and not isinstance(report, str):
        raise loc.error(("report",), "must be a path string or false")
    ints = {}
    for key, default in (("workers", None), ("batch_rows", 5000), ("shard_rows", 100_000), ("shard_bytes", None)):
        value = data.get(key, default)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise loc.error((key,), f"must be a positive integer, got {value!r}")
        ints[key] = value
    executor = data.get("executor", "local")
    if executor not in ("local", "ray"):
        raise loc.error(("executor",), f"must be 'local' or 'ray', got {executor!r}")
    ray_address = data.get("ray_address")
    if ray_address is not None and not isinstance(ray_address, str):
        raise loc.error(("ray_address",), "must be a string such as 'auto' or 'ray://host:10001'")
    return LoadedConfig(
        executor=executor, ray_address=ray_address,
        path=path, inputs=inputs, stages=stages, normalizer=normalizer,
        output=Path(output) if output else None,
        report=Path(report) if isinstance(report, str) else report,
        workers=ints["workers"], batch_rows=ints["batch_rows"], shard_rows=ints["shard_rows"],
        shard_bytes=ints["shard_bytes"], raw=data,
    )


def _inputs(value: Any, loc: _Located, base: Path) -> list[InputSpec]:
    if not isinstance(value, list) or not value:
        raise loc.error(("inputs",), "must be a non-empty list of inputs")
    specs = []
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
        if not isinstance(item["path"], str):
            raise loc.error(here + ("path",), "must be a string")
        path = Path(item["path"])
        if not path.is_absolute() and not path.exists() and (base / path).exists():
            path = base / path  # relative to the config file's folder as a fallback
        if not path.exists():
            raise loc.error(here + ("path",), f"file not found: {path}")
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
        for key in ("name", "text_field", "label_field", "json_key"):
            if key in item and not isinstance(item[key], str):
                raise loc.error(here + (key,), "must be a string")
        specs.append(InputSpec(path=path, name=item.get("name") or path.name, format=fmt, reader=reader,
                               aliases=aliases, text_field=item.get("text_field"),
                               label_field=item.get("label_field"), json_key=item.get("json_key")))
    names = [s.name for s in specs]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise loc.error(("inputs", i, "name"), f"duplicate input name {name!r}; names must be unique")
    return specs


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


def _build(cls: type[Stage], params: Any, loc: _Located, here: tuple[Any, ...]) -> Stage:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise loc.error(here, "stage parameters must be a mapping")
    accepted = _accepted_params(cls)
    for key in params:
        if accepted is not None and key not in accepted:
            raise loc.error(here + (key,), f"unknown parameter (expected one of: {', '.join(sorted(accepted))})")
    try:
        return cls(**params)
    except StageConfigError as exc:
        bad = next((k for k in params if k in str(exc)), None)
        raise loc.error(here + ((bad,) if bad else ()), str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise loc.error(here, f"invalid parameters: {exc}") from None


def _accepted_params(cls: type[Stage]) -> set[str] | None:
    sig = inspect.signature(cls.__init__)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return {name for name, p in sig.parameters.items() if name != "self"
            and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}
