"""Command line: `dataguard run`, `dataguard inspect`, `dataguard report`, `dataguard train`,
`dataguard convert`.

Exit codes: 0 success, 2 bad config or arguments, 1 a failed run, 130 interrupted.

Every failure a user can cause (a bad config, a bad input, an output folder that cannot be
written, a full disk, Ctrl-C) ends in one line on stderr, ``dataguard: ...``, and a non-zero
exit - never a traceback. A failure that is dataguard's own bug says so in one line too;
set DATAGUARD_TRACEBACK=1 to see the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure to report as one line with an exit code (no traceback)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints usage plus a message)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"dataguard: {message} (see `{self.prog} --help`)\n")


def _int_at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``, else one clear line naming the rule."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be a {what} integer, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "positive")
_count = _int_at_least(0, "non-negative")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dataguard", description=(
        "Data-quality pipeline for LLM fine-tuning data: normalize mixed formats, filter, "
        "decontaminate and audit, writing Arrow shards, rejected rows with reasons, a manifest "
        "and an HTML audit report."))
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a pipeline from a YAML config",
                         description="Run a pipeline config. A run killed part-way resumes when started "
                                     "again with the same config and output.")
    run.add_argument("config", help="pipeline YAML file (see pipelines/)")
    run.add_argument("--input", action="append", default=None, metavar="PATH",
                     help="replace the config's inputs with these files or saved datasets (repeatable; format "
                          "auto-detected; named by file name). Inputs that a stage refers to by name, such as "
                          "an overlap stage's validation_sources, are kept: the validation split stays")
    run.add_argument("--output", help="output folder (overrides `output:` in the config)")
    run.add_argument("--report", help="HTML report path (default: the config's `report:`, else OUTPUT/audit.html)")
    run.add_argument("--no-report", action="store_true", help="do not write the HTML audit report")
    run.add_argument("--workers", type=_positive_int, help="worker processes (default: config, else all cores)")
    run.add_argument("--executor", choices=("local", "ray"), help="where units run (overrides the config)")
    run.add_argument("--fresh", action="store_true",
                     help="start over instead of resuming (removes only files dataguard wrote)")
    run.add_argument("--quiet", action="store_true", help="no progress bars")

    inspect_ = sub.add_parser("inspect", help="summarise an output folder: counts, reasons, rejected examples")
    inspect_.add_argument("output", help="output folder of a run")
    inspect_.add_argument("--examples", type=_count, default=3, help="rejected examples per reason (default 3)")

    report = sub.add_parser("report", help="rebuild the HTML audit report from an output folder")
    report.add_argument("output", help="output folder of a run")
    report.add_argument("--html", help="where to write the report (default OUTPUT/audit.html)")

    train = sub.add_parser("train", help="fine-tune a model on a run's shards (the bundled training runner)",
                           description="Train with a `train:` section of a pipeline YAML, or a YAML of train "
                                       "settings. --resume continues exactly from the newest complete checkpoint.")
    train.add_argument("config", help="pipeline YAML with a `train:` section, or a train YAML; with --resume "
                                      "also a run folder (its saved settings are used)")
    train.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    train.add_argument("--output", help="run folder for checkpoints and metrics (overrides `output:`)")
    train.add_argument("--max-steps", type=_positive_int, help="optimizer steps (overrides `max_steps:`)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")

    convert = sub.add_parser("convert", help="write a plain model folder from a run or checkpoint (LoRA merged)")
    convert.add_argument("source", help="run folder (its newest complete checkpoint) or a checkpoint folder")
    convert.add_argument("out", help="new folder for the model (loads with from_pretrained)")

    train_report = sub.add_parser("train-report", help="rebuild the HTML training report from a run folder")
    train_report.add_argument("run", help="run folder of `dataguard train`")
    train_report.add_argument("--html", help="where to write the report (default RUN/training.html)")
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed as one line
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    command = {"run": _run, "inspect": _inspect, "report": _report, "train": _train,
               "convert": _convert, "train-report": _train_report}[args.command]
    try:
        code = command(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers, not at exit
        return code
    except CliError as exc:
        return _fail(str(exc), exc.code)
    except KeyboardInterrupt:
        return _fail("interrupted; run again to resume" if args.command == "run"
                     else "interrupted; continue with --resume" if args.command == "train" else "interrupted",
                     EXIT_INTERRUPTED)
    except MemoryError:
        return _fail(f"{args.command} failed: out of memory (try fewer --workers or a smaller batch_rows)",
                     EXIT_FAILED)
    except BrokenPipeError:  # `dataguard inspect OUT | head`: the reader left; not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the interpreter's final flush is quiet
        return 0
    except OSError as exc:
        return _fail(f"{args.command} failed: {_os_message(exc)}", EXIT_FAILED)
    except Exception as exc:  # noqa: BLE001 - the promise is one line, even for our own bugs
        if os.environ.get("DATAGUARD_TRACEBACK"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (a dataguard bug; set DATAGUARD_TRACEBACK=1 "
                     "to see where)", EXIT_FAILED)


def _fail(message: str, code: int) -> int:
    print(f"dataguard: {' '.join(message.split())}", file=sys.stderr)
    return code


def _os_message(exc: OSError) -> str:
    """'<strerror>: <filename>', plus what to do about a full disk."""
    text = exc.strerror or str(exc)
    if exc.filename is not None:
        text += f": {exc.filename}"
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        text += " (free some space and run again: finished work is kept and resumed)"
    return text


# ------------------------------------------------------------------ run
def _run(args: argparse.Namespace) -> int:
    from dataguard.config import ConfigError, load_config
    from dataguard.io.readers import InputError
    from dataguard.pipeline import PipelineError

    _check_inputs(args.input or [])
    try:
        config = load_config(args.config, replace_inputs=args.input)
    except (ConfigError, InputError) as exc:
        raise CliError(f"config error: {exc}") from None
    if config.kept_inputs:
        print(f"dataguard: note: --input keeps the config's {', '.join(map(repr, config.kept_inputs))} "
              "(a stage reads it by name, e.g. as the validation split)", file=sys.stderr)
    output = Path(args.output) if args.output else config.output
    if output is None:
        raise CliError(f"no output folder: pass --output or set `output:` in {args.config}")
    _check_output(output)
    if args.executor:
        config.executor = args.executor
    if config.executor == "ray":
        _check_ray()
    pipeline = config.pipeline(progress=not args.quiet and sys.stderr.isatty(), workers=args.workers)
    try:
        result = pipeline.run(config.inputs, output, fresh=args.fresh)
    except (InputError, PipelineError) as exc:
        raise CliError(f"run failed: {exc}", EXIT_FAILED) from None
    _print_result(result, output)
    if not args.no_report and config.report is not False:
        html = Path(args.report) if args.report else (config.report if isinstance(config.report, Path)
                                                       else None)
        print(f"report:   {_build_report(output, html)}")
    return 0


def _check_inputs(paths: list[str]) -> None:
    """Each --input must be readable data, and given once."""
    from dataguard.config import input_problem

    seen: set[Path] = set()
    for path in paths:
        problem = input_problem(Path(path))
        if problem:
            raise CliError(f"--input {path}: {problem}")
        resolved = Path(path).resolve()
        if resolved in seen:
            raise CliError(f"--input {path}: given twice")
        seen.add(resolved)


def _check_output(output: Path) -> None:
    """Refuse, before any work, an output that cannot be a folder we can write in. (The
    pipeline checks again when it claims the folder; this only makes the message early.)"""
    if output.exists() and not output.is_dir():
        raise CliError(f"output {output}: is a file, not a folder")
    probe = output
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe != output and not probe.is_dir():
        raise CliError(f"output {output}: {probe} is a file, so no folder can be made inside it")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise CliError(f"output {output}: permission denied: cannot write in {probe}")


def _check_ray() -> None:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise CliError("--executor ray: the ray package is not installed (pip install 'ray[default]')")


def _print_result(result: Any, output: Path) -> None:
    counts = result.manifest["counts"]
    print(f"rows in {counts['rows_in']:,}  kept {counts['rows_kept']:,}  rejected {counts['rows_rejected']:,}  "
          f"({'balanced' if counts['balanced'] else 'NOT BALANCED'}) in {result.timings['seconds']:.1f}s")
    print(f"shards:   {output / 'data'}")
    print(f"rejected: {output / 'rejected'}")
    print(f"manifest: {output / 'manifest.json'}")


def _build_report(output: Path, html: Path | None) -> Path:
    from dataguard.report.build import build_report

    try:
        return build_report(output, html)
    except OSError as exc:
        raise CliError(f"could not build the report: {_os_message(exc)}", EXIT_FAILED) from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CliError(f"could not build the report from {output}: {exc}", EXIT_FAILED) from None


# ------------------------------------------------------------------ train and convert
def _train(args: argparse.Namespace) -> int:
    from dataguard.config import ConfigError
    from dataguard.train.config import load_train_config

    overrides: dict[str, Any] = {}
    if args.output:
        overrides["output"] = args.output
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
    _check_output(Path(cfg.output))
    from dataguard.train.loop import Trainer

    trainer = Trainer(cfg, progress=not args.quiet and sys.stderr.isatty(), echo=print)
    import warnings

    def one_line(message: Any, category: Any, *_: Any, **__: Any) -> None:
        if issubclass(category, UserWarning) and not issubclass(category, FutureWarning | DeprecationWarning):
            print(f"dataguard: warning: {' '.join(str(message).split())}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = one_line
            result = trainer.fit(resume=args.resume)
    except _train_errors() as exc:
        if (Path(cfg.output) / "metrics.jsonl").is_file():  # a stopped run's page says why
            with contextlib.suppress(CliError):
                print(f"report:     {_build_training_report(Path(cfg.output))}")  # stderr stays one line
        raise CliError(f"train failed: {exc}", EXIT_FAILED) from None
    last = f"  loss {result.final_loss:.4f}" if result.final_loss is not None else ""
    print(f"steps {result.steps}/{result.total_steps}{last}  skipped {result.skipped_steps}"
          f"{'  (early stop)' if result.stopped_early else ''}")
    if result.last_eval:
        print("eval:       " + "  ".join(f"{k} {v:.4f}" for k, v in result.last_eval.items()))
    print(f"checkpoint: {result.checkpoint}")
    print(f"metrics:    {Path(cfg.output) / 'metrics.jsonl'}")
    print(f"report:     {_build_training_report(Path(cfg.output))}")
    return 0


def _build_training_report(run: Path, html: Path | None = None) -> Path:
    from dataguard.train.report import ReportInputError, build_training_report

    try:
        return build_training_report(run, html)
    except (ReportInputError, OSError, ValueError) as exc:  # OutputFolderError is a ValueError
        raise CliError(f"could not build the training report: {exc}", EXIT_FAILED) from None


def _train_report(args: argparse.Namespace) -> int:
    print(f"report: {_build_training_report(Path(args.run), Path(args.html) if args.html else None)}")
    return 0


def _run_settings(run: Path, resume: bool) -> dict[str, Any]:
    from dataguard.train.checkpoint import latest_checkpoint

    if not resume:
        raise CliError(f"{run} is a folder: pass a config file, or --resume to continue that run")
    latest = latest_checkpoint(run)
    if latest is None:
        raise CliError(f"{run}: no complete checkpoint to resume from")
    try:
        settings = json.loads((latest / "state.json").read_text())["config"]
    except (OSError, ValueError, KeyError) as exc:
        raise CliError(f"{latest}: unreadable state.json ({exc})", EXIT_FAILED) from None
    return {k: v for k, v in settings.items() if v is not None}


def _train_errors() -> tuple[type[Exception], ...]:
    from dataguard.train.checkpoint import CheckpointError
    from dataguard.train.convert import ConvertError
    from dataguard.train.data import TrainDataError
    from dataguard.train.loop import TrainError
    from dataguard.train.model import ModelError
    from dataguard.train.sampler import SamplerError

    return (TrainError, TrainDataError, ModelError, CheckpointError, ConvertError, SamplerError)


def _convert(args: argparse.Namespace) -> int:
    from dataguard.train.convert import convert_checkpoint

    try:
        out = convert_checkpoint(args.source, args.out)
    except _train_errors() as exc:
        raise CliError(f"convert failed: {exc}", EXIT_FAILED) from None
    print(f"model: {out}")
    return 0


# ------------------------------------------------------------------ report and inspect
def _report(args: argparse.Namespace) -> int:
    output = Path(args.output)
    _read_manifest(output)
    print(f"report: {_build_report(output, Path(args.html) if args.html else None)}")
    return 0


def _read_manifest(output: Path) -> dict[str, Any]:
    """The manifest of a finished run, or a CliError saying why there is none."""
    if not output.is_dir():
        raise CliError(f"{output} has no manifest.json (no such folder)" if not output.exists()
                       else f"{output}: is a file, not a folder")
    path = output / "manifest.json"
    if not path.is_file():
        raise CliError(f"{output} has no manifest.json (not a finished run)")
    try:
        manifest = json.loads(path.read_bytes())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or not all(isinstance(manifest.get(k), t) for k, t in _MANIFEST_KEYS):
        raise CliError(f"{path}: not a dataguard manifest (needs {', '.join(k for k, _ in _MANIFEST_KEYS)})")
    return manifest


_MANIFEST_KEYS = (("counts", dict), ("inputs", list), ("stages", list), ("outputs", dict))


def _inspect(args: argparse.Namespace) -> int:
    output = Path(args.output)
    manifest = _read_manifest(output)
    try:
        lines = _summary_lines(manifest)
        shown = _rejected_examples(output, manifest, args.examples)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CliError(f"{output / 'manifest.json'}: not a valid dataguard manifest "
                       f"({type(exc).__name__}: {exc})") from None
    print("\n".join(lines))
    if shown:
        print("\nrejected examples:")
        for reason, rows in shown.items():
            print(f"  [{reason}]")
            for row in rows:
                record = (row.get("record") or "").replace("\n", " ")
                print(f"    {row.get('id')}: {row.get('detail')}")
                print(f"      {record[:160]}{'...' if len(record) > 160 else ''}")
    return 0


def _summary_lines(manifest: dict[str, Any]) -> list[str]:
    counts = manifest["counts"]
    lines = [f"rows in {counts['rows_in']:,}  kept {counts['rows_kept']:,}  rejected {counts['rows_rejected']:,}  "
             f"nothing lost: {'yes' if counts['balanced'] else 'NO'}", "", "inputs:"]
    for item in manifest["inputs"]:
        lines.append(f"  {item['name']:<32} {item.get('rows', 0):>9,} rows  {item.get('reader', '')}")
    lines += ["", "stages:"]
    for stage in manifest["stages"]:
        lines.append(f"  {stage['name']:<14} in {stage['rows_in']:>9,}  kept {stage['rows_kept']:>9,}  "
                     f"rejected {stage['rows_rejected']:>7,}")
        for reason, n in stage["reasons"].items():
            lines.append(f"      {reason:<28} {n:>8,}")
    return lines


def _rejected_examples(output: Path, manifest: dict[str, Any], per_reason: int) -> dict[str, list[dict]]:
    """Up to ``per_reason`` rejected rows per reason, read shard by shard until enough."""
    import pyarrow as pa

    from dataguard.io.writer import read_table

    wanted = {reason: per_reason for stage in manifest["stages"] for reason in stage["reasons"]}
    shown: dict[str, list[dict]] = {}
    for shard in manifest["outputs"].get("rejected", []):
        if not any(wanted.values()):
            break
        path = output / shard["path"]
        try:
            rows = read_table(path).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            raise CliError(f"cannot read rejected shard {path}: {exc}", EXIT_FAILED) from None
        for row in rows:
            if wanted.get(row.get("reason"), 0) > 0:
                wanted[row["reason"]] -= 1
                shown.setdefault(row["reason"], []).append(row)
    return shown


if __name__ == "__main__":
    sys.exit(main())
