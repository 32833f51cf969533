"""`dataguard train`, `dataguard train-report` and `dataguard convert`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dataguard.cli_common import EXIT_FAILED, CliError, check_output


def train_command(args: argparse.Namespace) -> int:
    from dataguard.config_yaml import ConfigError
    from dataguard.train.config import load_train_config
    from dataguard.train.prepare import absolute_paths, preflight
    from dataguard.train.report.metrics_log import step_lines

    overrides: dict[str, Any] = {}
    if args.output:
        overrides["output"] = args.output
    if args.data:
        overrides["data"] = args.data
    if args.max_steps:
        overrides["max_steps"] = args.max_steps
    source: Any = args.config
    if Path(args.config).is_dir():  # `dataguard train --resume RUN`: the settings saved with the run
        source = _run_settings(Path(args.config), args.resume)
        overrides.setdefault("output", args.config)
    try:
        cfg = load_train_config(source, overrides=overrides or None)
    except ConfigError as exc:
        raise CliError(f"config error: {exc}") from None
    absolute_paths(cfg)  # run.json and checkpoints name the folders from anywhere (resume elsewhere)
    run_dir = Path(cfg.output)
    check_output(run_dir)
    if not Path(cfg.data).is_dir():  # before the run folder is claimed: a failed start leaves none
        raise CliError(f"no pipeline output at {cfg.data} (run `dataguard run CONFIG` first, or pass --data)")
    try:
        preflight(cfg)  # device, precision, model folder: before any shard is read
    except _train_errors() as exc:
        raise CliError(f"train failed: {exc}", EXIT_FAILED) from None
    from dataguard.train.loop import Trainer

    trainer = Trainer(cfg, progress=not args.quiet and sys.stderr.isatty(), echo=print)
    made = _first_missing(run_dir) if int(os.environ.get("RANK", "0")) == 0 else None  # rank 0 claims it
    try:
        with _one_line_warnings(), step_lines(not args.quiet):
            result = trainer.fit(resume=args.resume)
    except BaseException as exc:
        if made is not None:  # a start that failed before writing anything leaves no folder behind
            _remove_if_unused(run_dir, made)
        if not isinstance(exc, _train_errors()):
            raise
        if (run_dir / "metrics.jsonl").is_file():  # a stopped run's page says why
            with contextlib.suppress(CliError):
                print(f"report:     {_build_training_report(run_dir)}")  # stderr stays one line
        raise CliError(f"train failed: {exc}", EXIT_FAILED) from None
    last = f"  loss {result.final_loss:.4f}" if result.final_loss is not None else ""
    print(f"steps {result.steps}/{result.total_steps}{last}  skipped {result.skipped_steps}"
          f"{'  (early stop)' if result.stopped_early else ''}")
    if result.last_eval:
        print("eval:       " + "  ".join(f"{k} {v:.4f}" for k, v in result.last_eval.items()))
    print(f"checkpoint: {result.checkpoint}")
    print(f"metrics:    {run_dir / 'metrics.jsonl'}")
    print(f"report:     {_build_training_report(run_dir)}")
    return 0


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (None if ``path`` exists)."""
    if path.exists() or path.is_symlink():
        return None
    while not path.parent.exists() and path.parent != path:
        path = path.parent
    return path


def _remove_if_unused(run_dir: Path, made: Path) -> None:
    """Remove the run folder this call created (and the parents it created) when it holds
    nothing but the claim's marker and lock; anything else written there stays."""
    from dataguard.io.output import LOCK, MARKER

    with contextlib.suppress(OSError):
        if not run_dir.is_dir() or run_dir.is_symlink():
            return
        if {p.name for p in run_dir.iterdir()} - {MARKER, LOCK}:
            return
        for name in (MARKER, LOCK):
            (run_dir / name).unlink(missing_ok=True)
        folder = run_dir
        while True:
            folder.rmdir()  # only ever an empty folder
            if folder == made:
                break
            folder = folder.parent


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Our warnings as `dataguard: warning: ...` lines on stderr, not Python's two-line form."""
    import warnings

    def one_line(message: Any, category: Any, *_: Any, **__: Any) -> None:
        if issubclass(category, UserWarning) and not issubclass(category, FutureWarning | DeprecationWarning):
            print(f"dataguard: warning: {' '.join(str(message).split())}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = one_line
        yield


def _build_training_report(run: Path, html: Path | None = None) -> Path:
    from dataguard.train.report.page import ReportInputError, build_training_report

    try:
        return build_training_report(run, html)
    except (ReportInputError, OSError, ValueError) as exc:  # OutputFolderError is a ValueError
        raise CliError(f"could not build the training report: {exc}", EXIT_FAILED) from None


def train_report_command(args: argparse.Namespace) -> int:
    print(f"report: {_build_training_report(Path(args.run), Path(args.html) if args.html else None)}")
    return 0


def _run_settings(run: Path, resume: bool) -> dict[str, Any]:
    from dataguard.io.safe_files import LinkRefused, find_link
    from dataguard.train.checkpoint import latest_checkpoint, newest_intact_checkpoint

    if not resume:
        raise CliError(f"{run} is a folder: pass a config file, or --resume to continue that run")
    link = find_link(run)  # its settings would be read through the link
    if link is not None:
        raise CliError(str(LinkRefused(link)), EXIT_FAILED)
    if latest_checkpoint(run) is None:
        raise CliError(f"{run}: no complete checkpoint to resume from")
    latest = newest_intact_checkpoint(run)  # the run itself names any damaged one it skips
    if latest is None:
        raise CliError(f"{run}: every checkpoint is damaged; nothing can be resumed safely", EXIT_FAILED)
    try:
        settings = json.loads((latest / "state.json").read_text())["config"]
    except (OSError, ValueError, KeyError) as exc:
        raise CliError(f"{latest}: unreadable state.json ({exc})", EXIT_FAILED) from None
    return {k: v for k, v in settings.items() if v is not None}


def _train_errors() -> tuple[type[Exception], ...]:
    from dataguard.train.checkpoint import CheckpointError
    from dataguard.train.convert import ConvertError
    from dataguard.train.data import TrainDataError
    from dataguard.train.data.sampler import SamplerError
    from dataguard.train.loop import TrainError
    from dataguard.train.model.build import ModelError

    return (TrainError, TrainDataError, ModelError, CheckpointError, ConvertError, SamplerError)


def convert_command(args: argparse.Namespace) -> int:
    from dataguard.train.convert import convert_checkpoint

    try:
        with _one_line_warnings():
            out = convert_checkpoint(args.source, args.out, args.checkpoint, dtype=getattr(args, "dtype", "auto"))
    except _train_errors() as exc:
        raise CliError(f"convert failed: {exc}", EXIT_FAILED) from None
    print(f"model: {out}")
    return 0
