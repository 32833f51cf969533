"""The command line keeps one promise: a run, or ONE line on stderr and a non-zero exit.

Most cases run `dataguard.cli.main` in-process (fast); `Pipeline.run` is replaced where the
case is about what surrounds a run (errors it raises, the arguments it gets). A few cases
run `python -m dataguard` to see the real stderr, which must never hold a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dataguard import cli
from dataguard.io.readers import InputError
from dataguard.pipeline import Pipeline, PipelineError

REPO = Path(__file__).resolve().parent.parent
SMALL = REPO / "sample_data" / "messages_content_parts.jsonl"
LINE = re.compile(r"^dataguard: \S.*$")
CONFIG_LINE = re.compile(r"^dataguard: config error: (?P<file>[^:]+):(?P<line>\d+): (?P<rest>.+)$")


def _main(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert LINE.match(lines[0]), lines[0]
    return lines[0]


def _config(tmp_path: Path, text: str | bytes, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _ok_config(tmp_path: Path) -> Path:
    return _config(tmp_path, f"inputs:\n  - {SMALL}\nstages:\n  - dedup: {{action: flag}}\nreport: false\n",
                   "ok.yaml")


class _FakeRun:
    """Stands in for Pipeline.run: records its arguments, then raises or returns."""

    def __init__(self, raises: BaseException | None = None) -> None:
        self.raises = raises
        self.calls: list[dict[str, Any]] = []

    def __call__(self, inputs: Any, output: Any, **kwargs: Any) -> Any:
        self.calls.append({"inputs": list(inputs), "output": Path(output), **kwargs})
        if self.raises is not None:
            raise self.raises
        counts = {"rows_in": 1, "rows_kept": 1, "rows_rejected": 0, "balanced": True}
        return SimpleNamespace(manifest={"counts": counts}, timings={"seconds": 0.0})


@pytest.fixture
def fake_run(monkeypatch: pytest.MonkeyPatch):
    def install(raises: BaseException | None = None) -> _FakeRun:
        fake = _FakeRun(raises)
        monkeypatch.setattr(Pipeline, "run", lambda self, inputs, output, **kw: fake(inputs, output, **kw))
        return fake
    return install


# -------------------------------------------------------------------- config errors
@pytest.mark.parametrize("text, line, key", [
    (f"inputs:\n  - {SMALL}\nstages:\n  - length:\n      tokenizer: foo\n", 5, "stages[0].length.tokenizer"),
    (f"inputs:\n  - {SMALL}\nstages:\n  - overlap: {{n: 13, mode: tokn}}\n", 4, "stages[0].overlap.mode"),
    (f"inputs:\n  - {SMALL}\nstages:\n  - consistency: {{model: /no/model}}\n", 4, "stages[0].consistency.model"),
    (f"inputs:\n  - {{path: {SMALL}, name: t}}\nstages:\n  - overlap: {{validation_sources: [v]}}\n", 4,
     "stages[0].overlap.validation_sources"),
    (f"inputs:\n  - {SMALL}\nworkers: 0\n", 3, "workers"),
])
def test_config_errors_are_one_line_with_file_line_and_key(capsys, tmp_path: Path, text: str, line: int,
                                                           key: str) -> None:
    path = _config(tmp_path, text)
    code, _, err = _main(capsys, "run", path, "--output", tmp_path / "o")
    match = CONFIG_LINE.match(_one_line(err))
    assert code == cli.EXIT_USAGE and match, err
    assert match["file"] == str(path) and int(match["line"]) == line and match["rest"].startswith(f"{key}: ")
    assert not (tmp_path / "o").exists()


def test_invalid_utf8_deep_and_alias_bomb_configs(capsys, tmp_path: Path) -> None:
    cases = {
        "utf8.yaml": (b"inputs:\n  - x\n# \xff\n", "not valid UTF-8"),
        "deep.yaml": (b"[" * 20000, "nested deeper than"),
        "bomb.yaml": ("\n".join([f"a0: &a0 [{','.join(['lol'] * 9)}]"] + [
            f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]).encode(), "aliases"),
    }
    for name, (text, needle) in cases.items():
        code, _, err = _main(capsys, "run", _config(tmp_path, text, name), "--output", tmp_path / "o")
        assert code == cli.EXIT_USAGE and CONFIG_LINE.match(_one_line(err)) and needle in err, err


def test_config_path_problems(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = _main(capsys, "run", tmp_path, "--output", tmp_path / "o")
    assert code == 2 and _one_line(err) == f"dataguard: config error: {tmp_path}: is a folder; give the " \
                                           "pipeline YAML file inside it"
    code, _, err = _main(capsys, "run", tmp_path / "none.yaml", "--output", tmp_path / "o")
    assert code == 2 and "config file not found" in _one_line(err)
    path = _ok_config(tmp_path)
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied", str(f))) if Path(f) == path else real_open(f, *a, **k))
    code, _, err = _main(capsys, "run", path, "--output", tmp_path / "o")
    assert code == 2 and _one_line(err) == f"dataguard: config error: {path}: cannot read the config: " \
                                           "Permission denied"


# -------------------------------------------------------------------- arguments
@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_workers_is_one_line(capsys, tmp_path: Path, value: str) -> None:
    code, _, err = _main(capsys, "run", _ok_config(tmp_path), "--output", tmp_path / "o", "--workers", value)
    assert code == 2
    assert _one_line(err) == f"dataguard: argument --workers: must be a positive integer, got '{value}' " \
                             "(see `dataguard run --help`)"


def test_usage_errors_and_help(capsys) -> None:
    code, _, err = _main(capsys)
    assert code == 2 and "required" in _one_line(err)
    code, _, err = _main(capsys, "inspect", "x", "--examples", "-1")
    assert code == 2 and "non-negative" in _one_line(err)
    code, out, err = _main(capsys, "run", "--help")
    assert code == 0 and "--input" in out and "validation split stays" in " ".join(out.split()) and not err


@pytest.mark.parametrize("problem", ["missing", "folder", "twice"])
def test_bad_input_argument(capsys, tmp_path: Path, problem: str) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    args = {"missing": ["--input", tmp_path / "nope.jsonl"], "folder": ["--input", folder],
            "twice": ["--input", SMALL, "--input", SMALL]}[problem]
    code, _, err = _main(capsys, "run", _ok_config(tmp_path), "--output", tmp_path / "o", *args)
    line = _one_line(err)
    assert code == 2 and line.startswith("dataguard: --input ")
    assert {"missing": "file not found", "folder": "not a saved Hugging Face dataset",
            "twice": "given twice"}[problem] in line


# -------------------------------------------------------------------- output folders
def test_output_that_is_a_file_or_inside_one(capsys, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    code, _, err = _main(capsys, "run", _ok_config(tmp_path), "--output", afile)
    assert code == 2 and _one_line(err) == f"dataguard: output {afile}: is a file, not a folder"
    code, _, err = _main(capsys, "run", _ok_config(tmp_path), "--output", afile / "sub" / "o")
    assert code == 2 and _one_line(err) == (f"dataguard: output {afile / 'sub' / 'o'}: {afile} is a file, so no "
                                            "folder can be made inside it")
    assert afile.read_text() == "mine"


def test_read_only_output(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    code, _, err = _main(capsys, "run", _ok_config(tmp_path), "--output", locked / "o")
    assert code == 2 and _one_line(err) == f"dataguard: output {locked / 'o'}: permission denied: cannot write " \
                                           f"in {locked}"


def test_really_read_only_output(capsys, tmp_path: Path) -> None:
    # Permission bits stop a normal user; root ignores them, so as root the folder is a
    # read-only tmpfs mount (which stops root too).
    locked = tmp_path / "locked"
    locked.mkdir()
    mounted = False
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(locked)],
                              capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"root here cannot mount a read-only folder: {done.stderr.decode().strip()}")
        mounted = True
    else:
        locked.chmod(0o555)
    try:
        code, _, err = _main(capsys, "run", _ok_config(tmp_path), "--output", locked / "o")
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(locked)], capture_output=True)
        else:
            locked.chmod(0o755)
    assert code == 2 and "permission denied" in _one_line(err)


@pytest.mark.parametrize("raised, code, expected", [
    (PipelineError("output folder out holds files dataguard did not write"), 1,
     "dataguard: run failed: output folder out holds files dataguard did not write"),
    (InputError("input 'x': not a dataset"), 1, "dataguard: run failed: input 'x': not a dataset"),
    (OSError(errno.ENOSPC, "No space left on device", "o/data/part-00000.arrow"), 1,
     "dataguard: run failed: No space left on device: o/data/part-00000.arrow (free some space and run again: "
     "finished work is kept and resumed)"),
    (PermissionError(errno.EACCES, "Permission denied", "o/manifest.json"), 1,
     "dataguard: run failed: Permission denied: o/manifest.json"),
    (MemoryError(), 1, "dataguard: run failed: out of memory (try fewer --workers or a smaller batch_rows)"),
    (KeyboardInterrupt(), 130, "dataguard: interrupted; run again to resume"),
    (RuntimeError("boom\nsecond line"), 1, "dataguard: internal error: RuntimeError: boom second line (a dataguard "
                                           "bug; set DATAGUARD_TRACEBACK=1 to see where)"),
])
def test_run_failures_are_one_line(capsys, tmp_path: Path, fake_run, monkeypatch: pytest.MonkeyPatch,
                                   raised: BaseException, code: int, expected: str) -> None:
    monkeypatch.delenv("DATAGUARD_TRACEBACK", raising=False)
    fake_run(raised)
    got, out, err = _main(capsys, "run", _ok_config(tmp_path), "--output", tmp_path / "o")
    assert got == code and _one_line(err) == expected and not out


# -------------------------------------------------------------------- what run passes on
def test_fresh_is_passed_to_the_pipeline_and_nothing_is_deleted_here(capsys, tmp_path: Path, fake_run) -> None:
    out = tmp_path / "o"
    (out / "_work").mkdir(parents=True)
    (out / "_work" / "mine.txt").write_text("keep me")
    fake = fake_run()
    assert cli.main(["run", str(_ok_config(tmp_path)), "--output", str(out), "--fresh"]) == 0
    assert fake.calls[0]["fresh"] is True and fake.calls[0]["output"] == out
    assert (out / "_work" / "mine.txt").read_text() == "keep me"
    assert cli.main(["run", str(_ok_config(tmp_path)), "--output", str(out)]) == 0
    assert fake.calls[1]["fresh"] is False


def test_input_replaces_config_inputs_from_another_folder(capsys, tmp_path: Path, fake_run,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_bytes(SMALL.read_bytes())
    monkeypatch.chdir(tmp_path)  # sft.yaml's own inputs are relative to the repo: not found from here
    fake = fake_run()
    assert cli.main(["run", str(REPO / "pipelines" / "sft.yaml"), "--input", "mine.jsonl", "--output", "o",
                     "--no-report"]) == 0
    assert [(str(s.path), s.name) for s in fake.calls[0]["inputs"]] == [("mine.jsonl", "mine.jsonl")]


def test_input_keeps_the_validation_split(capsys, tmp_path: Path, fake_run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    fake = fake_run()
    code = cli.main(["run", "pipelines/decontaminate.yaml", "--input", str(SMALL), "--output", str(tmp_path / "o"),
                     "--no-report"])
    assert code == 0
    assert [s.name for s in fake.calls[0]["inputs"]] == [SMALL.name, "kto_validation"]
    assert "keeps the config's 'kto_validation'" in _one_line(capsys.readouterr().err)


def test_input_with_validation_split_missing_from_here(capsys, tmp_path: Path, fake_run,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fake_run()
    config = REPO / "pipelines" / "decontaminate.yaml"
    code, _, err = _main(capsys, "run", config, "--input", SMALL, "--output", tmp_path / "o")
    match = CONFIG_LINE.match(_one_line(err))
    assert code == 2 and match and match["file"] == str(config)
    assert match["rest"].startswith("inputs[2].path: file not found") and "kept beside --input" in err


# -------------------------------------------------------------------- inspect and report
@pytest.mark.parametrize("manifest, needle", [
    (None, "has no manifest.json (not a finished run)"),
    ("{", "manifest.json: not valid JSON"),
    ("[1, 2]", "manifest.json: not a dataguard manifest"),
    ('{"counts": {}, "inputs": [], "stages": [], "outputs": {}}', "not a valid dataguard manifest"),
    ('{"counts": {"rows_in": 1, "rows_kept": 1, "rows_rejected": 0, "balanced": true}, "inputs": [], '
     '"stages": [{"name": "x", "rows_in": 1, "rows_kept": 0, "rows_rejected": 1, "reasons": {"r": 1}}], '
     '"outputs": {"rejected": [{"path": "rejected/missing.arrow"}]}}', "cannot read rejected shard"),
])
def test_inspect_bad_folders(capsys, tmp_path: Path, manifest: str | None, needle: str) -> None:
    out = tmp_path / "o"
    out.mkdir()
    if manifest is not None:
        (out / "manifest.json").write_text(manifest)
    code, _, err = _main(capsys, "inspect", out)
    assert code in (1, 2) and needle in _one_line(err), err


def test_inspect_and_report_on_a_file_or_nothing(capsys, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for command in ("inspect", "report"):
        code, _, err = _main(capsys, command, afile)
        assert code == 2 and _one_line(err) == f"dataguard: {afile}: is a file, not a folder"
        code, _, err = _main(capsys, command, tmp_path / "none")
        assert code == 2 and _one_line(err) == f"dataguard: {tmp_path / 'none'} has no manifest.json (no such folder)"


def test_report_with_a_broken_manifest(capsys, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "manifest.json").write_text("not json")
    code, _, err = _main(capsys, "report", out)
    assert code == 2 and "not valid JSON" in _one_line(err)


def test_report_failure_after_a_run_is_one_line(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataguard.report.build as build

    def broken(*args: Any, **kwargs: Any) -> Path:
        raise OSError(errno.EROFS, "Read-only file system", "o/audit.html")

    monkeypatch.setattr(build, "build_report", broken)
    code, _, err = _main(capsys, "report", _finished_run(tmp_path))
    assert code == 1 and _one_line(err) == "dataguard: could not build the report: Read-only file system: " \
                                           "o/audit.html"


def _finished_run(tmp_path: Path) -> Path:
    out = tmp_path / "done"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({
        "counts": {"rows_in": 0, "rows_kept": 0, "rows_rejected": 0, "balanced": True},
        "inputs": [], "stages": [], "outputs": {"data": [], "rejected": []}}))
    return out


# -------------------------------------------------------------------- real processes
def _dataguard(*args: Any, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DATAGUARD_TRACEBACK"}
    return subprocess.run([sys.executable, "-m", "dataguard", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def test_bad_configs_never_print_a_traceback(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    ok = _ok_config(tmp_path)
    bad = {
        "utf8.yaml": b"inputs: [x]\n\xc3\x28\n",
        "deep.yaml": b"[" * 20000,
        "bomb.yaml": b"a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
                     b"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
                     b"f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n",
        "tok.yaml": f"inputs: [{SMALL}]\nstages:\n  - length: {{tokenizer: nope}}\n".encode(),
        "folder.yaml": f"inputs: [{notes}]\n".encode(),
        "nul.yaml": b"inputs: [\x00]\n",
        "date.yaml": b"inputs: [x]\nworkers: !!timestamp 2024-13-45\n",
    }
    runs = [_dataguard("run", _config(tmp_path, text, name), "--output", tmp_path / "o") for name, text in bad.items()]
    runs += [_dataguard("run", tmp_path, "--output", tmp_path / "o"),
             _dataguard("run", ok, "--output", afile),
             _dataguard("run", ok, "--output", tmp_path / "o", "--workers", "0"),
             _dataguard("inspect", notes)]
    for result in runs:
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == 2, (result.args, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("dataguard: "), result.stderr
    assert not (tmp_path / "o").exists()


def test_a_real_run_from_another_folder_with_input(tmp_path: Path) -> None:
    config = _config(tmp_path, "inputs:\n  - not/here.jsonl\nstages:\n  - dedup: {action: flag}\nreport: false\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _dataguard("run", config, "--input", SMALL, "--output", "out", "--workers", "1", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert "rows in 250" in result.stdout and "Traceback" not in result.stderr, result.stderr
    inspect = _dataguard("inspect", elsewhere / "out")
    assert inspect.returncode == 0 and SMALL.name in inspect.stdout
