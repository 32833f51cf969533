"""Statistics of normalization: per batch, merged in the driver, shown in the report."""

from __future__ import annotations

from collections import Counter
from typing import Any

from dataguard.formats.placeholders import DEFAULT_STYLES

MAX_EXAMPLES_PER_REASON = 3
MAX_EXAMPLES = 20
SNIPPET_CHARS = 300


def empty_stats() -> dict[str, Any]:
    return {"rows_in": 0, "kept": 0, "formats": {}, "reasons": {}, "aliases": {}, "examples": []}


def batch_stats(rows_in: int, kept: int, formats: Counter[str], rejects: list[dict[str, Any]],
                aliases: Counter[str]) -> dict[str, Any]:
    """One batch's statistics (``rejects``: dicts with id, reason, detail, record)."""
    stats = empty_stats()
    stats["rows_in"] = rows_in
    stats["kept"] = kept
    stats["formats"] = dict(sorted(formats.items()))
    stats["reasons"] = dict(Counter(r["reason"] for r in rejects))
    stats["aliases"] = dict(aliases)
    per_reason: Counter[str] = Counter()
    for r in rejects:
        if per_reason[r["reason"]] < MAX_EXAMPLES_PER_REASON:
            per_reason[r["reason"]] += 1
            stats["examples"].append({"id": r["id"], "reason": r["reason"], "detail": r["detail"],
                                      "text": _snippet(r["record"])})
    return stats


def _snippet(text: str) -> str:
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."


def merge_stats(total: dict[str, Any], s: dict[str, Any]) -> None:
    total["rows_in"] += s["rows_in"]
    total["kept"] += s["kept"]
    for key in ("formats", "reasons", "aliases"):
        for k, v in s[key].items():
            total[key][k] = total[key].get(k, 0) + v
    for source, counts in s.get("alias_inputs", {}).items():
        into = total.setdefault("alias_inputs", {}).setdefault(
            source, {"path": counts["path"], "records": 0, "input": {}, "global": {}})
        into["records"] += counts["records"]
        for scope in ("input", "global"):
            for k, v in counts[scope].items():
                into[scope][k] = into[scope].get(k, 0) + v
    per_reason = Counter(e["reason"] for e in total["examples"])
    for e in s["examples"]:
        if len(total["examples"]) >= MAX_EXAMPLES:
            break
        if per_reason[e["reason"]] < MAX_EXAMPLES_PER_REASON:
            per_reason[e["reason"]] += 1
            total["examples"].append(e)


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
