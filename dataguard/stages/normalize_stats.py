"""Statistics of normalization: per batch, merged in the driver, shown in the report."""

from __future__ import annotations

from collections import Counter
from typing import Any

from dataguard.formats.placeholders import DEFAULT_STYLES
from dataguard.tally import Tally

MAX_EXAMPLES_PER_REASON = 3
MAX_EXAMPLES = 20
SNIPPET_CHARS = 300


def batch_stats(rows_in: int, kept: int, formats: Counter[str], rejects: list[dict[str, Any]],
                aliases: Counter[str]) -> Tally:
    """One batch's statistics (``rejects``: dicts with id, reason, detail, record)."""
    stats = Tally(counts=Counter(rows_in=rows_in, kept=kept))
    stats.count("formats", dict(sorted(formats.items())))
    stats.count("reasons", (r["reason"] for r in rejects))
    stats.count("aliases", dict(aliases))
    stats.keep("examples", ({"id": r["id"], "reason": r["reason"], "detail": r["detail"],
                             "text": _snippet(r["record"])} for r in rejects),
               MAX_EXAMPLES, per=("reason", MAX_EXAMPLES_PER_REASON))
    return stats


def add_alias_counts(stats: Tally, source: str, counts: dict[str, Any]) -> None:
    """Record one input's alias counts (zeros included) for the unmatched-alias check."""
    stats.note("alias_paths", source, counts["path"])
    stats.add(f"alias_records:{source}", counts["records"])
    for scope in ("input", "global"):
        stats.counters.setdefault(f"alias_{scope}:{source}", Counter()).update(counts[scope])


def totals(t: Tally) -> dict[str, Any]:
    """The merged statistics as plain data: counts, per-format / reason / alias counts,
    examples and, per input that has aliases, what each alias matched."""
    out: dict[str, Any] = {"rows_in": t.get("rows_in"), "kept": t.get("kept"),
                           **{k: dict(t.counters.get(k, {})) for k in ("formats", "reasons", "aliases")},
                           "examples": t.items("examples")}
    if "alias_paths" in t.lookup:
        out["alias_inputs"] = {source: {"path": path, "records": t.get(f"alias_records:{source}"),
                                        "input": dict(t.counters.get(f"alias_input:{source}", {})),
                                        "global": dict(t.counters.get(f"alias_global:{source}", {}))}
                               for source, path in t.lookup["alias_paths"].items()}
    return out


def _snippet(text: str) -> str:
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."


def describe(t: dict[str, Any], check_placeholders: bool, styles: tuple[str, ...] | None) -> dict[str, Any]:
    """The report blocks of the merged statistics (styles are shown only when not the default)."""
    formats = sorted(t["formats"].items(), key=lambda kv: (-kv[1], kv[0]))
    reasons = sorted(t["reasons"].items(), key=lambda kv: (-kv[1], kv[0]))
    blocks: list[dict[str, Any]] = [
        {"type": "bar", "title": "Detected templates (kept rows)", "labels": [k for k, _ in formats],
         "series": {"rows": [v for _, v in formats]}},
    ]
    if reasons:
        blocks.append({"type": "bar", "title": "Rejected rows by reason", "labels": [k for k, _ in reasons],
                       "series": {"rows": [v for _, v in reasons]}})
    if t["aliases"]:
        blocks.append({"type": "table", "title": "Field aliases applied", "columns": ["alias", "rows"],
                       "rows": [[k, v] for k, v in sorted(t["aliases"].items())]})
    if t["examples"]:
        blocks.append({"type": "examples", "title": "Rejected examples",
                       "items": [{"id": e["id"], "label": e["reason"], "text": e["text"], "note": e["detail"]}
                                 for e in t["examples"]]})
    summary = {"rows_in": t["rows_in"], "kept": t["kept"], "rejected": t["rows_in"] - t["kept"],
               "check_placeholders": check_placeholders}
    if styles is not None and styles != DEFAULT_STYLES:
        summary["placeholder_styles"] = list(styles)
    return {"title": "Template normalization", "summary": summary, "blocks": blocks}
