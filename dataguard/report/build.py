"""Build the audit report of a pipeline output folder: one HTML page + a JSON beside it.

Used by ``dataguard run`` (after the run) and ``dataguard report OUTPUT`` (rebuild from
the manifest and shards without re-running anything).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from dataguard.report.load import SAMPLES_PER_REASON, collect
from dataguard.report.render import render_html

DEFAULT_HTML = "audit.html"


def _atomic_write(path: Path, text: str) -> None:
    """Write via a temp file + rename so a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_report(output_dir: str | os.PathLike, html_path: str | os.PathLike | None = None,
                 json_path: str | os.PathLike | None = None, samples_per_reason: int = SAMPLES_PER_REASON,
                 training_runs: list[str] | None = None) -> Path:
    """Write the self-contained HTML audit of ``output_dir`` and its statistics JSON.

    ``html_path`` defaults to ``output_dir/audit.html``; ``json_path`` to the HTML path with
    a ``.json`` suffix. Returns the HTML path. Raises ``ReportInputError`` when
    ``output_dir`` has no manifest.json. ``training_runs``: training run folders whose
    guard-named rows get a section of their own (`dataguard.report.training_rows`).
    """
    out_dir = Path(output_dir)
    html_file = Path(html_path) if html_path is not None else out_dir / DEFAULT_HTML
    json_file = Path(json_path) if json_path is not None else html_file.with_suffix(".json")
    from dataguard.io.output import register_extra_output

    model = collect(out_dir, per_reason=samples_per_reason)
    if training_runs:
        from dataguard.report.training_rows import collect_named

        model["training_rows"] = collect_named(out_dir, [str(r) for r in training_runs])
    register_extra_output(out_dir, json_file)
    register_extra_output(out_dir, html_file)
    page = render_html(model)
    for r in model["reasons"]:
        r.pop("_anchor", None)
    _atomic_write(json_file, json.dumps(model, ensure_ascii=False, indent=1, sort_keys=True, default=str) + "\n")
    _atomic_write(html_file, page)
    return html_file
