"""Formatting and escaping helpers shared by the report renderers.

Every string that reaches the page goes through :func:`esc` (``html.escape`` with
``quote=True``), so dataset text can never open a tag or close an attribute.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any

_SLUG_RE = re.compile(r"[^a-z0-9]+")


def esc(value: Any) -> str:
    """Escape any value for HTML text or a double-quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def slug(value: Any, taken: set[str] | None = None) -> str:
    """A safe, unique HTML id fragment ([a-z0-9-] only) for anchors."""
    base = _SLUG_RE.sub("-", str(value).lower()).strip("-") or "x"
    out = base
    n = 2
    while taken is not None and out in taken:
        out = f"{base}-{n}"
        n += 1
    if taken is not None:
        taken.add(out)
    return out


def num(value: Any) -> str:
    """Human number: thousands separators for ints, 4 significant digits for floats."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        if value == int(value) and abs(value) < 1e15:
            return f"{int(value):,}"
        a = abs(value)
        if a >= 1e6 or a < 1e-4:
            return f"{value:.3g}"
        if a >= 1000:
            return f"{value:,.1f}"
        return f"{value:.4g}"
    return str(value)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def human_bytes(n: Any) -> str:
    if not is_number(n):
        return "—"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"  # pragma: no cover - loop always returns


def human_seconds(s: Any) -> str:
    if not is_number(s):
        return "—"
    s = float(s)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m"


def pct(part: Any, whole: Any) -> str:
    if not is_number(part) or not is_number(whole) or whole == 0:
        return "—"
    share = 100.0 * part / whole
    if share == 0:
        return "0%"
    if share < 0.01:
        return "<0.01%"
    return f"{share:.2f}%" if share < 10 else f"{share:.1f}%"


def label_text(key: Any) -> str:
    """``rows_truncated`` -> ``Rows truncated`` for summary keys."""
    text = str(key).replace("_", " ").strip()
    return text[:1].upper() + text[1:] if text else text


def clip(text: str, limit: int) -> tuple[str, int]:
    """Cut ``text`` to ``limit`` characters; return (text, characters removed)."""
    if len(text) <= limit:
        return text, 0
    return text[:limit], len(text) - limit


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        plain = value and not re.search(r"[:#\[\]{},&*!|>'\"%@`\n]|^\s|\s$|^[-?]", value)
        return value if plain and value.lower() not in ("true", "false", "null", "yes", "no") else json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, default=str)


def yamlish(value: Any, indent: int = 0) -> str:
    """Config as YAML-like text (the form users write configs in); scalars are JSON-quoted
    when needed, so the text is unambiguous. Display only - never parsed back."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}"
        lines = []
        for k, v in value.items():
            key = _scalar(str(k))
            flow = isinstance(v, list) and all(not isinstance(x, dict | list) for x in v)
            if isinstance(v, dict | list) and v and not flow:
                lines.append(f"{pad}{key}:")
                lines.append(yamlish(v, indent + 1))
            else:
                lines.append(f"{pad}{key}: {yamlish(v, 0).strip()}")
        return "\n".join(lines)
    if isinstance(value, list):
        if not value:
            return pad + "[]"
        if all(not isinstance(v, dict | list) for v in value):  # flow style: one line for scalars
            return pad + "[" + ", ".join(_scalar(v) for v in value) + "]"
        lines = []
        for v in value:
            if isinstance(v, dict | list) and v:
                inner = yamlish(v, indent + 1).lstrip()
                lines.append(f"{pad}- {inner}")
            else:
                lines.append(f"{pad}- {yamlish(v, 0).strip()}")
        return "\n".join(lines)
    return pad + _scalar(value)


def row_anchor(row_id: object) -> str:
    """The audit page's anchor for a row id (``row-`` + the id with every character outside
    [A-Za-z0-9_-] written as ``.<hex>.``): the same on the audit and on the training page
    that links to it, safe as an HTML id and as a URL fragment without encoding."""
    text = str(row_id)
    return "row-" + "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else f".{ord(c):x}." for c in text)
