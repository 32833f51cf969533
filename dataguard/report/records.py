"""One rejected row as HTML: the conversation with roles, label, meta and score columns.

Every piece of dataset text passes through ``esc``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dataguard.report.fmt import esc, is_number, num

ROLE_CLASSES = {"system", "user", "assistant", "tool"}


_RAW_KEY = re.compile(r"(hash|(^|_)id|seed|sha)", re.I)


def _kv(pairs: dict[str, Any], detail: str = "") -> str:
    """Score columns as a compact multi-column key/value grid; keys named in the reject
    detail are emphasised (they are why the row was rejected); hashes and ids stay raw."""
    items = []
    for k, v in pairs.items():
        if isinstance(v, list | dict):
            val = json.dumps(v, ensure_ascii=False)
        elif is_number(v) and not _RAW_KEY.search(str(k)):
            val = num(v)
        else:
            val = "—" if v is None else str(v)
        hot = ' class="hot"' if detail and str(k) in detail.replace(" ", "_") else ""
        items.append(f'<div class="k"><span{hot}>{esc(k)}</span></div><div class="v">{esc(val)}</div>')
    cls = "kv wide" if len(items) > 8 else "kv"
    return f'<div class="{cls}">{"".join(items)}</div>' if items else ""


def _cut(n: int) -> str:
    return f'<span class="cut"> … [{n:,} more characters]</span>' if n else ""


def render_record(rec: dict[str, Any], detail: str = "") -> str:
    """A rejected row's record: the conversation with roles, label, meta and scores."""
    kind = rec.get("kind")
    if kind == "raw":
        return (f'<div class="small muted">Raw input (could not be parsed as JSON)</div>'
                f'<pre>{esc(rec.get("text", ""))}{_cut(rec.get("cut", 0))}</pre>')
    if kind == "json":
        return f'<pre>{esc(rec.get("text", ""))}{_cut(rec.get("cut", 0))}</pre>'
    parts = []
    for m in rec.get("messages") or []:
        role = str(m.get("role"))
        klass = role if role in ROLE_CLASSES else "other"
        parts.append(f'<div class="msg {klass}"><div class="role">{esc(role)}</div>'
                     f'<div class="content">{esc(m.get("content", ""))}{_cut(m.get("cut", 0))}</div></div>')
    if not parts:
        parts.append('<div class="muted small">No messages.</div>')
    if rec.get("label") is not None:
        parts.insert(0, f'<div class="small">Label: <span class="badge">{esc(rec["label"])}</span></div>')
    if rec.get("scores"):
        parts.append(_kv(rec["scores"], detail))
    if rec.get("meta"):
        parts.append(f'<details><summary class="small">meta</summary><pre>{esc(rec["meta"])}{_cut(rec.get("meta_cut", 0))}'
                     f"</pre></details>")
    return "".join(parts)


def snippet(rec: dict[str, Any]) -> str:
    """The first user turn (or the raw text) on one line, for a sample's summary line."""
    if rec.get("kind") == "row":
        msgs = rec.get("messages") or []
        m = next((m for m in msgs if m.get("role") == "user"), msgs[0] if msgs else None)
        text = (m or {}).get("content", "")
    else:
        text = rec.get("text", "")
    return " ".join(str(text).split())[:200]
