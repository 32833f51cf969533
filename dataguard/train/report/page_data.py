"""Read a training run folder into one plain model for the training report (report.py).

Every file is optional and read tolerantly: a missing file becomes a note on the page, a
malformed JSONL line is counted and skipped, and values of the wrong type are ignored. No
torch import: the report can be rebuilt anywhere the run folder can be read.

Files read (all under the run folder unless said otherwise): ``metrics.jsonl`` (per-step
records, optional monitor fields), ``events.jsonl``, ``histograms.jsonl``,
``diagnosis.json``, ``run.json``, ``best.json``, ``checkpoints/step-*/`` and, through the
run config's ``data``, the pipeline's ``manifest.json`` and its audit page.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from dataguard.report.fmt import is_number
from dataguard.train.report.rows import dynamics_summary

EVENT_KINDS = ("anomaly", "skip", "rollback", "stop", "fault", "checkpoint", "recovered")
_STEP_DIR = re.compile(r"^step-(\d+)(\.tmp-.*)?$")
MAX_JSONL_BYTES = 256 << 20  # a report never reads more than this much of one JSONL file


class ReportInputError(ValueError):
    """The folder is not a training run (no metrics.jsonl, run.json or checkpoints)."""


def _finite(v: Any) -> bool:
    return is_number(v) and math.isfinite(float(v))


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of ``path`` in file order, and the count of lines that were not one."""
    if not path.is_file():
        return [], 0
    out: list[dict[str, Any]] = []
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read(MAX_JSONL_BYTES)
    lines = text.splitlines()
    if len(text) == MAX_JSONL_BYTES and lines:  # cut mid-line: the last line is partial
        lines.pop()
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(obj, dict):
            out.append(obj)
        else:
            bad += 1
    return out, bad


def read_json(path: Path) -> tuple[Any, str | None]:
    """(value, None), or (None, why) for a missing or unreadable file."""
    if not path.is_file():
        return None, "missing"
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace")), None
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({type(exc).__name__}: {exc})"


def _step(rec: dict[str, Any]) -> int | None:
    s = rec.get("step")
    return int(s) if is_number(s) and math.isfinite(float(s)) else None


def _float_map(value: Any) -> dict[str, float]:
    """{name: float} from a dict, dropping non-numeric values; NaN / inf are kept."""
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if is_number(v)}


def _metrics(run_dir: Path, notes: list[str]) -> dict[str, Any]:
    records, bad = read_jsonl(run_dir / "metrics.jsonl")
    if not (run_dir / "metrics.jsonl").is_file():
        notes.append("No metrics.jsonl: the run logged no step yet, so there are no curves.")
    if bad:
        notes.append(f"metrics.jsonl: {bad} line(s) were not JSON objects and were skipped.")
    train: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    superseded = 0
    for rec in records:
        step = _step(rec)
        if step is None:
            continue
        if "loss" in rec or "grad_norm" in rec or "lr" in rec:
            if step in train:
                superseded += 1  # a step logged again after a rollback or resume: the last one stands
            train[step] = rec
        if any(str(k).startswith("eval_") for k in rec):
            evals[step] = rec
    if superseded:
        notes.append(f"metrics.jsonl: {superseded} step record(s) were logged again later (a rollback or a "
                     "resume re-ran those steps); the curves show the last record of each step.")
    return {"train": [train[s] for s in sorted(train)], "eval": [evals[s] for s in sorted(evals)],
            "superseded": superseded}


def _series(train: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in train if is_number(r.get(key))]


def _layer_matrix(train: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """{steps, layers, values[layer][k]} from per-step {layer: value} maps, or None."""
    rows = [(int(r["step"]), _float_map(r.get(key))) for r in train if isinstance(r.get(key), dict)]
    rows = [(s, m) for s, m in rows if m]
    if not rows:
        return None
    layers: list[str] = []
    seen: set[str] = set()
    for _, m in rows:
        for name in m:
            if name not in seen:
                seen.add(name)
                layers.append(name)
    values = [[m.get(name) for _, m in rows] for name in layers]
    return {"steps": [s for s, _ in rows], "layers": layers, "values": values}


def _events(run_dir: Path, train: list[dict[str, Any]], notes: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """Events sorted by step; from events.jsonl or, without it, derived from skipped steps."""
    path = run_dir / "events.jsonl"
    records, bad = read_jsonl(path)
    if bad:
        notes.append(f"events.jsonl: {bad} line(s) were not JSON objects and were skipped.")
    if path.is_file():
        events = []
        for rec in records:
            ev = dict(rec)
            ev["step"] = _step(rec)
            ev["kind"] = str(rec.get("kind") or "event")
            events.append(ev)
        events.sort(key=lambda e: (e["step"] is None, e["step"] or 0))
        return events, True
    derived = [{"step": int(r["step"]), "kind": "skip", "cause": "skipped step (from metrics.jsonl)"}
               for r in train if r.get("skipped") is True]
    notes.append("No events.jsonl (a run from before the stability guard): event markers are derived from "
                 "metrics.jsonl" + (f" ({len(derived)} skipped step(s))." if derived else
                                    "; no step was skipped."))
    return derived, False


def _histograms(run_dir: Path, notes: list[str]) -> dict[str, Any] | None:
    records, bad = read_jsonl(run_dir / "histograms.jsonl")
    if bad:
        notes.append(f"histograms.jsonl: {bad} line(s) were not JSON objects and were skipped.")
    best: dict[str, Any] | None = None
    for rec in records:
        step = _step(rec)
        layers = rec.get("layers")
        if step is None or not isinstance(layers, dict):
            continue
        if best is None or step >= best["step"]:
            best = {"step": step, "layers": layers, "x_label": rec.get("x_label")}
    if best is None:
        return None
    clean: dict[str, dict[str, list[float]]] = {}
    for name, h in best["layers"].items():
        if not isinstance(h, dict):
            continue
        edges, counts = h.get("edges"), h.get("counts")
        if not (isinstance(edges, list) and isinstance(counts, list)):
            continue
        if len(edges) < 2 or not all(_finite(e) for e in edges) or not all(_finite(c) for c in counts):
            continue
        clean[str(name)] = {"edges": [float(e) for e in edges], "counts": [float(c) for c in counts]}
    x_label = best["x_label"] if isinstance(best["x_label"], str) else "log10 |grad|"  # what monitor.py bins
    return {"step": best["step"], "layers": clean, "snapshots": len(records), "x_label": x_label}


def _dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _checkpoints(run_dir: Path, best: Any) -> list[dict[str, Any]]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    best_name = Path(str(best.get("checkpoint"))).name if isinstance(best, dict) and best.get("checkpoint") else None
    out = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if not m or not child.is_dir():
            continue
        state, _ = read_json(child / "state.json")
        out.append({"name": child.name, "step": int(m.group(1)), "bytes": _dir_size(child),
                    "complete": (child / "COMPLETE").is_file() and not m.group(2),
                    "best": child.name == best_name,
                    "has_weights": any((child / w).is_file() for w in ("model.safetensors", "adapter_model.safetensors")),
                    "state_step": state.get("step") if isinstance(state, dict) else None})
    out.sort(key=lambda c: (c["step"], c["name"]))
    return out


def _find_data(run_dir: Path, data: Any) -> Path | None:
    """The pipeline output the run trained on: ``data`` as given (relative to the working
    directory at training time, which we do not know), else relative to the run folder's
    ancestors."""
    if not isinstance(data, str) or not data:
        return None
    p = Path(data)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, *(a / p for a in run_dir.resolve().parents)]
    return next((c for c in candidates if (c / "manifest.json").is_file()), None)


def _audit(run_dir: Path, config: dict[str, Any], notes: list[str]) -> dict[str, Any] | None:
    data = config.get("data")
    if not data:
        return None
    folder = _find_data(run_dir, data)
    if folder is None:
        notes.append(f"The data folder {data!s} (config `data`) has no readable manifest.json from here; "
                     "the data audit summary is left out.")
        return {"data": str(data), "found": False}
    manifest, err = read_json(folder / "manifest.json")
    if not isinstance(manifest, dict):
        notes.append(f"{folder / 'manifest.json'}: {err or 'not a JSON object'}.")
        return {"data": str(data), "found": False}
    counts = manifest.get("counts") if isinstance(manifest.get("counts"), dict) else {}
    reasons = []
    stages = manifest.get("stages") if isinstance(manifest.get("stages"), list) else []
    for s in stages:
        if not isinstance(s, dict):
            continue
        for reason, n in (s.get("reasons") or {}).items() if isinstance(s.get("reasons"), dict) else ():
            reasons.append({"stage": str(s.get("name")), "reason": str(reason), "count": n if is_number(n) else None})
    reasons.sort(key=lambda r: -(r["count"] or 0))
    audits = [folder / "audit.html"]
    cfg = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    if isinstance(cfg.get("report"), str) and cfg["report"]:
        rp = Path(cfg["report"])
        audits += [rp] if rp.is_absolute() else [Path.cwd() / rp, *(a / rp for a in folder.resolve().parents)]
    audit_html = next((a for a in audits if a.is_file()), None)
    return {"data": str(data), "found": True, "folder": str(folder), "counts": counts, "reasons": reasons,
            "stages": [{"name": str(s.get("name")), "rows_in": s.get("rows_in"), "rows_kept": s.get("rows_kept"),
                        "rows_rejected": s.get("rows_rejected")} for s in stages if isinstance(s, dict)],
            "audit_html": str(audit_html.resolve()) if audit_html else None,
            "dataguard_version": manifest.get("dataguard_version")}


def collect(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The report model of one run folder (plain JSON-able data)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportInputError(f"{run_dir}: no such folder")
    if not any((run_dir / n).exists() for n in ("metrics.jsonl", "run.json", "checkpoints")):
        raise ReportInputError(f"{run_dir}: not a training run folder (no metrics.jsonl, run.json or checkpoints/)")
    notes: list[str] = []
    run, err = read_json(run_dir / "run.json")
    if not isinstance(run, dict):
        notes.append(f"run.json is {err or 'not a JSON object'}: no config or totals.")
        run = {}
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    best, _ = read_json(run_dir / "best.json")
    best = best if isinstance(best, dict) else None
    diagnosis, derr = read_json(run_dir / "diagnosis.json")
    if derr and derr != "missing":
        notes.append(f"diagnosis.json is {derr}.")
    metrics = _metrics(run_dir, notes)
    train = metrics["train"]
    events, have_events = _events(run_dir, train, notes)
    layer_norms = _layer_matrix(train, "layer_grad_norms")
    update_ratios = _layer_matrix(train, "update_ratios")
    std_ratios = _layer_matrix(train, "grad_std_ratio")
    if layer_norms is None:
        notes.append("No per-layer gradient norms in metrics.jsonl (monitor off or a run from before it): "
                     "the heat map is left out.")
    hist = _histograms(run_dir, notes)
    lr_groups: dict[str, list[tuple[int, float]]] = {}
    for r in train:
        for kind, lr in _float_map(r.get("lr_groups")).items():
            lr_groups.setdefault(kind, []).append((int(r["step"]), lr))
    counts = {k: sum(1 for e in events if e["kind"] == k) for k in EVENT_KINDS}
    last_step = train[-1]["step"] if train else None
    total = run.get("total_steps") if is_number(run.get("total_steps")) else None
    stopped = bool(diagnosis) or counts["stop"] > 0
    if stopped:
        status = "stopped"
    elif total is not None and last_step is not None and last_step >= total:
        status = "worse_than_best" if run.get("final_warning") else "completed"
    else:
        status = "incomplete"
    return {
        "run_dir": str(run_dir), "status": status, "notes": notes, "run": run, "config": config, "best": best,
        "diagnosis": diagnosis, "train": train, "eval": metrics["eval"], "events": events,
        "have_events": have_events, "event_counts": counts, "last_step": last_step, "total_steps": total,
        "series": {k: _series(train, k) for k in ("loss", "lr", "grad_norm", "amp_scale", "tokens_per_s",
                                                  "n_big_grads", "n_big_weights")},
        "eval_series": {k: [(int(r["step"]), float(r[k])) for r in metrics["eval"] if is_number(r.get(k))]
                        for k in sorted({k for r in metrics["eval"] for k in r if str(k).startswith("eval_")})},
        "lr_groups": lr_groups, "layer_norms": layer_norms, "update_ratios": update_ratios,
        "grad_std_ratio": std_ratios, "histograms": hist, "checkpoints": _checkpoints(run_dir, best),
        "audit": _audit(run_dir, config, notes),
        "skipped_steps": sum(1 for r in train if r.get("skipped") is True),
        "nonfinite_steps": [int(r["step"]) for r in train if is_number(r.get("loss")) and not _finite(r["loss"])],
        "tensorboard": (run_dir / "tensorboard").is_dir(),
        "dynamics": dynamics_summary(run_dir),
    }
