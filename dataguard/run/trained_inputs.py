"""Refuse a training run that read other files of the same names as this pipeline run's inputs.

Row ids are ``input name:position``. A run trained on another file of the same name (an edited
or replaced ``bank.csv``) matches this run's rows by id, so a noise stage's ``dynamics: RUN``
would judge, and ``exclude: {runs: [RUN]}`` would drop, rows it never saw. A classify run's
dynamics also record each row's label (`dataguard.stages.noise.dynamics`), but an sft run's
losses and a guard's quarantined ids carry nothing to compare. So the runner records the names
and sha256 of the inputs its shards came from (``run.json`` ``inputs``, from their manifest),
and the pipeline compares them with its own inputs before any stage runs.

What is refused is a file that changed since the run trained on it: replaced by another of
the same name, or edited in place (a fixed typo, appended rows: positions may have moved). A
classify run whose dynamics record each row's label is not refused here: the noise stage
compares labels row by row, so a hand-relabelled input keeps working. An in-memory dataset
has no sha256 (its `datasets` fingerprint is not a hash of its content), so it is not
compared. A run from before ``inputs`` was recorded is compared through the manifest of the
shards it names (``config.data``) only while that manifest is still the one its newest
checkpoint trained on; otherwise it cannot be checked, and is not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def recorded_inputs(manifest: dict[str, Any]) -> list[dict[str, str]]:
    """What ``run.json`` records of a manifest's inputs: the name and sha256 of each file or
    folder input (in-memory datasets have none)."""
    return [{"name": str(info["name"]), "sha256": str(info["sha256"])} for info in manifest.get("inputs") or []
            if isinstance(info, dict) and info.get("name") and info.get("sha256")]


def trained_inputs(run: str | Path) -> dict[str, str] | None:
    """Input name -> identity of the files a training run's shards came from (``run`` is its
    folder or a file in it); None when the run says nothing readable about them."""
    folder = Path(run)
    if folder.is_file():
        folder = folder.parent
    try:
        summary = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        listed = summary.get("inputs")
        if listed is None:  # a run from before they were recorded: its shards' manifest, if still theirs
            data = Path(str((summary.get("config") or {}).get("data")))
            manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))
            if not _trained_on(folder, manifest):
                return None
            listed = recorded_inputs(manifest)
        return {str(e["name"]): str(e["sha256"]) for e in listed}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _trained_on(run: Path, manifest: dict[str, Any]) -> bool:
    """Whether ``manifest`` is what the run's newest complete checkpoint recorded training on
    (only runs from before ``inputs`` was recorded come here, so the runner's checkpoint
    module, and torch with it, is imported on this path alone)."""
    from dataguard.train.checkpoint import latest_checkpoint
    from dataguard.train.data.shards import data_changed

    newest = latest_checkpoint(run)
    if newest is None:
        return False
    return data_changed(json.loads((newest / "state.json").read_text(encoding="utf-8")), manifest) is False


def other_files(run: str | Path, input_info: Sequence[dict[str, Any]]) -> list[str]:
    """The names of this pipeline run's inputs that ``run`` trained on under the same name
    but with other content."""
    trained = trained_inputs(run) or {}
    return [str(info["name"]) for info in input_info
            if str(info.get("name")) in trained and info.get("sha256") and info["sha256"] != trained[str(info["name"])]]


def check_runs_read(steps: Sequence[Any], input_info: Sequence[dict[str, Any]]) -> str | None:
    """The first refusal (``stage NAME: ...``) among the training runs the ``steps`` read
    (`Stage.runs_read`), or None."""
    for step in steps:
        for run in step.runs_read():
            names = other_files(run, input_info)
            if names:
                return (f"stage {step.name}: the training run {run} trained on another version of "
                        f"{', '.join(names)} (its sha256 differs: replaced or edited since); row ids are "
                        "name:position, so its verdicts may name other rows: train it again on these inputs")
    return None
