"""Command line: `dataguard run`, `dataguard inspect`, `dataguard report`.

Exit codes: 0 success, 2 bad config or arguments, 1 a failed run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXIT_FAILED = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dataguard", description=(
        "Data-quality pipeline for LLM fine-tuning data: normalize mixed formats, filter, "
        "decontaminate and audit, writing Arrow shards, rejected rows with reasons, a manifest "
        "and an HTML audit report."))
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a pipeline from a YAML config",
                         description="Run a pipeline config. A run killed part-way resumes when started "
                                     "again with the same config and output.")
    run.add_argument("config", help="pipeline YAML file (see pipelines/)")
    run.add_argument("--input", action="append", default=None, metavar="PATH",
                     help="replace the config's inputs with these files (repeatable; format auto-detected)")
    run.add_argument("--output", help="output folder (overrides `output:` in the config)")
    run.add_argument("--report", help="HTML report path (default: the config's `report:`, else OUTPUT/audit.html)")
    run.add_argument("--no-report", action="store_true", help="do not write the HTML audit report")
    run.add_argument("--workers", type=int, help="worker processes (default: config, else all cores)")
    run.add_argument("--executor", choices=("local", "ray"), help="where units run (overrides the config)")
    run.add_argument("--fresh", action="store_true", help="discard unfinished work instead of resuming")
    run.add_argument("--quiet", action="store_true", help="no progress bars")

    inspect_ = sub.add_parser("inspect", help="summarise an output folder: counts, reasons, rejected examples")
    inspect_.add_argument("output", help="output folder of a run")
    inspect_.add_argument("--examples", type=int, default=3, help="rejected examples per reason (default 3)")

    report = sub.add_parser("report", help="rebuild the HTML audit report from an output folder")
    report.add_argument("output", help="output folder of a run")
    report.add_argument("--html", help="where to write the report (default OUTPUT/audit.html)")
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "inspect":
        return _inspect(args)
    return _report(args)


def _run(args: argparse.Namespace) -> int:
    import shutil

    from dataguard.config import ConfigError, load_config
    from dataguard.io.readers import InputError, InputSpec
    from dataguard.pipeline import PipelineError

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"dataguard: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.input:
        missing = [p for p in args.input if not Path(p).exists()]
        if missing:
            print(f"dataguard: --input: file not found: {missing[0]}", file=sys.stderr)
            return EXIT_USAGE
        config.inputs = [InputSpec(path=p, name=Path(p).name) for p in args.input]
    output = Path(args.output) if args.output else config.output
    if output is None:
        print(f"dataguard: no output folder: pass --output or set `output:` in {args.config}", file=sys.stderr)
        return EXIT_USAGE
    if args.workers is not None and args.workers < 1:
        print("dataguard: --workers must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.executor:
        config.executor = args.executor
    if args.fresh:
        shutil.rmtree(output / "_work", ignore_errors=True)
    pipeline = config.pipeline(progress=not args.quiet and sys.stderr.isatty(), workers=args.workers)
    try:
        result = pipeline.run(config.inputs, output)
    except (InputError, PipelineError) as exc:
        print(f"dataguard: run failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    counts = result.manifest["counts"]
    print(f"rows in {counts['rows_in']:,}  kept {counts['rows_kept']:,}  rejected {counts['rows_rejected']:,}  "
          f"({'balanced' if counts['balanced'] else 'NOT BALANCED'}) in {result.timings['seconds']:.1f}s")
    print(f"shards:   {output / 'data'}")
    print(f"rejected: {output / 'rejected'}")
    print(f"manifest: {output / 'manifest.json'}")
    if not args.no_report and config.report is not False:
        html = Path(args.report) if args.report else (config.report if isinstance(config.report, Path)
                                                       else None)
        written = _build_report(output, html)
        if written is None:
            return EXIT_FAILED
        print(f"report:   {written}")
    return 0


def _build_report(output: Path, html: Path | None) -> Path | None:
    from dataguard.report.build import build_report

    try:
        return build_report(output, html)
    except (OSError, ValueError, KeyError) as exc:
        print(f"dataguard: could not build the report: {exc}", file=sys.stderr)
        return None


def _report(args: argparse.Namespace) -> int:
    output = Path(args.output)
    if not (output / "manifest.json").is_file():
        print(f"dataguard: {output} has no manifest.json (not a finished run)", file=sys.stderr)
        return EXIT_USAGE
    written = _build_report(output, Path(args.html) if args.html else None)
    if written is None:
        return EXIT_FAILED
    print(f"report: {written}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from dataguard.io.writer import read_table

    output = Path(args.output)
    manifest_path = output / "manifest.json"
    if not manifest_path.is_file():
        print(f"dataguard: {output} has no manifest.json (not a finished run)", file=sys.stderr)
        return EXIT_USAGE
    manifest = json.loads(manifest_path.read_text())
    counts = manifest["counts"]
    print(f"rows in {counts['rows_in']:,}  kept {counts['rows_kept']:,}  rejected {counts['rows_rejected']:,}  "
          f"nothing lost: {'yes' if counts['balanced'] else 'NO'}")
    print("\ninputs:")
    for item in manifest["inputs"]:
        print(f"  {item['name']:<32} {item.get('rows', 0):>9,} rows  {item.get('reader', '')}")
    print("\nstages:")
    for stage in manifest["stages"]:
        print(f"  {stage['name']:<14} in {stage['rows_in']:>9,}  kept {stage['rows_kept']:>9,}  "
              f"rejected {stage['rows_rejected']:>7,}")
        for reason, n in stage["reasons"].items():
            print(f"      {reason:<28} {n:>8,}")
    wanted: dict[str, int] = {}
    shown: dict[str, list[dict]] = {}
    for stage in manifest["stages"]:
        for reason in stage["reasons"]:
            wanted[reason] = args.examples
    for shard in manifest["outputs"]["rejected"]:
        if not any(wanted.values()):
            break
        for row in read_table(output / shard["path"]).to_pylist():
            if wanted.get(row["reason"], 0) > 0:
                wanted[row["reason"]] -= 1
                shown.setdefault(row["reason"], []).append(row)
    if shown:
        print("\nrejected examples:")
        for reason, rows in shown.items():
            print(f"  [{reason}]")
            for row in rows:
                record = (row["record"] or "").replace("\n", " ")
                print(f"    {row['id']}: {row['detail']}")
                print(f"      {record[:160]}{'...' if len(record) > 160 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
