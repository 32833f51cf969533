"""The output folder: a user's files survive every run mode; one run at a time; no stale manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dataguard.io.output import MARKER, OutputFolder
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline, PipelineError
from dataguard.stage import Stage
from dataguard.stages.dedup import DedupStage

REPO = Path(__file__).resolve().parent.parent


def _jsonl(path: Path, n: int = 30, tag: str = "row") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"instruction": f"{tag} question {i}?", "output": f"{tag} answer number {i}."}) + "\n")
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dataguard", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def _snapshot(paths: list[Path]) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in paths}


def test_output_dot_in_a_project_folder_is_refused_and_nothing_is_deleted(tmp_path: Path) -> None:
    project = tmp_path / "project"
    notes = project / "data" / "raw" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("my notes")
    rejected_note = project / "rejected" / "keep.txt"
    rejected_note.parent.mkdir()
    rejected_note.write_text("mine too")
    data = _jsonl(project / "train.jsonl")
    config = project / "p.yaml"
    config.write_text("inputs: [train.jsonl]\nstages: []\nworkers: 1\n")
    before = _snapshot([notes, rejected_note, data, config])

    result = _cli("run", "p.yaml", "--output", ".", "--no-report", cwd=project)

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "not empty" in result.stderr and MARKER in result.stderr
    assert _snapshot(list(before)) == before
    assert not (project / MARKER).exists() and not (project / "manifest.json").exists()


def test_input_inside_an_unmarked_output_folder_survives(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    train = _jsonl(proj / "data" / "train.jsonl")
    before = train.read_bytes()
    with pytest.raises(PipelineError, match="not empty"):
        Pipeline([], workers=1).run([InputSpec(path=train)], proj)
    assert train.read_bytes() == before


def test_input_that_is_one_of_the_folders_own_shards_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    Pipeline([], workers=1).run([_jsonl(tmp_path / "a.jsonl")], out)
    shard = out / "data" / "data-00000.arrow"
    before = shard.read_bytes()
    with pytest.raises(PipelineError, match="part of output folder"):
        Pipeline([], workers=1).run([InputSpec(path=shard)], out)
    assert shard.read_bytes() == before


@pytest.mark.parametrize("mode", ["fresh_flag", "config_change", "input_change", "same_again"])
def test_user_files_beside_and_inside_a_dataguard_folder_survive(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "out"
    first = _jsonl(tmp_path / "a.jsonl", 40)
    Pipeline([], workers=1, shard_rows=10).run([first], out)
    assert len(list((out / "data").glob("data-*.arrow"))) == 4
    user_files = [out / "notes.txt", out / "data" / "mine.txt", out / "rejected" / "mine.txt",
                  out / "_work" / "keep.txt", out / "data-00099.arrow", out / "data" / "data-x.arrow"]
    for f in user_files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"user file {f.name}")
    before = _snapshot(user_files)

    stages: list[Stage] = []
    inputs = [first]
    if mode == "config_change":
        stages = [DedupStage(action="drop")]
    if mode == "input_change":
        inputs = [_jsonl(tmp_path / "b.jsonl", 5, tag="other")]
    result = Pipeline(stages, workers=1, shard_rows=10).run(inputs, out, fresh=mode == "fresh_flag")

    assert _snapshot(user_files) == before
    shards = sorted(p.name for p in (out / "data").glob("data-0*.arrow"))
    assert shards == [Path(s["path"]).name for s in result.manifest["outputs"]["data"]]
    if mode == "input_change":
        assert shards == ["data-00000.arrow"]  # the old run's four shards were ours and are gone
    marker = json.loads((out / MARKER).read_text())
    assert "notes.txt" not in marker["files"] and "data/mine.txt" not in marker["files"]
    assert "manifest.json" in marker["files"] and f"data/{shards[0]}" in marker["files"]


def test_a_forged_marker_entry_cannot_reach_outside_the_folder(tmp_path: Path) -> None:
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    out = tmp_path / "out"
    Pipeline([], workers=1).run([_jsonl(tmp_path / "a.jsonl")], out)
    doc = json.loads((out / MARKER).read_text())
    doc["files"] += ["../precious.txt", str(outside)]
    (out / MARKER).write_text(json.dumps(doc))
    Pipeline([], workers=1).run([_jsonl(tmp_path / "b.jsonl", tag="b")], out, fresh=True)
    assert outside.read_text() == "keep me"


class _Explode(Stage):
    """Fails on every batch: stands in for a run interrupted part-way."""

    name = "explode"

    def apply(self, batch):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")


def test_an_interrupted_rerun_leaves_no_stale_manifest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    data = _jsonl(tmp_path / "a.jsonl")
    Pipeline([], workers=1).run([data], out)
    assert (out / "manifest.json").is_file() and (out / "run.json").is_file()
    with pytest.raises(RuntimeError, match="boom"):
        Pipeline([_Explode()], workers=1).run([data], out)
    assert not (out / "manifest.json").exists() and not (out / "run.json").exists()


def test_a_second_run_into_a_locked_folder_fails_clearly(tmp_path: Path) -> None:
    out = tmp_path / "out"
    data = _jsonl(tmp_path / "a.jsonl")
    holder = OutputFolder(out)
    holder.claim()
    try:
        with pytest.raises(PipelineError, match="another dataguard run"):
            Pipeline([], workers=1).run([data], out)
    finally:
        holder.release()
    assert Pipeline([], workers=1).run([data], out).rows_in == 30  # free again once released


@pytest.mark.parametrize("case", ["is_a_file", "inside_a_file", "read_only"])
def test_unusable_output_paths_give_one_clear_error(tmp_path: Path, case: str) -> None:
    data = _jsonl(tmp_path / "a.jsonl")
    target = tmp_path / "target"
    if case == "is_a_file":
        target.write_text("a file")
        out, needle = target, "is a file"
    elif case == "inside_a_file":
        target.write_text("a file")
        out, needle = target / "sub" / "out", "which is a file"
    elif os.geteuid() != 0:
        target.mkdir()
        target.chmod(0o500)
        out, needle = target / "out", "Permission denied"
    else:  # root ignores permission bits; sysfs refuses new folders even to root
        out, needle = Path("/sys/dataguard-test-out"), "cannot create output folder"
    with pytest.raises(PipelineError, match=needle):
        Pipeline([], workers=1).run([data], out)
    if case != "read_only":
        assert target.read_text() == "a file"


def test_runtime_keys_do_not_change_manifest_or_fingerprint(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "a.jsonl")
    base = {"inputs": [str(data)], "stages": [], "batch_rows": 10}
    a = Pipeline([], workers=1, batch_rows=10, config=base).run([data], tmp_path / "a")
    b = Pipeline([], workers=1, batch_rows=10,
                 config={**base, "workers": 2, "executor": "local", "report": False, "output": "x"}).run(
        [data], tmp_path / "b")
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    assert a.manifest == b.manifest


def test_report_never_overwrites_a_users_file_in_the_output_folder(tmp_path: Path) -> None:
    from dataguard.io.output import OutputFolderError
    from dataguard.report.build import build_report

    out = tmp_path / "out"
    Pipeline([], workers=1).run([_jsonl(tmp_path / "a.jsonl")], out)
    mine = out / "audit.html"
    mine.write_text("my own page")
    with pytest.raises(OutputFolderError, match="did not write"):
        build_report(out)
    assert mine.read_text() == "my own page"
    mine.unlink()
    build_report(out)
    assert "audit.html" in json.loads((out / MARKER).read_text())["files"]
    build_report(out)  # ours now: rebuilding overwrites it


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1 MiB tmpfs (needs root to mount; skipped where that is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_is_one_clear_error_and_resumes_once_space_is_freed(tmp_path: Path, small_disk: Path) -> None:
    rows = tmp_path / "big.jsonl"
    with rows.open("w", encoding="utf-8") as f:
        for i in range(6000):
            f.write(json.dumps({"instruction": f"question {i} " + "x" * 200, "output": f"answer {i}"}) + "\n")
    clean = Pipeline([], workers=1, batch_rows=500).run([rows], tmp_path / "clean")

    out = small_disk / "out"
    with pytest.raises(PipelineError, match="no space left on device"):
        Pipeline([], workers=1, batch_rows=500).run([rows], out)
    assert not list(small_disk.rglob(".*.tmp-*")), "a failed write left a temp file behind"
    grow = subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], capture_output=True)
    assert grow.returncode == 0, grow.stderr
    result = Pipeline([], workers=1, batch_rows=500).run([rows], out)
    assert result.manifest == clean.manifest
    assert (out / "data" / "data-00000.arrow").read_bytes() == (tmp_path / "clean" / "data" / "data-00000.arrow").read_bytes()


def test_a_registered_name_behind_a_swapped_in_link_is_not_deleted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    Pipeline([], workers=1).run([_jsonl(tmp_path / "a.jsonl")], out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    precious = elsewhere / "data-00000.arrow"
    precious.write_text("a user's file that happens to share a shard's name")
    for f in (out / "data").iterdir():
        f.unlink()
    (out / "data").rmdir()
    (out / "data").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(PipelineError, match="is a link"):
        Pipeline([], workers=1).run([_jsonl(tmp_path / "b.jsonl", tag="b")], out, fresh=True)
    assert precious.read_text() == "a user's file that happens to share a shard's name"
    folder = OutputFolder(out)  # the ledger's own delete refuses to follow the link as well
    folder._owned = {"data/data-00000.arrow"}
    folder.clean()
    assert precious.read_text() == "a user's file that happens to share a shard's name"
