"""Compose a normalizer and stages into a run: plan segments, schedule them, write the outputs.

`Pipeline` only orchestrates; each job has its own module in `dataguard.run`:
``splits`` plans the input splits (a JSON-lines file: byte ranges its workers index and
read themselves), ``segment`` plans fused segments and runs one on one unit, ``units``
lists a segment's units and takes those a previous run finished from the work folder,
``workdir`` owns the resume folder (names, fingerprint, unit results), ``shards`` cuts
the final shards and ``manifest`` builds manifest.json. Executors (`dataguard.executors`)
schedule units.
A killed run resumes from the finished units in ``OUTPUT/_work`` with byte-identical output.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from dataguard.executors.base import Executor, ExecutorError
from dataguard.io.output import OutputFolder, OutputFolderError
from dataguard.io.readers import DEFAULT_BATCH_ROWS, InputSpec
from dataguard.io.writer import atomic_write_json, read_table
from dataguard.rounds.tasks import RoundContext, UnitFitFiles, run_round
from dataguard.run import manifest as mf
from dataguard.run.segment import (
    APPLY,
    SOURCE,
    Segment,
    SegmentWork,
    plan_segments,
    step_key,
)
from dataguard.run.shards import ShardTask, write_shards
from dataguard.run.splits import SPLIT_BYTES, InputPlan
from dataguard.run.trained_inputs import check_runs_read
from dataguard.run.units import run_side_tasks, run_units, unit_tasks
from dataguard.run.workdir import RUNTIME_KEYS, WorkDir, fingerprint, without_runtime_keys
from dataguard.stage import Stage, StageConfigError, StageDataError

__all__ = ["RUNTIME_KEYS", "Pipeline", "PipelineError", "RunResult", "Segment", "plan_segments"]


class PipelineError(RuntimeError):
    """A run cannot proceed (e.g. leftover work from a different configuration)."""


@dataclass
class RunResult:
    output: Path
    manifest: mf.Manifest
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
                 ray_address: str | None = None, split_bytes: int = SPLIT_BYTES) -> None:
        if normalizer is None:
            from dataguard.stages.normalize import Normalizer

            normalizer = Normalizer()
        if not isinstance(normalizer, Stage) or not callable(getattr(normalizer, "normalize", None)):
            raise TypeError("normalizer must be a Stage with normalize(raw_batch, options) "
                            f"(see dataguard.run.segment.SourceAdapter), got {type(normalizer).__name__}")
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
        self.split_bytes = int(split_bytes)  # JSON-lines inputs are read by workers in ranges of this size
        self.progress = progress
        self.keep_work = keep_work
        self.config = without_runtime_keys(config if config is not None else self._config_from_stages())

    @property
    def steps(self) -> list[Stage]:
        """What runs, in order: the normalizer (the source adapter, step 0), then the stages."""
        return [self.normalizer, *self.stages]

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
        for step in self.steps:  # before the output folder is touched: a bad reference changes nothing
            try:
                step.prepare()
            except StageConfigError as exc:
                raise PipelineError(f"stage {step.name}: {exc}") from None
        output = Path(output)
        folder = OutputFolder(output)
        try:
            folder.claim(Path(spec.path) for spec in specs if spec.path is not None)
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
        started = time.time()
        work = WorkDir(output)
        executor = self._executor()
        try:
            # read-only, so before the work folder is prepared: input checksums and ranges
            plan = InputPlan(specs, self.batch_rows, self.split_bytes,
                             lambda tasks: run_side_tasks(executor, tasks, "reading inputs", self.progress))
            input_info = plan.input_info
            refused = check_runs_read(self.steps, input_info)
            if refused:  # before the folder's last run description is touched: a refusal changes nothing
                raise PipelineError(refused)
            folder.invalidate_run_description()
            work.prepare(folder, fingerprint(self.config, input_info, self.batch_rows, [s.name for s in self.steps],
                                             self.split_bytes), fresh)
            metas_by_segment, stage_seconds = self._run_segments(plan, work, executor)
            manifest = self._finish(output, folder, work, input_info, metas_by_segment,
                                    lambda tasks: run_side_tasks(executor, tasks, "writing shards", self.progress))
        finally:
            executor.close()
        finished = time.time()
        timings = {"started": _iso(started), "finished": _iso(finished), "seconds": round(finished - started, 3),
                   "stage_seconds": {k: round(v, 3) for k, v in stage_seconds.items()},
                   "workers": executor.workers}
        folder.own("run.json")
        atomic_write_json(output / "run.json", timings)
        if not self.keep_work:
            folder.clean_work()
        return RunResult(output=output, manifest=manifest, timings=timings)

    def _run_segments(self, plan: InputPlan, work: WorkDir,
                      executor: Executor) -> tuple[list[list[dict[str, Any]]], dict[str, float]]:
        """Each segment over every unit, then the fits that end it, then the stages whose
        apply ran in it absorb their batch stats (and the metas let go of them, so the
        driver holds merged tallies, not one per unit). Returns the units' metas per segment
        and seconds per step."""
        steps = self.steps
        segments = plan_segments(steps)
        stage_seconds: dict[str, float] = {}
        metas_by_segment: list[list[dict[str, Any]]] = []
        for segment in segments:
            tasks = unit_tasks(plan, work, segment.index, metas_by_segment[-1] if metas_by_segment else [])
            metas = run_units(executor, SegmentWork(steps, segment.ops), tasks,
                              f"segment {segment.index + 1}/{len(segments)}", self.progress)
            metas.sort(key=lambda m: m["unit"])
            metas_by_segment.append(metas)
            for op, i in segment.ops:  # the source now: an alias that matched nothing stops the run here
                if op == SOURCE:
                    steps[i].absorb([m["stats"].pop(i, None) for m in metas])
            for meta in metas:
                for key, seconds in meta["seconds"].items():
                    stage_seconds[key] = stage_seconds.get(key, 0.0) + seconds
            for i in segment.fit_steps:  # a shared boundary fits its stages in step order
                fit_start = time.time()
                self._fit(executor, work, segment.index, i, metas)
                key = step_key(i, steps)
                stage_seconds[key] = stage_seconds.get(key, 0.0) + time.time() - fit_start
            for op, i in segment.ops:  # a stage's apply runs in this segment only: its stats are complete
                if op == APPLY:
                    steps[i].absorb([m["stats"].pop(i, None) for m in metas])
            _release(metas)
        return metas_by_segment, stage_seconds

    def _fit(self, executor: Executor, work: WorkDir, segment: int, i: int, metas: list[dict[str, Any]]) -> None:
        """Fit step ``i`` in the driver from the units' summaries, or, for a stage that fits
        in rounds, by running its rounds on the executor over the units' fit files."""
        stage = self.steps[i]
        summaries = [m["summaries"][i] for m in metas]
        try:
            if not stage.fits_in_rounds():
                stage.fit(summaries)
                return
            units = [UnitFitFiles(work.segment(segment), m["unit"], i) for m in metas]
            ctx = RoundContext(folder=work.fit_folder(i), units=units,
                               run=lambda tasks, desc: run_round(tasks, lambda pending: run_side_tasks(
                                   executor, pending, f"{stage.name}: {desc}", self.progress)))
            stage.fit_rounds(summaries, ctx)
        except StageDataError as exc:
            raise PipelineError(f"stage {stage.name}: {exc}") from None

    def _executor(self) -> Executor:
        if self.executor == "ray":
            from dataguard.executors.ray import RayExecutor

            return RayExecutor(address=self.ray_address, num_cpus=self.workers)
        from dataguard.executors.local import LocalExecutor

        return LocalExecutor(workers=self.workers)

    # ------------------------------------------------------------------ outputs
    def _finish(self, output: Path, folder: OutputFolder, work: WorkDir, input_info: list[dict[str, Any]],
                metas_by_segment: list[list[dict[str, Any]]],
                run_tasks: Callable[[list[ShardTask]], list[dict[str, Any]]]) -> mf.Manifest:
        shards = write_shards(output, folder, work, metas_by_segment, self.shard_rows, self.shard_bytes, run_tasks)
        steps = self.steps
        keys = [step_key(i, steps) for i in range(len(steps))]
        first = metas_by_segment[0]
        manifest = mf.build_manifest(
            config=self.config, inputs=mf.input_entries(input_info, first), steps=steps, keys=keys,
            counts=mf.merge_counts(metas_by_segment, keys), rows_in=sum(m["rows_in"] for m in first),
            data=shards.data, rejected=shards.rejected, schema=shards.schema)
        folder.own("manifest.json")
        atomic_write_json(output / "manifest.json", manifest)
        counts = manifest["counts"]
        if not counts["balanced"]:
            raise PipelineError(f"rows were lost: {counts['rows_in']} in, {counts['rows_kept']} kept + "
                                f"{counts['rows_rejected']} rejected")
        return manifest


def _os_error_text(exc: OSError) -> str:
    """One line for an OS failure: what went wrong and on which file."""
    import errno

    why = "no space left on device (free some and run again to resume)" if exc.errno == errno.ENOSPC \
        else (exc.strerror or str(exc))
    where = f": {exc.filename}" if exc.filename else ""
    return f"{why}{where}"


def _check_unique_names(specs: Sequence[InputSpec]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise PipelineError(f"two inputs are named {spec.name!r}; give each a distinct `name`")
        seen.add(str(spec.name))


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _release(metas: list[dict[str, Any]]) -> None:
    """Hold less per unit once a segment is fitted: the fit summaries are dropped (a resumed
    run refits from the copies in the work folder) and identical serialized schemas (about
    10 KB each for a typical run) are kept once, not once per unit and segment."""
    schemas: dict[bytes, bytes] = {}
    for meta in metas:
        meta["summaries"] = {}
        if isinstance(meta.get("schema"), bytes):
            meta["schema"] = schemas.setdefault(meta["schema"], meta["schema"])
