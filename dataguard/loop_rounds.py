"""`dataguard loop CONFIG --rounds N`: run, train, flag from the dynamics, re-run, retrain.

Round 1 is ``dataguard run`` + ``dataguard train`` as usual. Every later round re-runs the
same pipeline with two stages put first (right after normalize) that feed the previous
round's training run back into the data:

- ``exclude: {runs: [PREV]}`` drops the rows its guard quarantined (``training_anomaly``);
- the dynamics judge the rows. A classify run whose pipeline already has a cross-validated
  ``noise`` stage (one round, the runner's ``label`` column) becomes that stage's second view
  (``dynamics: PREV`` beside its inputs, `dataguard.stages.noise.two_views`): on banking77
  with 20% flipped labels the two views reach F1 0.934 where the CV stage alone reaches 0.900
  and the AUM alone 0.907, so stacking a separate dynamics stage in front of it would flag by
  the weaker view. Otherwise (an sft run, or no such stage) ``noise: {inputs: dynamics,
  dynamics: PREV, action: drop}`` goes first and drops the rows the dynamics flag (classify:
  label issues by AUM; sft: ``hard_to_fit``);

then trains again on the result. Everything lives under ``--output LOOP``::

    LOOP/round1/data  LOOP/round1/run  LOOP/round2/data  LOOP/round2/run ...

It resumes like everything else: a round's pipeline resumes its own output folder, a
round's training continues with ``--resume`` from its newest verified checkpoint, and a
round whose training finished (its newest checkpoint is at the run's total step count) is
not run again. Killing ``dataguard loop`` anywhere and starting it again with the same
arguments finishes the same rounds.

The command functions are handed in by the CLI (`dataguard.cli`), so this module imports
neither the CLI nor the stages at import time.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Command = Callable[[argparse.Namespace], int]


def round_dirs(loop_dir: Path, r: int) -> tuple[Path, Path]:
    """(pipeline output, training run folder) of round ``r`` (1-based)."""
    return loop_dir / f"round{r}" / "data", loop_dir / f"round{r}" / "run"


def training_state(run: Path) -> str:
    """``new`` (no checkpoint), ``done`` (the newest checkpoint is at the run's last step) or
    ``partial`` (continue with --resume)."""
    from dataguard.train.checkpoint import latest_checkpoint

    latest = latest_checkpoint(run) if run.is_dir() else None
    if latest is None:
        return "new"
    try:
        total = int(json.loads((run / "run.json").read_text(encoding="utf-8"))["total_steps"])
        step = int(json.loads((latest / "state.json").read_text(encoding="utf-8"))["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return "partial"
    return "done" if step >= total else "partial"


def feed_back(stages: list[Any], raw_stages: list[Any], prev_run: Path) -> tuple[list[Any], list[Any], str]:
    """``(stages, raw_stages, how)``: the pipeline's stages and their config entries (the
    manifest records these) with ``prev_run`` fed back as the module docstring says; ``how``
    says which way, in a line. A StageConfigError when the run cannot be read."""
    from dataguard.stage import StageConfigError
    from dataguard.stages.exclude import ExcludeStage
    from dataguard.stages.noise.dynamics import check_run
    from dataguard.stages.noise.stage import NoiseStage

    run = str(prev_run.resolve())
    try:
        task = check_run(run)["task"]
    except ValueError as exc:
        raise StageConfigError(str(exc)) from None
    stages, raw_stages = list(stages), list(raw_stages)
    beside = [i for i, s in enumerate(stages) if task == "classify" and _takes_a_second_view(s, NoiseStage)]
    for i in beside:
        stages[i] = type(stages[i])(**stages[i].params(), dynamics=run)
        name, params = _entry(raw_stages[i])
        raw_stages[i] = {name: {**params, "dynamics": run}}
    if beside:
        how = f"{run}'s dynamics are the second view of the noise stage{'s' if len(beside) > 1 else ''} already there"
    else:
        stages.insert(0, NoiseStage(inputs="dynamics", dynamics=run, action="drop"))
        raw_stages.insert(0, {"noise": {"inputs": "dynamics", "dynamics": run, "action": "drop"}})
        how = f"a noise stage from {run}'s dynamics drops the rows they flag"
    stages.insert(0, ExcludeStage(runs=[run]))
    raw_stages.insert(0, {"exclude": {"runs": [run]}})
    return stages, raw_stages, how


def _takes_a_second_view(stage: Any, noise_class: type) -> bool:
    """A cross-validated noise stage on the runner's label column, with no run beside it yet
    and one round (two views refuse rounds > 1)."""
    return (isinstance(stage, noise_class) and stage.inputs != "dynamics" and stage.dynamics is None
            and stage.rounds == 1 and stage.label_column == "label")


def _entry(item: Any) -> tuple[str, dict[str, Any]]:
    """A config's stage entry (``name`` or ``{name: params}``) as (name, params)."""
    if isinstance(item, str):
        return item, {}
    (name, params), = item.items()
    return name, dict(params or {})


def loop_command(args: argparse.Namespace, *, run: Command, train: Command, echo: Callable[[str], None] = print
                 ) -> int:
    """Run ``args.rounds`` rounds (``run`` / ``train`` are the CLI's own commands)."""
    loop_dir = Path(args.output)
    prev: Path | None = None
    for r in range(1, args.rounds + 1):
        data, run_dir = round_dirs(loop_dir, r)
        echo(f"== round {r} of {args.rounds}: data {data}" + (f", fed back from {prev}" if prev else ""))
        run(argparse.Namespace(config=args.config, input=None, output=str(data), report=None, no_report=False,
                               workers=args.workers, executor=None, fresh=False, quiet=args.quiet, exclude=None,
                               feedback=str(prev) if prev else None))
        state = training_state(run_dir)
        if state == "done":
            echo(f"== round {r}: training already finished in {run_dir}")
        else:
            train(argparse.Namespace(config=args.config, resume=state == "partial", data=str(data),
                                     output=str(run_dir), max_steps=args.max_steps, quiet=args.quiet))
        prev = run_dir
    echo(f"loop: {args.rounds} round(s) in {loop_dir}; the last model is in {prev}")
    return 0
