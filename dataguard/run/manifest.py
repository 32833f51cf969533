"""``manifest.json``: its typed schema (shared with `dataguard.report.load`) and how it is built.

The manifest is what a run says it did: the config (runtime keys removed), every input
with its checksum, rows read and templates detected, the versions of the packages that
shape the bytes, the counts (rows in = kept + rejected), each step's counts, reasons,
effective parameters and description, every shard with its checksum, the kept schema,
and what stages hand to the training runner. It is written with sorted keys, so the
bytes depend on the values only.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict, cast

import pyarrow as pa

from dataguard import __version__
from dataguard.records import json_dumps
from dataguard.stage import Stage


class StageCounts(TypedDict):
    rows_in: int
    rows_kept: int
    rows_rejected: int
    reasons: dict[str, int]  # most frequent first


class StageEntry(StageCounts):
    name: str
    key: str  # "00-normalize", "01-dedup", ...: names may repeat, keys do not
    params: dict[str, Any]  # every constructor parameter, given or default
    description: dict[str, Any]  # the stage's describe(): title, summary, blocks


class InputEntry(TypedDict, total=False):
    name: str
    path: str | None
    reader: str
    format: str
    bytes: int
    sha256: str
    fingerprint: str | None  # an in-memory `datasets.Dataset` instead of a path
    rows: int
    formats_detected: dict[str, int]


class ShardEntry(TypedDict):
    path: str  # relative to the output folder
    rows: int
    bytes: int
    sha256: str


class SchemaField(TypedDict):
    name: str
    type: str


class Outputs(TypedDict):
    data: list[ShardEntry]
    rejected: list[ShardEntry]
    schema: list[SchemaField]


class Counts(TypedDict):
    rows_in: int
    rows_kept: int
    rows_rejected: int
    balanced: bool


class Manifest(TypedDict):
    dataguard_version: str
    config: dict[str, Any]
    inputs: list[InputEntry]
    packages: dict[str, str | None]
    counts: Counts
    stages: list[StageEntry]
    outputs: Outputs
    training: dict[str, Any]  # stage name -> Stage.training_state()


# ------------------------------------------------------------------ packages
# dataguard's own requirements (importlib.metadata) decide which versions are recorded,
# minus those that cannot change what a run writes:
_NOT_RECORDED = {
    "pyyaml": "parses the config; the manifest records the parsed config itself",
    "tqdm": "progress bars",
    "jinja2": "the audit page",
    "accelerate": "training runner", "peft": "training runner", "safetensors": "training runner",
    "tensorboard": "training runner", "torchao": "training runner",
    "pytest": "development", "ruff": "development", "pytest-timeout": "development", "hypothesis": "development",
}


def recorded_packages() -> list[str]:
    """dataguard, then its requirements (extras too: ray runs units) in declaration order."""
    try:
        requires = importlib.metadata.requires("dataguard") or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree without installing
        requires = []
    names = ["dataguard"]
    for req in requires:
        name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
        if name and name not in names and name not in _NOT_RECORDED:
            names.append(name)
    return names


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# ------------------------------------------------------------------ building
def merge_counts(metas_by_segment: Sequence[Sequence[Mapping[str, Any]]], keys: Sequence[str]) -> dict[str, StageCounts]:
    """Each step's counts over all units (reasons most frequent first); zero for a step no unit reached."""
    counts: dict[str, StageCounts] = {}
    for metas in metas_by_segment:
        for meta in metas:
            for key, c in meta["counts"].items():
                total = counts.setdefault(key, _zero())
                total["rows_in"] += c["rows_in"]
                total["rows_kept"] += c["rows_kept"]
                total["rows_rejected"] += c["rows_rejected"]
                for reason, n in c["reasons"].items():
                    total["reasons"][reason] = total["reasons"].get(reason, 0) + n
    for key in keys:
        counts.setdefault(key, _zero())
        counts[key]["reasons"] = dict(sorted(counts[key]["reasons"].items(), key=lambda kv: (-kv[1], kv[0])))
    return counts


def _zero() -> StageCounts:
    return {"rows_in": 0, "rows_kept": 0, "rows_rejected": 0, "reasons": {}}


def input_entries(inputs: Sequence[Mapping[str, Any]], first_metas: Sequence[Mapping[str, Any]]) -> list[InputEntry]:
    """Each input's static facts plus the rows read from it and the templates detected."""
    per_source: dict[str, int] = {}
    formats: dict[str, dict[str, int]] = {}
    for meta in first_metas:
        per_source[meta["source"]] = per_source.get(meta["source"], 0) + meta["rows_in"]
        source_formats = formats.setdefault(meta["source"], {})
        for fmt, n in meta.get("formats", {}).items():
            source_formats[fmt] = source_formats.get(fmt, 0) + n
    return [cast(InputEntry, {**info, "rows": per_source.get(str(info["name"]), 0),
                              "formats_detected": dict(sorted(formats.get(str(info["name"]), {}).items()))})
            for info in inputs]


def stage_entries(steps: Sequence[Stage], keys: Sequence[str], counts: Mapping[str, StageCounts]) -> list[StageEntry]:
    return [cast(StageEntry, {"name": step.name, "key": key, **counts[key], "params": params_json(step),
                              "description": jsonable(step.describe())})
            for step, key in zip(steps, keys, strict=True)]


def training_section(steps: Sequence[Stage]) -> dict[str, Any]:
    """What stages hand to the training runner (`Stage.training_state`), by stage name."""
    training: dict[str, Any] = {}
    for step in steps:
        state = step.training_state()
        if state is not None:
            training[step.name] = jsonable(state)
    return training


def build_manifest(*, config: Mapping[str, Any], inputs: list[InputEntry], steps: Sequence[Stage],
                   keys: Sequence[str], counts: Mapping[str, StageCounts], rows_in: int,
                   data: list[ShardEntry], rejected: list[ShardEntry], schema: pa.Schema) -> Manifest:
    rows_kept = sum(f["rows"] for f in data)
    rows_rejected = sum(f["rows"] for f in rejected)
    return {
        "dataguard_version": __version__,
        "config": jsonable(dict(config)),
        "inputs": inputs,
        "packages": package_versions(recorded_packages()),
        "counts": {"rows_in": rows_in, "rows_kept": rows_kept, "rows_rejected": rows_rejected,
                   "balanced": rows_in == rows_kept + rows_rejected},
        "stages": stage_entries(steps, keys, counts),
        "outputs": {"data": data, "rejected": rejected, "schema": schema_json(schema)},
        "training": training_section(steps),
    }


def schema_json(schema: pa.Schema) -> list[SchemaField]:
    return [{"name": f.name, "type": str(f.type)} for f in schema]


def params_json(stage: Stage) -> dict[str, Any]:
    """The stage's effective parameters as JSON; a value JSON cannot hold (a scikit-learn
    estimator handed in from Python) is recorded by its repr."""
    out: dict[str, Any] = {}
    for name, value in stage.effective_params().items():
        try:
            out[name] = jsonable(value)
        except (TypeError, ValueError):
            out[name] = repr(value)
    return out


def jsonable(value: Any) -> Any:
    """Plain, strict JSON: numpy scalars and tuples become plain; NaN/inf become null."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return clean(json.loads(json_dumps(value)))
