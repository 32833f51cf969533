"""The first day with `dataguard train` (issue #23 s3), through the command line: --data for a
moved pipeline output, no run folder left by a failed start, absolute paths in run.json (resume
from anywhere), the audit kept out of the checkout under --output, progress lines without a
terminal, cheap refusals before any shard is read, and the thread count chosen from the CPUs
this process may use."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dataguard import cli
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train import prepare, run_checkpoint, run_setup
from dataguard.train.config import load_train_config
from dataguard.train.loop import Trainer, TrainError

REPO = Path(__file__).resolve().parent.parent
ALPACA = REPO / "sample_data" / "alpaca_en_demo.json"
TRAIN = ("task: sft\nmodel: tiny-causal-lm\nmax_steps: 4\nbatch_size: 2\nlr: 0.003\nmax_length: 64\n"
         "tensorboard: false\nsave_every: 2\neval_every: 100\nlog_every: 2\nthreads: 1\n")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pipeline output (the sample Alpaca file, no stages)."""
    out = tmp_path_factory.mktemp("pipe") / "shards"
    Pipeline([], workers=1).run([InputSpec(path=str(ALPACA))], out)
    return out


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A run sets torch's process-wide thread count; later tests get theirs back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _main(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _spec(folder: Path, extra: str = "", name: str = "train.yaml", data: Path | None = None) -> Path:
    """TRAIN with the ``key: value`` lines of ``extra`` added or replacing its own."""
    extra = (f"data: {data}\n" if data is not None else "") + extra
    keys = {line.split(":")[0] for line in extra.splitlines()}
    path = folder / name
    path.write_text("".join(f"{line}\n" for line in TRAIN.splitlines() if line.split(":")[0] not in keys) + extra)
    return path


def _interrupt_after_checkpoint(monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """Ctrl-C right after the checkpoint of step ``at`` is written (a run to resume)."""
    save = run_checkpoint.save_run_checkpoint

    def save_then_stop(run: Any, *a: Any, **kw: Any) -> Path:
        path = save(run, *a, **kw)
        if run.state.step == at:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(run_checkpoint, "save_run_checkpoint", save_then_stop)


# ------------------------------------------------------------------ 1. --data; no folder left behind
def test_data_flag_trains_on_a_moved_pipeline_output_and_a_failed_start_leaves_no_folder(
        shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = tmp_path / "p.yaml"  # the README's pair: `dataguard run p.yaml` then `dataguard train p.yaml`
    pipeline.write_text(f"inputs:\n  - {{path: {ALPACA}}}\noutput: {tmp_path / 'out/p'}\n"
                        + "train:\n" + "".join(f"  {line}\n" for line in TRAIN.splitlines()))
    run = tmp_path / "runs" / "first"
    code, _, err = _main(capsys, "train", pipeline, "--output", run, "--quiet")
    assert code == 2
    assert err == (f"dataguard: no pipeline output at {tmp_path / 'out/p'} (run `dataguard run CONFIG` first, "
                   "or pass --data)\n")
    assert not (tmp_path / "runs").exists()  # nothing claimed

    code, out, _ = _main(capsys, "train", pipeline, "--data", shards, "--output", run, "--quiet")
    assert code == 0 and "steps 4/4" in out
    assert json.loads((run / "run.json").read_text())["config"]["data"] == str(shards)


def test_a_start_that_fails_after_the_claim_removes_the_folders_it_made(
        shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from dataguard.train.data import TrainDataError

    def no_rows(*_: Any, **__: Any) -> Any:
        raise TrainDataError("every row is longer than max_length")

    monkeypatch.setattr(run_setup, "encode_split", no_rows)
    spec = _spec(tmp_path, data=shards)
    code, _, err = _main(capsys, "train", spec, "--output", tmp_path / "a" / "b" / "run")
    assert code == 1 and err == "dataguard: train failed: every row is longer than max_length\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.yaml"]
    mine = tmp_path / "mine"  # a folder that was there before is left as it was
    mine.mkdir()
    assert _main(capsys, "train", spec, "--output", mine)[0] == 1
    assert mine.is_dir()


# ------------------------------------------------------------------ 2. absolute paths: resume from anywhere
def test_run_json_records_absolute_paths_and_resume_works_from_another_directory(
        shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "shards").symlink_to(shards, target_is_directory=True)
    _spec(project, "data: shards\noutput: run\n")  # paths relative to the project
    monkeypatch.chdir(project)
    _interrupt_after_checkpoint(monkeypatch, 2)
    assert _main(capsys, "train", "train.yaml", "--quiet")[0] == 130
    settings = json.loads((project / "run" / "run.json").read_text())["config"]
    assert (settings["data"], settings["output"]) == (str(project / "shards"), str(project / "run"))

    monkeypatch.undo()
    monkeypatch.chdir(elsewhere)  # resume by the run folder alone, from another directory
    code, out, err = _main(capsys, "train", project / "run", "--resume", "--quiet")
    assert code == 0, err
    assert "steps 4/4" in out and "resuming from step-000002" in out
    assert sorted(elsewhere.iterdir()) == []


def test_a_model_folder_given_relative_is_recorded_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataguard.train.model.tiny import minilm_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").symlink_to(minilm_path(), target_is_directory=True)
    cfg = load_train_config({"task": "sft", "model": "m", "data": "d", "output": "o"})
    prepare.absolute_paths(cfg)
    assert (cfg.model, cfg.data, cfg.output) == (str(tmp_path / "m"), str(tmp_path / "d"), str(tmp_path / "o"))
    builtin = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "d"})
    prepare.absolute_paths(builtin)
    assert builtin.model == "tiny-causal-lm" and builtin.output == str(tmp_path / "d-train")


# ------------------------------------------------------------------ 3. the audit under --output
def test_run_with_output_writes_the_audit_inside_it_not_into_reports(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "sft.yaml"
    config.write_text(f"inputs:\n  - {{path: {ALPACA}}}\noutput: out/sft\nreport: reports/sft.html\n")
    code, out, err = _main(capsys, "run", config, "--output", "out/x", "--quiet")
    assert code == 0, err
    assert not (tmp_path / "reports").exists()
    assert (tmp_path / "out/x/audit.html").is_file() and "report:   out/x/audit.html" in out
    assert err == ("dataguard: note: --output out/x: the report goes to out/x/audit.html, not to the config's "
                   "reports/sft.html (pass --report to choose)\n")
    code, out, err = _main(capsys, "run", config, "--quiet")  # `make demo`: the config asks for reports/
    assert code == 0 and err == ""
    assert (tmp_path / "reports/sft.html").is_file() and not (tmp_path / "out/sft/audit.html").exists()
    (tmp_path / "reports/sft.html").unlink()
    code, out, err = _main(capsys, "run", config, "--output", "out/sft", "--quiet")  # its own output: the same
    assert code == 0 and err == "" and (tmp_path / "reports/sft.html").is_file()


# ------------------------------------------------------------------ 4. progress lines without a terminal
LINE = re.compile(r"^train step (\d+)/4  loss \d+\.\d{4}  lr \d\.\d\de[-+]\d\d  grad-norm \S+  "
                  r"tok/s [\d,]+  eta (\d+s|\d+m\d\ds)$")


def test_progress_lines_every_log_every_steps_when_stderr_is_not_a_terminal(
        shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path, data=shards)
    code, _, err = _main(capsys, "train", spec, "--output", tmp_path / "a")
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("train step")]
    assert [int(LINE.match(line).group(1)) for line in lines] == [2, 4], err  # type: ignore[union-attr]
    assert "\r" not in err  # no progress bar in a log file

    code, _, err = _main(capsys, "train", spec, "--output", tmp_path / "b", "--quiet")
    assert code == 0 and "train step" not in err

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar, not the lines
    code, _, err = _main(capsys, "train", spec, "--output", tmp_path / "c")
    assert code == 0 and "train step" not in err and "4/4" in err


# ------------------------------------------------------------------ 5. refusals before any work
@pytest.mark.parametrize(("setting", "message"), [
    ("precision: fp16\n", "precision fp16 needs a CUDA device"),
    ("device: cuda\n", "device: cuda, but torch sees no CUDA device"),
    ("model: {folder}\n", "no config.json in"),
    ("model: {hf}\n", "no tokenizer in"),
])
def test_bad_device_precision_or_model_fail_before_shards_are_read(
        setting: str, message: str, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available() and "model" not in setting:
        pytest.skip("this machine has CUDA")
    (tmp_path / "folder").mkdir()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "gpt2"}')
    read: list[str] = []

    def opened(*a: Any, **kw: Any) -> Any:
        read.append("shards")
        raise AssertionError("the shards were read before the settings were checked")

    monkeypatch.setattr(run_setup.RunShards, "open", opened)
    spec = _spec(tmp_path, setting.format(folder=tmp_path / "folder", hf=tmp_path / "hf"), data=shards)
    code, _, err = _main(capsys, "train", spec, "--output", tmp_path / "run")
    assert code == 1 and message in err and err.count("\n") == 1 and err.startswith("dataguard: train failed: ")
    assert not (tmp_path / "run").exists() and not read
    # the library path too: Trainer.fit checks before it opens the shards
    cfg = load_train_config({**_values(spec), "data": str(shards), "output": str(tmp_path / "lib")})
    with pytest.raises(Exception, match=re.escape(message)):
        Trainer(cfg, progress=False).fit()
    assert not read


def _values(spec: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(spec.read_text())


# ------------------------------------------------------------------ 6. threads
def test_threads_follow_usable_cpus_and_local_processes_and_stay_on_resume(
        shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("300000 100000\n")  # a container limited to 3 CPUs
    monkeypatch.setattr(prepare, "CGROUP_ROOT", cgroup)
    monkeypatch.setattr(prepare.os, "sched_getaffinity", lambda _pid: set(range(8)), raising=False)
    monkeypatch.setattr(prepare, "_own_cgroup", lambda: "/", raising=False)
    assert prepare.usable_cpus() == 3
    (cgroup / "cpu.max").write_text("max 100000\n")
    assert prepare.usable_cpus() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # four processes on this machine (torchrun)
    assert prepare.choose_threads(load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "d"}),
                                  tmp_path, resume=False) == {"count": 2, "from": "8 usable CPUs / 4 local processes"}
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    (cgroup / "cpu.max").write_text("200000 100000\n")

    spec = _spec(tmp_path, "", "t.yaml", data=shards)
    spec.write_text(spec.read_text().replace("threads: 1\n", ""))  # threads unset
    seen: list[int] = []
    save = run_checkpoint.save_run_checkpoint
    _interrupt_after_checkpoint(monkeypatch, 2)
    monkeypatch.setattr(run_setup, "encode_split", _recording(run_setup.encode_split, seen))
    assert _main(capsys, "train", spec, "--output", tmp_path / "run", "--quiet")[0] == 130
    assert seen == [2]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["threads"] == {
        "count": 2, "from": "2 usable CPUs / 1 local process"}

    monkeypatch.setattr(run_checkpoint, "save_run_checkpoint", save)
    (cgroup / "cpu.max").write_text("100000 100000\n")  # resumed on a smaller machine: the same count
    code, out, err = _main(capsys, "train", tmp_path / "run", "--resume", "--quiet")
    assert code == 0 and "steps 4/4" in out, err
    assert seen == [2, 2]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["threads"] == {"count": 2, "from": "resumed run"}

    explicit = _spec(tmp_path, "", "e.yaml", data=shards)  # threads: 1 in the config wins
    assert _main(capsys, "train", explicit, "--output", tmp_path / "e", "--quiet")[0] == 0
    assert json.loads((tmp_path / "e" / "run.json").read_text())["threads"] == {"count": 1, "from": "config"}


def _recording(encode: Any, seen: list[int]) -> Any:
    def wrapped(*a: Any, **kw: Any) -> Any:
        seen.append(torch.get_num_threads())
        return encode(*a, **kw)

    return wrapped


def test_cgroup_quota_is_the_smallest_on_the_way_to_the_root(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "a" / "cpu.max").write_text("250000 100000\n")  # 2.5 CPUs: 2 whole ones
    (tmp_path / "a" / "b" / "cpu.max").write_text("max 100000\n")
    monkeypatch.setattr(prepare, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(prepare, "_own_cgroup", lambda: "/a/b", raising=False)
    assert prepare.cgroup_cpu_quota() == 2
    monkeypatch.setattr(prepare, "_own_cgroup", lambda: "/", raising=False)
    assert prepare.cgroup_cpu_quota() is None


def test_interrupted_failures_never_remove_a_run_with_checkpoints(
        shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupt_after_checkpoint(monkeypatch, 2)
    assert _main(capsys, "train", _spec(tmp_path, data=shards), "--output", tmp_path / "run", "--quiet")[0] \
        == 130
    assert (tmp_path / "run" / "checkpoints").is_dir()
    with pytest.raises(TrainError, match="already has checkpoints"):
        Trainer(load_train_config({**_values(tmp_path / "train.yaml"), "data": str(shards),
                                   "output": str(tmp_path / "run")}), progress=False).fit()
