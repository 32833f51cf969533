"""Build the audit report of a run's output folder and save a PNG of its top (README screenshot).

    python -m dataguard run pipelines/sft.yaml
    python scripts/report_screenshot.py out/sft reports/screenshot.png [--height 1000]

Needs Debian's chromium (scripts/install_chromium.sh). Fails when the page logs a console
error, so a broken report never becomes the README's picture.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dataguard.report.build import build_report
from dataguard.testing.browser import Chromium


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build a run's audit report and screenshot its top.")
    ap.add_argument("out", type=Path, help="a pipeline's output folder (has manifest.json)")
    ap.add_argument("png", type=Path, help="where to save the screenshot")
    ap.add_argument("--height", type=int, default=1000, help="screenshot height in CSS pixels")
    ap.add_argument("--html", type=Path, help="where to write the report (default OUT/audit.html)")
    args = ap.parse_args(argv)
    html = build_report(args.out, args.html)
    print(html)
    with Chromium(width=1280, height=args.height) as browser:
        load = browser.load(html)
        if load.errors:
            raise SystemExit(f"report has console errors: {load.errors}")
        print(browser.screenshot(args.png))


if __name__ == "__main__":
    main()
