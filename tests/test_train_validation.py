"""Issue 22, section 2: what the runner is handed is checked before any training.

Config values are range-checked at load time (one ``file:line: key`` error, exit 2), and
YAML 1.1's numbers-read-as-text (``1e300``: no dot) say "a number out of range", not "not a
number". The defaults pass the same checks.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from dataguard.cli import main
from dataguard.config import ConfigError, load_config
from dataguard.config_yaml import Located
from dataguard.train import config_checks as C
from dataguard.train.config import CHECKS, TrainConfig, load_train_config

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data"


def _write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def _train_yaml(tmp_path: Path, extra: str) -> Path:
    """A standalone train config whose line 4 is ``extra`` (data: a folder that does not exist)."""
    return _write(tmp_path, f"task: sft\nmodel: tiny-causal-lm\ndata: {tmp_path / 'no-run'}\n{extra}\n")


def _cli(capsys, *argv: str) -> tuple[int, str]:
    """(exit code, stderr) of ``dataguard ARGV``; stderr must be one line."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return code, err.strip()


# ------------------------------------------------------------------ B: range checks at load time
@pytest.mark.parametrize(("line", "expected"), [
    ("lr: 1.0e+300", r"t\.yaml:4: lr: must be a positive number <= 10, got 1e\+300$"),
    ("lr: 1e300", r"t\.yaml:4: lr: must be a positive number <= 10, got 1e300 \(a number out of range\)$"),
    ("lr: 1.0e308", r"t\.yaml:4: lr: must be a positive number <= 10, got 1\.0e308 \(a number out of range\)$"),
    ("lr: 1e400", r"t\.yaml:4: lr: must be a positive number <= 10, got 1e400 \(a number out of range\)$"),
    ("lr: .inf", r"t\.yaml:4: lr: must be a positive number <= 10, got inf$"),
    ("lr: -1", r"t\.yaml:4: lr: must be a positive number, got -1$"),
    ("lr: 2e-5", r"t\.yaml:4: lr: must be a positive number <= 10, got '2e-5' \(YAML reads it as text: write "
                 r"2\.0e-5\)$"),
    (f"seed: {2**70}", rf"t\.yaml:4: seed: must be an integer in \[0, {2**63 - 1}\], got {2**70}$"),
    ("seed: 1e30", r"t\.yaml:4: seed: must be an integer in \[0, \d+\], got 1e30 \(a number out of range\)$"),
    (f"threads: {10**9}", r"t\.yaml:4: threads: must be a positive integer <= 4096 or null, got 1000000000$"),
    (f"max_steps: {10**30}", rf"t\.yaml:4: max_steps: must be a positive integer <= 1000000000 or null, "
                             rf"got {10**30}$"),
    ("max_steps: 1e30", r"t\.yaml:4: max_steps: .* got 1e30 \(a number out of range\)$"),
    ("max_steps: 1e3", r"t\.yaml:4: max_steps: must be a positive integer or null, got '1e3' \(YAML reads it as "
                       r"text: write 1000\)$"),
    ("min_lr: 0.1", r"t\.yaml:4: min_lr: must not exceed lr \(2e-05\), got 0\.1$"),
    ("min_lr: 1.0e+300", r"t\.yaml:4: min_lr: must be a number >= 0 and <= 10, got 1e\+300$"),
    ("lr: 1.0e-3\nmin_lr: 1.0e-2", r"t\.yaml:5: min_lr: must not exceed lr \(0\.001\), got 0\.01$"),
])
def test_train_values_are_range_checked_at_load(tmp_path, line, expected):
    with pytest.raises(ConfigError, match=expected):
        load_train_config(_train_yaml(tmp_path, line))


def test_values_at_the_ceilings_load(tmp_path):
    cfg = load_train_config(_train_yaml(tmp_path, f"lr: 10\nmin_lr: 10\nseed: {2**63 - 1}\nthreads: 4096\n"
                                                  f"max_steps: {10**9}"))
    assert (cfg.lr, cfg.min_lr, cfg.seed, cfg.threads, cfg.max_steps) == (10.0, 10.0, 2**63 - 1, 4096, 10**9)
    # min_lr may equal lr, and overrides pass through the same checks
    with pytest.raises(ConfigError, match=r"^<override>: seed: must be an integer in \[0, "):
        load_train_config(_train_yaml(tmp_path, "lr: 1.0e-3"), overrides={"seed": 2**64})
    with pytest.raises(ConfigError, match=r"t\.yaml:\d: min_lr: must not exceed lr \(1e-05\), got 0\.001"):
        load_train_config(_train_yaml(tmp_path, "min_lr: 1.0e-3"), overrides={"lr": 1e-5})


@pytest.mark.parametrize("line", ["lr: 1e300", f"seed: {2**70}", f"threads: {10**9}", f"max_steps: {10**30}",
                                  "min_lr: 0.5"])
def test_cli_refuses_out_of_range_values_in_one_line(tmp_path, capsys, line):
    code, err = _cli(capsys, "train", str(_train_yaml(tmp_path, line)))
    key = line.split(":")[0]
    assert code == 2 and err.startswith(f"dataguard: config error: {tmp_path / 't.yaml'}:4: {key}: "), err
    assert not (tmp_path / "no-run-train").exists()  # refused before the run folder is made


def test_default_config_passes_its_own_checks():
    """Every declared default is a value its check accepts unchanged, and a config of
    defaults loads back to itself (so a saved run's settings always reload)."""
    loc = Located("<defaults>", None)
    for f in dataclasses.fields(TrainConfig):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert CHECKS[f.name](default, (f.name,), loc) == default, f.name
    cfg = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "d"})
    assert load_train_config(cfg.to_dict()) == cfg
    for path in sorted((REPO / "pipelines").glob("train_*.yaml")):  # the shipped examples load too
        assert load_train_config(path).lr <= C.MAX_LR


@pytest.mark.parametrize(("line", "expected"), [
    ("batch_rows: 100000000000000000000", r"p\.yaml:3: batch_rows: must be a positive integer <= 1000000000, "
                                          r"got 100000000000000000000$"),
    ("batch_rows: 1e20", r"p\.yaml:3: batch_rows: must be a positive integer <= 1000000000, got '1e20' "
                         r"\(a number out of range\)$"),
    ("batch_rows: 1e3", r"p\.yaml:3: batch_rows: must be a positive integer, got '1e3' \(YAML reads it as text: "
                        r"write 1000\)$"),
    ("workers: 100000", r"p\.yaml:3: workers: must be a positive integer <= 4096, got 100000$"),
    ("stages:\n  - length: {min_tokens: 500, max_tokens: 10}",
     r"p\.yaml:4: stages\[0\]\.length\.min_tokens: must not exceed max_tokens \(10\), got 500$"),
])
def test_pipeline_sizes_are_range_checked(tmp_path, line, expected):
    path = _write(tmp_path, f"inputs:\n  - {{path: {SAMPLE / 'alpaca_en_demo.json'}}}\n{line}\n", "p.yaml")
    with pytest.raises(ConfigError, match=expected):
        load_config(path)


def test_pipeline_cli_refuses_a_huge_batch_in_one_line(tmp_path, capsys):
    path = _write(tmp_path, f"inputs:\n  - {{path: {SAMPLE / 'alpaca_en_demo.json'}}}\n"
                            f"batch_rows: {10**20}\noutput: {tmp_path / 'out'}\n", "p.yaml")
    code, err = _cli(capsys, "run", str(path))
    assert code == 2 and err.startswith("dataguard: config error: ") and "batch_rows: " in err
    assert not (tmp_path / "out").exists()
