"""`dataguard loop CONFIG --rounds N`: run, train, flag from the dynamics, re-run, retrain.

Round 1 is ``dataguard run`` + ``dataguard train`` as usual. Every later round re-runs the
same pipeline with two stages put first (right after normalize) that feed the previous
round's training run back into the data:

- ``exclude: {runs: [PREV]}`` drops the rows its guard quarantined (``training_anomaly``);
- ``noise: {inputs: dynamics, dynamics: PREV, action: drop}`` drops the rows its dynamics
  flag (classify: the label issues by AUM; sft: ``hard_to_fit``);

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


def feedback_stages(prev_run: Path) -> list[Any]:
    """The two stages that carry a training run back into the data (module docstring)."""
    from dataguard.stages.exclude import ExcludeStage
    from dataguard.stages.noise.stage import NoiseStage

    run = str(prev_run.resolve())
    return [ExcludeStage(runs=[run]), NoiseStage(inputs="dynamics", dynamics=run, action="drop")]


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
