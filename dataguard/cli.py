"""Command line: `dataguard run`, `dataguard inspect`, `dataguard report`, `dataguard train`,
`dataguard convert`, `dataguard loop`.

Exit codes: 0 success, 2 bad config or arguments, 1 a failed run, 130 interrupted.

Every failure a user can cause (a bad config, a bad input, an output folder that cannot be
written, a full disk, Ctrl-C) ends in one line on stderr, ``dataguard: ...``, and a non-zero
exit - never a traceback. A failure that is dataguard's own bug says so in one line too;
set DATAGUARD_TRACEBACK=1 to see the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from dataguard.cli_common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, CliError, check_output, os_message
from dataguard.cli_inspect import build_report, inspect_command, report_command
from dataguard.cli_train import convert_command, train_command, train_report_command

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_USAGE", "CliError", "main"]


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
    run.add_argument("--report", help="HTML report path (default: the config's `report:` if it is absolute or "
                                      "--output is not given, else OUTPUT/audit.html)")
    run.add_argument("--no-report", action="store_true", help="do not write the HTML audit report")
    run.add_argument("--workers", type=_positive_int, help="worker processes (default: config, else all cores)")
    run.add_argument("--executor", choices=("local", "ray"), help="where units run (overrides the config)")
    run.add_argument("--fresh", action="store_true",
                     help="start over instead of resuming (removes only files dataguard wrote)")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument("--exclude", action="append", default=None, metavar="RUN",
                     help="drop the rows this training run's guard quarantined (events.jsonl), with reason "
                          "training_anomaly (repeatable; an exclude stage runs first, after normalize)")

    inspect_ = sub.add_parser("inspect", help="summarise an output folder: counts, reasons, rejected examples")
    inspect_.add_argument("output", help="output folder of a run")
    inspect_.add_argument("--examples", type=_count, default=3, help="rejected examples per reason (default 3)")

    report = sub.add_parser("report", help="rebuild the HTML audit report from an output folder")
    report.add_argument("output", help="output folder of a run")
    report.add_argument("--html", help="where to write the report (default OUTPUT/audit.html)")
    report.add_argument("--training", action="append", default=None, metavar="RUN",
                        help="add the rows this training run's guard named (events.jsonl), shown with their "
                             "stage scores at the anchors the training page links to (repeatable)")

    train = sub.add_parser("train", help="fine-tune a model on a run's shards (the bundled training runner)",
                           description="Train with a `train:` section of a pipeline YAML, or a YAML of train "
                                       "settings. --resume continues exactly from the newest complete checkpoint.")
    train.add_argument("config", help="pipeline YAML with a `train:` section, or a train YAML; with --resume "
                                      "also a run folder (its saved settings are used)")
    train.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    train.add_argument("--data", help="pipeline output folder to train on (overrides `data:`, which defaults to "
                                      "the pipeline's `output:`)")
    train.add_argument("--output", help="run folder for checkpoints and metrics (overrides `output:`)")
    train.add_argument("--max-steps", type=_positive_int, help="optimizer steps (overrides `max_steps:`)")
    train.add_argument("--quiet", action="store_true",
                       help="no progress bar (on a terminal) or progress lines (every `log_every` steps otherwise)")

    convert = sub.add_parser("convert", help="write a plain model folder from a run or checkpoint (LoRA merged)")
    convert.add_argument("source", help="run folder or a checkpoint folder")
    convert.add_argument("out", help="new folder for the model (loads with from_pretrained)")
    convert.add_argument("--checkpoint", default="best", metavar="best|newest",
                         help="which checkpoint of a run folder: best (by eval loss, the default) or newest "
                              "(the newest intact one); a damaged checkpoint is never converted")
    convert.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                         help="dtype of the written weights: auto (the default) keeps the dtype the run's base "
                              "was loaded in (bf16 under `precision: bf16` with LoRA), else fp32")

    loop = sub.add_parser("loop", help="run, train, flag rows from the training dynamics, re-run, retrain",
                          description="Round 1 runs the pipeline and trains; each later round re-runs the pipeline "
                                      "with the previous run's quarantined rows excluded and its dynamics-flagged "
                                      "rows dropped, then trains again. Resumes when started again.")
    loop.add_argument("config", help="pipeline YAML with a `train:` section")
    loop.add_argument("--rounds", type=_positive_int, default=2, help="rounds (default 2)")
    loop.add_argument("--output", required=True, help="folder for every round's data and run (LOOP/roundN/...)")
    loop.add_argument("--workers", type=_positive_int, help="pipeline worker processes")
    loop.add_argument("--max-steps", type=_positive_int, help="optimizer steps per round (overrides `max_steps:`)")
    loop.add_argument("--quiet", action="store_true", help="no progress bars or lines")

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
    command = {"run": _run, "inspect": inspect_command, "report": _report, "train": train_command,
               "convert": convert_command, "train-report": train_report_command, "loop": _loop}[args.command]
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
        return _fail(f"{args.command} failed: {os_message(exc)}", EXIT_FAILED)
    except Exception as exc:  # noqa: BLE001 - the promise is one line, even for our own bugs
        if os.environ.get("DATAGUARD_TRACEBACK"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (a dataguard bug; set DATAGUARD_TRACEBACK=1 "
                     "to see where)", EXIT_FAILED)


def _fail(message: str, code: int) -> int:
    print(f"dataguard: {' '.join(message.split())}", file=sys.stderr)
    return code


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
    if args.exclude:
        exclude_runs(config, args.exclude)
    prev_run, before_last = getattr(args, "feedback", None), getattr(args, "before_last", False)
    if prev_run or before_last:  # a round of `dataguard loop`
        _loop_round(config, prev_run, before_last)
    output = Path(args.output) if args.output else config.output
    if output is None:
        raise CliError(f"no output folder: pass --output or set `output:` in {args.config}")
    check_output(output)
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
        print(f"report:   {build_report(output, _report_path(args, config.report, config.output, output))}")
    return 0


def _report_path(args: argparse.Namespace, configured: Path | bool | None, config_output: Path | None,
                 output: Path) -> Path | None:
    """--report, else the config's `report:`, else None (OUTPUT/audit.html). A relative
    `report:` belongs with the config's own `output:`: when --output sends the run elsewhere,
    the report goes with it (OUTPUT/audit.html) instead of over the checkout's reports/
    (`make demo`, with no --output, still writes the reports/ page its config names)."""
    if args.report:
        return Path(args.report)
    if not isinstance(configured, Path):
        return None
    moved = config_output is not None and output.resolve() != config_output.resolve()
    if args.output and moved and not configured.is_absolute():
        print(f"dataguard: note: --output {output}: the report goes to {output / 'audit.html'}, not to the "
              f"config's {configured} (pass --report to choose)", file=sys.stderr)
        return None
    return configured


def _report(args: argparse.Namespace) -> int:
    """`dataguard report`; with --training, the audit also shows the rows those runs named."""
    if not args.training:
        return report_command(args)
    for run in args.training:
        if not (Path(run) / "events.jsonl").is_file():
            raise CliError(f"--training {run}: no events.jsonl (not a dataguard training run folder)")
    if not (Path(args.output) / "manifest.json").is_file():
        raise CliError(f"{args.output} has no manifest.json (not a finished run)")
    from dataguard.report.build import build_report as build_audit

    try:
        html = build_audit(Path(args.output), Path(args.html) if args.html else None, training_runs=args.training)
    except (OSError, ValueError, KeyError) as exc:
        raise CliError(f"could not build the report from {args.output}: {exc}", EXIT_FAILED) from None
    print(f"report: {html}")
    return 0


def _loop(args: argparse.Namespace) -> int:
    from dataguard.loop_rounds import loop_command

    _check_loop_training(args)
    return loop_command(args, run=_run, train=train_command)


def _check_loop_training(args: argparse.Namespace) -> None:
    """Refuse, before any round's work, a config the loop's training would refuse later: a bad
    or missing ``train:`` section (one line naming the file, line and key), a threshold-rows
    run and, with more than one round, a run that records no dynamics to feed back."""
    from dataguard.config import ConfigError
    from dataguard.loop_rounds import round_dirs, round_settings

    data, run_dir = round_dirs(Path(args.output), 1)  # each round's folders are the loop's; the first stands for all
    try:
        cfg = round_settings(args, data, run_dir)
    except ConfigError as exc:
        raise CliError(f"config error: {exc}") from None
    if cfg.threshold_rows:
        # the loop's last round is the model a user ships; a threshold-rows run is a diagnostic
        # (an extra output, 1/(c+1) of the rows relabelled), and one set leaves its rows unjudged
        raise CliError(f"loop: {args.config}: threshold_rows trains a diagnostic model; the loop trains the one you "
                       "ship (train the two threshold runs by hand, then `noise: {inputs: dynamics, dynamics: "
                       "[RUN_1, RUN_2]}`)")
    if not cfg.dynamics and args.rounds > 1:
        raise CliError(f"loop: {args.config}: train.dynamics is false, but each round feeds its run's dynamics into "
                       "the next: set dynamics: true (or loop --rounds 1)")


def _loop_round(config: Any, prev_run: str | None, before_last: bool) -> None:
    """A loop round's stages (`dataguard.loop_rounds.loop_round`). Each change is said in a
    line: the round's data is not what `dataguard run` alone would write."""
    from dataguard.loop_rounds import Stages, loop_round
    from dataguard.stage import StageConfigError

    try:
        pipeline, notes = loop_round(Stages(config.stages, config.raw.get("stages") or []),
                                     Path(prev_run) if prev_run else None, before_last=before_last)
    except StageConfigError as exc:
        raise CliError(f"loop: the previous round's run {prev_run}: {exc}") from None
    for note in notes:
        print(f"loop: {note}")
    config.stages = pipeline.stages
    config.raw = {**config.raw, "stages": pipeline.raw}


def exclude_runs(config: Any, runs: list[str]) -> None:
    """Put an exclude stage for ``runs`` first in ``config`` (and in the config the manifest
    records, so a run with other exclusions never resumes this one's work)."""
    from dataguard.stage import StageConfigError
    from dataguard.stages.exclude import ExcludeStage

    runs = [str(Path(r).resolve()) for r in runs]
    try:
        stage = ExcludeStage(runs=runs)
    except StageConfigError as exc:
        raise CliError(f"--exclude: {exc}") from None
    config.stages.insert(0, stage)
    config.raw = {**config.raw, "stages": [{"exclude": {"runs": runs}}, *(config.raw.get("stages") or [])]}


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
    for stage in result.manifest.get("stages") or []:
        summary = (stage.get("description") or {}).get("summary") or {}
        if stage.get("name") == "exclude" and summary.get("rows_quarantined") and not summary.get("rows_excluded"):
            print(f"dataguard: note: exclude: none of the {summary['rows_quarantined']} rows quarantined by "
                  f"{summary.get('runs')} is in these inputs (no row id matches); was the run trained on this "
                  "data?", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
