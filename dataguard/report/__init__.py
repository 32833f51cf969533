"""The self-contained HTML audit report (and its JSON twin) of a pipeline output folder."""

from dataguard.report.build import build_report
from dataguard.report.load import ReportInputError, collect
from dataguard.report.render import render_html

__all__ = ["ReportInputError", "build_report", "collect", "render_html"]
