"""Collect the report's statistics from a pipeline output folder, with bounded reads.

The model built here is what the HTML page renders and what the JSON beside it holds.
It embeds distributions (from the manifest) and *samples* of rows, never all rows: the
rejected shards are streamed batch by batch and reading stops as soon as every reject
reason has its quota of examples, so a 1M-row run costs about as much as a 1k-row one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import safe_text
from dataguard.report.fmt import clip
from dataguard.run.manifest import Manifest, StageEntry

MODEL_VERSION = 1
SAMPLES_PER_REASON = 12
PREVIEW_ROWS = 8
MAX_MESSAGE_CHARS = 1500
MAX_RAW_CHARS = 3000
MAX_FIELD_CHARS = 600
MAX_SAMPLES_TOTAL = 600  # with many reasons, fewer samples each (at least 3) keep the page small
MAX_PARSE_CHARS = 2_000_000  # a record bigger than this is shown as clipped raw text, never parsed


class ReportInputError(ValueError):
    """The output folder lacks what a report needs (e.g. manifest.json)."""


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.arrow")) if folder.is_dir() else []


def _clip_value(value: Any) -> Any:
    """Bound a score/meta value so one huge field cannot bloat the page."""
    if isinstance(value, str):
        text, cut = clip(value, MAX_FIELD_CHARS)
        return text + (f" … [{cut:,} more characters]" if cut else "")
    if isinstance(value, list | dict):
        text = json.dumps(value, ensure_ascii=False)
        if len(text) > MAX_FIELD_CHARS:
            return text[:MAX_FIELD_CHARS] + f" … [{len(text) - MAX_FIELD_CHARS:,} more characters]"
    return value


def parse_record(raw: str | None) -> dict[str, Any]:
    """Turn a rejected row's ``record`` text into a display-ready, size-bounded structure.

    A canonical row becomes ``{"kind": "row", messages, label, meta, scores}``; any other
    JSON becomes ``{"kind": "json", "text": pretty}``; unparsable input stays raw text.
    Every string is written UTF-8-safe: a record rejected as ``invalid_unicode`` holds a
    ``\\ud800`` escape that ``json.loads`` turns into a lone surrogate, which no page can hold.
    """
    return _utf8_safe(_parse_record(raw))


def _utf8_safe(value: Any) -> Any:
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {_utf8_safe(k): _utf8_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8_safe(v) for v in value]
    return value


def _parse_record(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {"kind": "raw", "text": "", "cut": 0}
    if len(raw) > MAX_PARSE_CHARS:
        text, cut = clip(raw, MAX_RAW_CHARS)
        return {"kind": "raw", "text": text, "cut": cut}
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        text, cut = clip(raw, MAX_RAW_CHARS)
        return {"kind": "raw", "text": text, "cut": cut}
    if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
        messages = []
        for m in obj["messages"]:
            if not isinstance(m, dict):
                messages.append({"role": "?", "content": str(m)[:MAX_MESSAGE_CHARS], "cut": 0})
                continue
            content = m.get("content")
            content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            text, cut = clip(content, MAX_MESSAGE_CHARS)
            messages.append({"role": str(m.get("role")), "content": text, "cut": cut})
        meta = obj.get("meta")
        if isinstance(meta, str):
            try:
                meta = json.loads(meta)
            except ValueError:
                pass
        if meta is not None:
            pretty = json.dumps(meta, ensure_ascii=False, indent=2, sort_keys=True) if not isinstance(meta, str) else meta
            meta_text, meta_cut = clip(pretty, MAX_RAW_CHARS)
        else:
            meta_text, meta_cut = None, 0
        skip = {"id", "source", "messages", "label", "meta"}
        scores = {k: _clip_value(v) for k, v in obj.items() if k not in skip}
        return {"kind": "row", "messages": messages, "label": obj.get("label"), "meta": meta_text,
                "meta_cut": meta_cut, "scores": scores}
    pretty = json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True)
    text, cut = clip(pretty, MAX_RAW_CHARS)
    return {"kind": "json", "text": text, "cut": cut}


def _expected_keys(stages: Iterable[StageEntry]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for st in stages:
        for reason, count in (st.get("reasons") or {}).items():
            key = (str(st.get("name")), str(reason))
            out[key] = out.get(key, 0) + (int(count) if isinstance(count, int | float) else 0)
    return out


def sample_rejected(folder: Path, expected: dict[tuple[str, str], int],
                    per_reason: int = SAMPLES_PER_REASON) -> tuple[dict[tuple[str, str], list[dict]], int, bool]:
    """Up to ``per_reason`` rejected rows per (stage, reason), read lazily from stream shards.

    Returns (samples, rows scanned, complete) where ``complete`` says every shard was read.
    Stops early once each expected reason has min(per_reason, its count) samples.
    """
    samples: dict[tuple[str, str], list[dict]] = {}
    need = {k: min(per_reason, v) for k, v in expected.items() if v > 0}
    scanned = 0

    def satisfied() -> bool:
        return bool(need) and all(len(samples.get(k, ())) >= n for k, n in need.items())

    for path in _shards(folder):
        with pa.memory_map(str(path), "r") as source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                batches: Iterable[pa.RecordBatch] = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                batches = reader
            for batch in batches:
                scanned += batch.num_rows
                if batch.num_rows == 0:
                    continue
                _take_samples(batch, samples, per_reason)
                if satisfied():
                    return samples, scanned, False
    return samples, scanned, True


def _take_samples(batch: pa.RecordBatch, samples: dict[tuple[str, str], list[dict]], per_reason: int) -> None:
    """Vectorised pick of the first rows of each (stage, reason) still short of samples."""
    empty = pa.scalar("", pa.string())
    stage = pc.coalesce(batch.column("stage"), empty)  # not fill_null: it imports pandas (~1 s)
    reason = pc.coalesce(batch.column("reason"), empty)
    keys = pc.binary_join_element_wise(stage, reason, "\x1f").dictionary_encode()
    codes = keys.indices.to_numpy(zero_copy_only=False)
    wanted: list[int] = []
    for code, key_text in enumerate(keys.dictionary.to_pylist()):
        st, _, rs = key_text.partition("\x1f")
        have = len(samples.get((st, rs), ()))
        if have >= per_reason:
            continue
        wanted.extend(np.flatnonzero(codes == code)[: per_reason - have].tolist())
    if not wanted:
        return
    rows = batch.take(pa.array(sorted(wanted), pa.int64())).to_pylist()
    for row in rows:
        key = (row.get("stage") or "", row.get("reason") or "")
        detail, _ = clip(row.get("detail") or "", MAX_FIELD_CHARS)
        samples.setdefault(key, []).append({
            "id": row.get("id"), "source": row.get("source"), "detail": detail,
            "record": parse_record(row.get("record")),
        })


def preview_kept(folder: Path, n: int = PREVIEW_ROWS) -> dict[str, Any] | None:
    """The first ``n`` kept rows (first batch of the first shard only)."""
    for path in _shards(folder):
        with pa.memory_map(str(path), "r") as source:
            try:
                reader = pa.ipc.open_stream(source)
                batch = next(iter(reader), None)
            except pa.ArrowInvalid:
                freader = pa.ipc.open_file(source)
                batch = freader.get_batch(0) if freader.num_record_batches else None
            if batch is None or batch.num_rows == 0:
                continue
            rows = batch.slice(0, n).to_pylist()
            columns = [c for c in batch.schema.names if c not in ("messages", "meta")]
            out_rows = []
            for r in rows:
                msgs = r.get("messages") or []
                first_user = next((m.get("content") for m in msgs if m and m.get("role") == "user"), "") or ""
                last_asst = next((m.get("content") for m in reversed(msgs) if m and m.get("role") == "assistant"), "") or ""
                out_rows.append({
                    "values": {c: _clip_value(r.get(c)) for c in columns},
                    "prompt": clip(first_user, 240)[0], "response": clip(last_asst, 240)[0],
                    "turns": len(msgs),
                })
            return {"shard": path.name, "columns": columns, "rows": out_rows}
    return None


def _checks(manifest: Manifest, out_dir: Path) -> list[dict[str, Any]]:
    """The nothing-lost checks, each with a verdict and the numbers behind it."""
    counts = manifest.get("counts") or {}
    rin, rk, rr = counts.get("rows_in"), counts.get("rows_kept"), counts.get("rows_rejected")
    checks: list[dict[str, Any]] = []

    def add(name: str, ok: bool | None, detail: str, key: bool = True) -> None:
        checks.append({"name": name, "ok": ok, "detail": detail, "key": key})

    if all(isinstance(v, int) for v in (rin, rk, rr)):
        add("rows in = kept + rejected", rin == rk + rr, f"{rin:,} = {rk:,} + {rr:,}" if rin == rk + rr
            else f"{rin:,} ≠ {rk:,} + {rr:,} (difference {rin - rk - rr:+,})")
    else:
        add("rows in = kept + rejected", None, "counts missing from manifest")
    if "balanced" in counts:
        add("manifest says balanced", bool(counts["balanced"]), str(bool(counts["balanced"])).lower(), key=False)
    inputs = manifest.get("inputs") or []
    in_rows = [i.get("rows") for i in inputs]
    if inputs and all(isinstance(v, int) for v in in_rows) and isinstance(rin, int):
        s = sum(in_rows)
        add("input files' rows = rows in", s == rin, f"{s:,} read from {len(inputs)} file(s)")
    outputs = manifest.get("outputs") or {}
    for kind, expect, label in (("data", rk, "kept"), ("rejected", rr, "rejected")):
        files = outputs.get(kind)
        if files is None or not isinstance(expect, int):
            continue
        s = sum(int(f.get("rows") or 0) for f in files)
        add(f"{label} shards hold the {label} rows", s == expect, f"{s:,} rows in {len(files)} shard(s)")
    stages = manifest.get("stages") or []
    bad = [s.get("name") for s in stages
           if all(isinstance(s.get(k), int) for k in ("rows_in", "rows_kept", "rows_rejected"))
           and s["rows_in"] != s["rows_kept"] + s["rows_rejected"]]
    if stages:
        add("every stage: in = kept + rejected", not bad, "all stages balance" if not bad else "unbalanced: " + ", ".join(map(str, bad)))
        chain = [f"{a.get('name')}→{b.get('name')}" for a, b in zip(stages, stages[1:], strict=False)
                 if isinstance(a.get("rows_kept"), int) and isinstance(b.get("rows_in"), int)
                 and a["rows_kept"] != b["rows_in"]]
        add("each stage starts with the rows the previous kept", not chain,
            "stages chain without gaps" if not chain else "gap at " + ", ".join(chain), key=False)
        srej = sum(int(s.get("rows_rejected") or 0) for s in stages)
        if isinstance(rr, int) and srej != rr:
            add("stage rejects add up to rows rejected", False, f"{srej:,} by stages vs {rr:,} in total", key=False)
    missing = []
    for kind in ("data", "rejected"):
        for f in outputs.get(kind) or []:
            p = out_dir / str(f.get("path", ""))
            if not p.is_file() or (isinstance(f.get("bytes"), int) and p.stat().st_size != f["bytes"]):
                missing.append(str(f.get("path")))
    if outputs:
        add("output files present with recorded sizes", not missing,
            "all present" if not missing else f"{len(missing)} missing or changed: " + ", ".join(missing[:5]),
            key=False)
    return checks


def collect(output_dir: str | Path, per_reason: int = SAMPLES_PER_REASON) -> dict[str, Any]:
    """Build the report model (plain JSON data) from a pipeline output folder."""
    out_dir = Path(output_dir)
    mpath = out_dir / "manifest.json"
    if not mpath.is_file():
        raise ReportInputError(f"no manifest.json in {out_dir}: is this a dataguard output folder?")
    # The schema the pipeline writes (dataguard.run.manifest); read with .get throughout, since a
    # manifest from an older dataguard or edited by hand may lack keys.
    manifest: Manifest = _read_json(mpath)
    run = _read_json(out_dir / "run.json") if (out_dir / "run.json").is_file() else {}
    stages: list[StageEntry] = [s for s in (manifest.get("stages") or []) if isinstance(s, dict)]
    stage_seconds = run.get("stage_seconds") or {}
    counts = manifest.get("counts") or {}
    rows_in = counts.get("rows_in")

    expected = _expected_keys(stages)
    per_reason = min(per_reason, max(3, MAX_SAMPLES_TOTAL // max(1, len(expected))))
    samples, scanned, complete = sample_rejected(out_dir / "rejected", expected, per_reason)
    reasons = []
    for (st, rs), count in expected.items():
        reasons.append({"stage": st, "reason": rs, "count": count, "samples": samples.pop((st, rs), [])})
    for (st, rs), rows in samples.items():  # reasons present in shards but not in the manifest
        reasons.append({"stage": st, "reason": rs, "count": None, "samples": rows})
    reasons.sort(key=lambda r: (-(r["count"] or 0), r["stage"], r["reason"]))

    stage_models = []
    for s in stages:
        desc = s.get("description") if isinstance(s.get("description"), dict) else {}
        stage_models.append({
            "name": s.get("name"),
            "title": desc.get("title") or s.get("name"),
            "rows_in": s.get("rows_in"), "rows_kept": s.get("rows_kept"), "rows_rejected": s.get("rows_rejected"),
            "seconds": s.get("seconds", stage_seconds.get(str(s.get("key")), stage_seconds.get(str(s.get("name"))))),
            "reasons": s.get("reasons") or {},
            "summary": desc.get("summary") if isinstance(desc.get("summary"), dict) else {},
            "blocks": [b for b in (desc.get("blocks") or []) if isinstance(b, dict)],
        })
        if isinstance(desc.get("pairs"), dict):  # a stage's preference-pair balance (preference runs)
            stage_models[-1]["pairs"] = desc["pairs"]

    checks = _checks(manifest, out_dir)
    key_checks = [c for c in checks if c["key"]]
    verdict = None if not key_checks or any(c["ok"] is None for c in key_checks) else all(c["ok"] for c in key_checks)
    return {
        "report_version": MODEL_VERSION,
        "output_dir": str(out_dir),
        "dataguard_version": manifest.get("dataguard_version"),
        "counts": {"rows_in": rows_in, "rows_kept": counts.get("rows_kept"),
                   "rows_rejected": counts.get("rows_rejected"), "balanced": counts.get("balanced")},
        "nothing_lost": verdict,
        "checks": checks,
        "run": {k: run.get(k) for k in ("started", "finished", "seconds") if k in run},
        "inputs": manifest.get("inputs") or [],
        "outputs": manifest.get("outputs") or {},
        "config": manifest.get("config"),
        "packages": manifest.get("packages") or {},
        "stages": stage_models,
        "reasons": reasons,
        "rejected_scan": {"rows_read": scanned, "complete": complete, "per_reason": per_reason},
        "kept_preview": preview_kept(out_dir / "data"),
        "training": manifest.get("training"),
    }
