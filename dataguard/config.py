"""YAML (or dict) config -> validated Pipeline, with errors that name key, file and line.

A config error is a user's typo, not a crash: every problem becomes one `ConfigError`
whose message reads like ``pipelines/sft.yaml:14: stages[1].length.percentil: unknown
parameter (expected one of: action, factor, ...)``.

Relative paths are taken from the working directory (like datatrove and data-juicer);
an input path that only exists next to the config file is found there too.

Reading the YAML safely and locating lines lives in `dataguard.config_yaml`; building the
stages in `dataguard.config_stages`.
"""

from __future__ import annotations

import importlib.util
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataguard import formats
from dataguard.config_stages import _blamed_param, build_normalizer, build_stages
from dataguard.config_yaml import MAX_DEPTH, ConfigError, Located, _Located, load_yaml_document
from dataguard.io.alias_syntax import parse_alias
from dataguard.io.readers import READERS, InputError, InputSpec
from dataguard.params import Allowed, Interval
from dataguard.stage import Stage

__all__ = ["MAX_DEPTH", "ConfigError", "LoadedConfig", "Located", "_Located", "_blamed_param", "input_problem",
           "load_config", "load_yaml_document", "replacement_specs"]

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
FORMATS = ("auto", *formats.FORMATS)  # `format:` of an input: detect, or force one template

# Stage parameters that name inputs of the run (by `name:`), per stage. Such inputs must
# exist in `inputs:`, and `--input` keeps them (see `load_config(replace_inputs=...)`).
INPUT_NAME_PARAMS: dict[str, tuple[str, ...]] = {"overlap": ("validation_sources",),
                                                  "near_dedup": ("validation_sources",),
                                                  "semantic_dedup": ("validation_sources",)}

# Markers of a folder that `datasets.load_from_disk` can read (a saved Dataset).
DATASET_FOLDER_FILES = ("dataset_info.json", "state.json")

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
    stages = build_stages(data.get("stages") or [], loc)
    normalizer = build_normalizer(data.get("normalize") or {}, loc)
    output = data.get("output")
    if output is not None and (not isinstance(output, str) or not output):
        raise loc.error(("output",), f"must be a path string, got {output!r}")
    report = data.get("report", True)
    if report is not True and report is not False and not (isinstance(report, str) and report):
        raise loc.error(("report",), "must be a path string or false")
    ints = {key: loc.checked((key,), SIZES[key], data.get(key, default))
            for key, default in (("workers", None), ("batch_rows", 5000), ("shard_rows", 100_000),
                                 ("shard_bytes", None))}
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


# The run's sizes (`dataguard.params`, as the stages and the train config declare theirs). The
# ceilings: far beyond any real run, and low enough that a C long (Arrow, numpy) holds them
# (a batch_rows of 10**20 was an OverflowError deep in a worker).
SIZES: dict[str, Allowed] = {
    "workers": [Interval(int, 1, ceiling=4096), None],
    "batch_rows": [Interval(int, 1, ceiling=10**9)],
    "shard_rows": [Interval(int, 1, ceiling=10**12)],
    "shard_bytes": [Interval(int, 1, ceiling=2**50), None],
}


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
