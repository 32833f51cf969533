"""`dataguard inspect` and `dataguard report`: reading a finished run's output folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dataguard.cli_common import EXIT_FAILED, CliError, os_message


def build_report(output: Path, html: Path | None) -> Path:
    from dataguard.report.build import build_report

    try:
        return build_report(output, html)
    except OSError as exc:
        raise CliError(f"could not build the report: {os_message(exc)}", EXIT_FAILED) from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CliError(f"could not build the report from {output}: {exc}", EXIT_FAILED) from None


def report_command(args: argparse.Namespace) -> int:
    output = Path(args.output)
    _read_manifest(output)
    print(f"report: {build_report(output, Path(args.html) if args.html else None)}")
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


def inspect_command(args: argparse.Namespace) -> int:
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
