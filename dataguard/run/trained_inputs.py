"""Refuse a training run that read other files of the same names as this pipeline run's inputs.

Row ids are ``input name:position``. A run trained on another file of the same name (an edited
or replaced ``bank.csv``) matches this run's rows by id, so a noise stage's ``dynamics: RUN``
would judge, and ``exclude: {runs: [RUN]}`` would drop, rows it never saw. A classify run's
dynamics also record each row's label (`dataguard.stages.noise.dynamics`), but an sft run's
losses and a guard's quarantined ids carry nothing to compare. So the runner records the names
and sha256 of the inputs its shards came from (``run.json`` ``inputs``, from their manifest),
and the pipeline compares them with its own inputs before any stage runs.

A run from before ``inputs`` was recorded is compared through the manifest of the shards it
names (``config.data``), when that folder is still there; otherwise it cannot be checked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def input_identity(info: dict[str, Any]) -> str | None:
    """A manifest input entry's content identity: its sha256 (a file or folder) or the
    dataset fingerprint (an in-memory dataset); None when it has neither."""
    value = info.get("sha256") or info.get("fingerprint")
    return str(value) if value else None


def recorded_inputs(manifest: dict[str, Any]) -> list[dict[str, str]]:
    """What ``run.json`` records of a manifest's inputs: name and identity of each."""
    out = []
    for info in manifest.get("inputs") or []:
        if isinstance(info, dict) and info.get("name") and input_identity(info):
            out.append({"name": str(info["name"]), "sha256": str(input_identity(info))})
    return out


def trained_inputs(run: str | Path) -> dict[str, str] | None:
    """Input name -> identity of the files a training run's shards came from (``run`` is its
    folder or a file in it); None when the run says nothing readable about them."""
    folder = Path(run)
    if folder.is_file():
        folder = folder.parent
    try:
        summary = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        listed = summary.get("inputs")
        if listed is None:  # a run from before they were recorded: its shards' manifest
            data = Path(str((summary.get("config") or {}).get("data")))
            listed = recorded_inputs(json.loads((data / "manifest.json").read_text(encoding="utf-8")))
        return {str(e["name"]): str(e["sha256"]) for e in listed}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def other_files(run: str | Path, input_info: Sequence[dict[str, Any]]) -> list[str]:
    """The names of this pipeline run's inputs that ``run`` trained on under the same name
    but with other content."""
    trained = trained_inputs(run) or {}
    return [str(info["name"]) for info in input_info
            if str(info.get("name")) in trained and input_identity(info) not in (None, trained[str(info["name"])])]


def check_runs_read(steps: Sequence[Any], input_info: Sequence[dict[str, Any]]) -> str | None:
    """The first refusal (``stage NAME: ...``) among the training runs the ``steps`` read
    (`Stage.runs_read`), or None."""
    for step in steps:
        for run in step.runs_read():
            names = other_files(run, input_info)
            if names:
                return (f"stage {step.name}: the training run {run} trained on another file named "
                        f"{', '.join(names)} (its sha256 differs from this run's input); row ids are "
                        "name:position, so it would name other rows: train it again on these inputs")
    return None
