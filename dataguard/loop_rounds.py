"""`dataguard loop CONFIG --rounds N`: run, train, flag from the dynamics, re-run, retrain.

Every round re-runs the same pipeline and trains on its output. From round 2 on, the previous
round's training run is fed back into the data:

- ``exclude: {runs: [PREV]}`` goes first and drops the rows its guard quarantined
  (``training_anomaly``);
- its dynamics judge the rows. A classify run becomes the second view of the config's
  cross-validated ``noise`` stages that drop or relabel (one round, the runner's ``label``
  column, `dataguard.stages.noise.two_views`: ``dynamics: PREV`` beside their inputs). On
  banking77 with 20% flipped labels the two views reach F1 0.934, the CV stage alone 0.900
  and the AUM alone 0.907, so a dynamics-only stage in front would flag by a weaker view.
  Otherwise (an sft run, or no such stage) ``noise: {inputs: dynamics, dynamics: PREV,
  action: drop}`` goes first and drops the rows the dynamics flag (classify: label issues by
  AUM; sft: ``hard_to_fit``).

A view needs the run to have trained on the rows it judges: a row the run never drew keeps
its cross-validated rank alone. So in every round before the last those noise stages flag
instead of acting, the run trains on the rows they doubt, and the next round judges all of
them; the last round drops or relabels as configured. The data and models of the rounds
before the last are then diagnostics, not what `dataguard run` alone would write; the last
round's are the ones to ship (with ``--rounds 1`` nothing changes: that round is the last).
A round whose data changed since its run trained (the config or the inputs were edited) is
refused rather than kept. Everything lives under ``--output LOOP``::

    LOOP/round1/data  LOOP/round1/run  LOOP/round2/data  LOOP/round2/run ...

It resumes like everything else: a round's pipeline resumes its own output folder, a
round's training continues with ``--resume`` from its newest verified checkpoint, and a
round whose training finished (`training_state`: its newest checkpoint intact and at the
last step or an early stop, its dynamics written) is not run again; a damaged last
checkpoint is resumed past. Killing ``dataguard loop`` anywhere and starting it again with
the same arguments finishes the same rounds.

The command functions are handed in by the CLI (`dataguard.cli`), so this module imports
neither the CLI nor the stages (only their base class) at import time.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from dataguard.stage import Stage, StageConfigError

Command = Callable[[argparse.Namespace], int]


def round_dirs(loop_dir: Path, r: int) -> tuple[Path, Path]:
    """(pipeline output, training run folder) of round ``r`` (1-based)."""
    return loop_dir / f"round{r}" / "data", loop_dir / f"round{r}" / "run"


class RoundRun(NamedTuple):
    """Where a round's training run stands: ``new`` (no checkpoint), ``done`` (nothing left to
    train), ``partial`` (continue with --resume) or ``stale`` (it no longer follows from the
    config: neither done nor resumable; ``why`` says what changed)."""

    state: str
    why: str = ""


def training_state(run: Path, data: Path | None = None, settings: Any = None) -> RoundRun:
    """Where ``run`` stands against the round's ``data`` folder and its ``settings`` (the
    round's `TrainConfig`, as `dataguard train` would load it).

    ``done`` needs the newest intact checkpoint (its sha256 sums checked: a damaged last one is
    resumed past, not kept) at the run's last step or where it stopped early, and, when the run
    records dynamics, its ``dynamics.arrow`` (written after the last checkpoint: a run killed
    in between is resumed, which writes it). ``stale``: it trained on other data (the config
    or the inputs changed) or with other settings than ``settings``."""
    from dataguard.train.checkpoint import latest_checkpoint, newest_intact_checkpoint
    from dataguard.train.data.shards import data_changed
    from dataguard.train.dynamics.file import FILE_NAME
    from dataguard.train.prepare import changed_settings, model_keys

    if not run.is_dir() or latest_checkpoint(run) is None:
        return RoundRun("new")
    latest = newest_intact_checkpoint(run)
    if latest is None:
        return RoundRun("partial")  # every checkpoint damaged: the resume says so in its own words
    try:
        total = int(json.loads((run / "run.json").read_text(encoding="utf-8"))["total_steps"])
        state = json.loads((latest / "state.json").read_text(encoding="utf-8"))
        step = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return RoundRun("partial")
    if data is not None:
        try:
            manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = None  # unreadable: training reports it in its own words, not as "changed"
        if isinstance(manifest, dict) and data_changed(state, manifest):
            return RoundRun("stale", f"its data changed since {run} trained on it (the config or its inputs changed)")
    saved = state.get("config") or {}
    if settings is not None:
        changed = changed_settings(saved, settings, model_keys())
        if changed:
            return RoundRun("stale", f"{run} trained with other settings ({'; '.join(changed)})")
    finished = step >= total or bool((state.get("extra") or {}).get("stopped_early"))
    dynamics = run / FILE_NAME
    if finished and saved.get("dynamics", True) and (not dynamics.is_file() or dynamics.is_symlink()):
        return RoundRun("partial")
    return RoundRun("done" if finished else "partial")


class Stages(NamedTuple):
    """A round's pipeline stages and their config entries (what the manifest records), in step."""

    stages: list[Stage]
    raw: list[Any]


def loop_round(pipeline: Stages, prev_run: Path | None, *, before_last: bool) -> tuple[Stages, list[str]]:
    """The config's ``pipeline`` as round N of the loop changes it (module docstring), and a
    line for each change; a StageConfigError when ``prev_run`` cannot be read.

    The noise stages that take a second view are picked once, from the config's own stages,
    so a middle round of three both gets the previous run beside them and flags for the next."""
    from dataguard.stages.exclude import ExcludeStage
    from dataguard.stages.noise.dynamics import check_run
    from dataguard.stages.noise.stage import NoiseStage

    _check_aligned(pipeline)
    steps, notes, out = second_view_steps(pipeline.stages), [], pipeline
    if prev_run is not None:
        run = str(prev_run.resolve())
        try:
            task = check_run(run)["task"]
        except ValueError as exc:
            raise StageConfigError(str(exc)) from None
        if task == "classify" and steps:
            out = _with_params(out, steps, {"dynamics": run})
            notes.append(f"{run}'s dynamics are the second view of the noise "
                         f"stage{'s' if len(steps) > 1 else ''} already there")
        else:  # no stage takes the view (an sft run has none to give): a dynamics stage first
            steps = []
            out = _inserted(out, NoiseStage(inputs="dynamics", dynamics=run, action="drop"),
                            {"noise": {"inputs": "dynamics", "dynamics": run, "action": "drop"}})
            notes.append(f"a noise stage from {run}'s dynamics drops the rows they flag")
        out = _inserted(out, ExcludeStage(runs=[run]), {"exclude": {"runs": [run]}})
        steps = [i + (len(out.stages) - len(pipeline.stages)) for i in steps]
    if before_last and steps:
        # a view needs the run to have trained on the rows it judges: a row it never drew keeps
        # the cross-validated rank alone, and the next round would just repeat these flags
        out = _with_params(out, steps, {"action": "flag"})
        notes.append("the noise stage flags (does not drop) this round, so its run judges every row for the next one")
    return out, notes


def _inserted(pipeline: Stages, stage: Stage, entry: dict[str, Any]) -> Stages:
    """``pipeline`` with ``stage`` (config entry ``entry``) put first."""
    return Stages([stage, *pipeline.stages], [entry, *pipeline.raw])


def second_view_steps(stages: list[Stage]) -> list[int]:
    """The steps that take a classify run's dynamics as a second view: cross-validated noise
    stages that act on labels (drop or relabel: a flag-only stage would leave the loop cleaning
    nothing, so it gets the dynamics stage in front instead), on the runner's label column, one
    round, the default cut (two views refuse rounds > 1 and a cut of their own)."""
    from dataguard.stages.noise.stage import NoiseStage
    from dataguard.train.data.manifest_schema import LABEL_COLUMN

    return [i for i, s in enumerate(stages)
            if isinstance(s, NoiseStage) and s.inputs != "dynamics" and s.dynamics is None
            and s.action in ("drop", "relabel") and s.rounds == 1 and s.dynamics_cut == "auto"
            and s.label_column == LABEL_COLUMN]


def _with_params(pipeline: Stages, steps: list[int], params: dict[str, Any]) -> Stages:
    """A copy of ``pipeline`` whose ``steps`` are rebuilt with ``params`` over their own."""
    stages, raw = list(pipeline.stages), list(pipeline.raw)
    for i in steps:
        stages[i] = type(stages[i])(**{**stages[i].params(), **params})
        name, given = _entry(raw[i])
        raw[i] = {name: {**given, **params}}
    return Stages(stages, raw)


def _check_aligned(pipeline: Stages) -> None:
    if len(pipeline.stages) != len(pipeline.raw):
        raise ValueError(f"{len(pipeline.stages)} stages but {len(pipeline.raw)} config entries: cannot feed a "
                         "run back")


def _entry(item: Any) -> tuple[str, dict[str, Any]]:
    """A config's stage entry (``name`` or ``{name: params}``) as (name, params)."""
    if isinstance(item, str):
        return item, {}
    (name, params), = item.items()
    return name, dict(params or {})


def round_settings(args: argparse.Namespace, data: Path, run_dir: Path) -> Any:
    """The round's training settings, loaded as the round's `dataguard train` loads them (the
    config's ``train:`` section, its data and run folders, ``--max-steps``); a ConfigError
    names the file, line and key."""
    from dataguard.train.config import load_train_config
    from dataguard.train.prepare import absolute_paths

    overrides: dict[str, Any] = {"data": str(data), "output": str(run_dir)}
    if getattr(args, "max_steps", None):
        overrides["max_steps"] = args.max_steps
    cfg = load_train_config(args.config, overrides=overrides)
    absolute_paths(cfg)
    return cfg


def loop_command(args: argparse.Namespace, *, run: Command, train: Command, echo: Callable[[str], None] = print
                 ) -> int:
    """Run ``args.rounds`` rounds (``run`` / ``train`` are the CLI's own commands)."""
    from dataguard.cli_common import CliError

    loop_dir = Path(args.output)
    prev: Path | None = None
    for r in range(1, args.rounds + 1):
        data, run_dir = round_dirs(loop_dir, r)
        if data.parent.is_symlink():  # LOOP itself is the user's choice, as `run --output`; run and train check the rest
            raise CliError(f"loop: {data.parent} is a link; dataguard does not write through links out of its "
                           "folders (remove it, or loop into a new --output)")
        echo(f"== round {r} of {args.rounds}: data {data}" + (f", fed back from {prev}" if prev else ""))
        run(argparse.Namespace(config=args.config, input=None, output=str(data), report=None, no_report=False,
                               workers=args.workers, executor=None, fresh=False, quiet=args.quiet, exclude=None,
                               feedback=str(prev) if prev else None, before_last=r < args.rounds))
        try:
            settings = round_settings(args, data, run_dir)
        except ValueError as exc:  # a ConfigError names the file, line and key
            raise CliError(f"config error: {exc}") from None
        state, why = training_state(run_dir, data, settings)
        if state == "stale":
            raise CliError(f"loop: round {r}: {why}; its model and the later rounds' would not follow from this "
                           "config: loop into a new --output")
        if state == "done":
            echo(f"== round {r}: training already finished in {run_dir}")
        else:
            train(argparse.Namespace(config=args.config, resume=state == "partial", data=str(data),
                                     output=str(run_dir), max_steps=args.max_steps, quiet=args.quiet))
        prev = run_dir
    echo(f"loop: {args.rounds} round(s) in {loop_dir}; the last model is in {prev}")
    return 0
