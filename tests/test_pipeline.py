"""End-to-end runs: nothing lost, deterministic bytes, readable shards, resumable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pyarrow as pa
import pytest

from dataguard.io.readers import InputSpec
from dataguard.io.writer import read_table
from dataguard.pipeline import Pipeline, plan_segments
from dataguard.records import CANONICAL_COLUMNS
from dataguard.stages.dedup import DedupStage
from dataguard.stages.normalize import Normalizer

REPO = Path(__file__).resolve().parent.parent


def _inputs(data: Path) -> list[InputSpec]:
    return [
        InputSpec(path=data / "alpaca_en_demo/alpaca_en_demo.json", name="alpaca"),
        InputSpec(path=data / "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json", name="glaive"),
        InputSpec(path=data / "messages_kto_demo/v1_sft_demo.jsonl", name="parts"),
        InputSpec(path=data / "banking77/test.csv", name="banking", format="labelled_text",
                  aliases={"category": "label"}),
    ]


def _bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for sub in ("data", "rejected") for p in sorted((folder / sub).glob("*.arrow"))}


def test_plan_fuses_row_local_stages_and_splits_at_fits() -> None:
    from dataguard.stage import Stage

    class Local(Stage):
        name = "local"

    # step 0 is the source adapter (the normalizer): it opens the first segment like any step
    segments = plan_segments([Normalizer(), Local(), DedupStage(), Local(), Local()])
    assert [s.ops for s in segments] == [
        [("source", 0), ("score", 1), ("apply", 1), ("score", 2), ("summarize", 2)],
        [("apply", 2), ("score", 3), ("apply", 3), ("score", 4), ("apply", 4)],
    ]
    assert segments[0].fit_step == 2 and segments[1].fit_step is None


def test_real_data_nothing_lost_and_shards_open_everywhere(real_data: Path, tmp_path: Path) -> None:
    result = Pipeline([DedupStage(action="drop")], batch_rows=700, shard_rows=1500).run(
        _inputs(real_data), tmp_path / "out")
    counts = result.manifest["counts"]
    assert counts["rows_in"] == 999 + 300 + 500 + 3080
    assert counts["rows_in"] == counts["rows_kept"] + counts["rows_rejected"] and counts["balanced"]
    # per-stage bookkeeping adds up too
    normalize, dedup = result.manifest["stages"]
    assert normalize["rows_in"] == counts["rows_in"]
    assert dedup["rows_in"] == normalize["rows_kept"]
    assert dedup["rows_kept"] == counts["rows_kept"]
    parts_file = real_data / "messages_kto_demo/v1_sft_demo.jsonl"
    with_slots = sum("{{" in line for line in parts_file.read_text().splitlines())
    assert normalize["reasons"]["unfilled_placeholder"] == with_slots == 50
    assert dedup["reasons"].get("exact_duplicate", 0) >= 1
    # shards: several, readable by pyarrow, datasets.from_file and load_dataset("arrow")
    files = result.manifest["outputs"]["data"]
    assert len(files) == -(-counts["rows_kept"] // 1500)
    table = pa.concat_tables([read_table(tmp_path / "out" / f["path"]) for f in files])
    assert tuple(table.column_names[:5]) == CANONICAL_COLUMNS
    first = datasets.Dataset.from_file(str(tmp_path / "out" / files[0]["path"]))
    assert len(first) == files[0]["rows"]
    loaded = datasets.load_dataset("arrow", data_files=str(tmp_path / "out/data/*.arrow"), split="train")
    assert len(loaded) == counts["rows_kept"]
    # every rejected row has a stage and a reason
    rejected = result.rejected_table()
    assert rejected.num_rows == counts["rows_rejected"]
    assert all(rejected.column("reason").to_pylist()) and all(rejected.column("stage").to_pylist())
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert {i["name"]: i["rows"] for i in manifest["inputs"]} == {
        "alpaca": 999, "glaive": 300, "parts": 500, "banking": 3080}
    assert all(len(i["sha256"]) == 64 for i in manifest["inputs"])
    assert manifest["packages"]["pyarrow"] == pa.__version__


def test_bad_input_is_rejected_with_reasons(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join([
        b'{"instruction": "Say hi", "output": "Hi!"}',
        b'{"instruction": "broken',
        b"\xff\xfe\xfd",
        b'"just a string"',
        b'{"instruction": 5, "output": ["not", "text"]}',
        b'{"messages": [{"role": "assistant", "content": "I speak first"}]}',
        b'{"foo": "bar"}',
    ]))
    empty = tmp_path / "empty.json"
    empty.write_text("")
    result = Pipeline([]).run([InputSpec(path=bad), InputSpec(path=empty)], tmp_path / "out")
    assert result.rows_in == 8 and result.rows_kept == 1 and result.rows_rejected == 7
    reasons = result.rejected_table().column("reason").to_pylist()
    assert {"invalid_json", "invalid_utf8", "empty_file"} <= set(reasons)
    assert len(set(reasons)) >= 6  # each kind of problem has its own reason code


def test_parallel_and_serial_runs_are_byte_identical(real_data: Path, tmp_path: Path) -> None:
    inputs = _inputs(real_data)[:3]
    Pipeline([DedupStage()], workers=1, batch_rows=400).run(inputs, tmp_path / "a")
    Pipeline([DedupStage()], workers=2, batch_rows=400).run(inputs, tmp_path / "b")
    a, b = _bytes(tmp_path / "a"), _bytes(tmp_path / "b")
    assert a and a == b
    assert (tmp_path / "a/manifest.json").read_bytes() == (tmp_path / "b/manifest.json").read_bytes()


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dataguard.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_killed_run_resumes_to_identical_output(real_data: Path, tmp_path: Path) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(
        "inputs:\n"
        f"  - {{path: {real_data / 'gpteacher_toolformer/toolformer-dedupe-only-dataset.head1000.json'}, name: toolformer}}\n"
        f"  - {{path: {real_data / 'alpaca_en_demo/alpaca_en_demo.json'}, name: alpaca}}\n"
        "stages:\n  - dedup: {action: drop}\n"
        "batch_rows: 150\nworkers: 1\nreport: false\n")
    clean = _cli("run", str(config), "--output", str(tmp_path / "clean"), "--no-report")
    assert clean.returncode == 0, clean.stderr

    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "dataguard.cli", "run", str(config), "--output", str(out),
                             "--no-report"], cwd=REPO, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "_work").glob("seg0*/*.meta.json"))) < 5:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(list((out / "_work").glob("seg0*/*.meta.json")))
    assert not (out / "manifest.json").exists(), "run finished before it could be killed"
    assert done_before >= 5

    resumed = _cli("run", str(config), "--output", str(out), "--no-report")
    assert resumed.returncode == 0, resumed.stderr
    assert _bytes(out) == _bytes(tmp_path / "clean")
    assert (out / "manifest.json").read_bytes() == (tmp_path / "clean/manifest.json").read_bytes()
    assert not (out / "_work").exists()


def test_cli_inspect_and_errors(real_data: Path, tmp_path: Path) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(f"inputs:\n  - path: {REPO / 'sample_data/messages_content_parts.jsonl'}\n"
                      "stages:\n  - dedup: {action: flag}\n")
    run = _cli("run", str(config), "--output", str(tmp_path / "o"), "--no-report")
    assert run.returncode == 0, run.stderr
    assert "rows in 250" in run.stdout
    inspect = _cli("inspect", str(tmp_path / "o"))
    assert inspect.returncode == 0
    assert "unfilled_placeholder" in inspect.stdout and "{{name}}" in inspect.stdout
    missing = _cli("inspect", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "no manifest.json" in missing.stderr
    no_output = _cli("run", str(config))
    assert no_output.returncode == 2 and "no output folder" in no_output.stderr
    for sub in ("run", "inspect", "report"):
        assert _cli(sub, "--help").returncode == 0


@pytest.mark.parametrize("text,needle", [
    ("inputs:\n  - path: sample_data/alpaca_en_demo.json\nstagse: []\n", ":3: stagse: unknown key"),
    ("inputs:\n  - path: sample_data/nope.json\n", ":2: inputs[0].path: file not found"),
    ("inputs:\n  - path: sample_data/alpaca_en_demo.json\nstages:\n  - dedup: {acton: drop}\n",
     ":4: stages[0].dedup.acton: unknown parameter"),
    ("inputs:\n  - path: sample_data/alpaca_en_demo.json\nstages:\n  - dedup: {action: explode}\n",
     ":4: stages[0].dedup.action"),
    ("inputs:\n  - path: sample_data/alpaca_en_demo.json\nstages:\n  - nosuch: {}\n",
     ":4: stages[0].nosuch: unknown stage"),
    ("inputs:\n  - path: sample_data/alpaca_en_demo.json\nworkers: two\n", ":3: workers: must be a positive integer"),
    ("inputs:\n  - path: sample_data/alpaca_en_demo.json\n    format: alpacca\n", ":3: inputs[0].format: unknown format"),
    ("inputs: [\n", "invalid YAML"),
])
def test_config_errors_name_file_line_and_key(tmp_path: Path, text: str, needle: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    result = _cli("run", str(config), "--output", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert str(config) in result.stderr and needle in result.stderr, result.stderr


def test_shards_cut_by_bytes_keep_every_row_in_order(real_data: Path, tmp_path: Path) -> None:
    spec = [InputSpec(path=real_data / "alpaca_en_demo/alpaca_en_demo.json", name="alpaca")]
    whole = Pipeline([], workers=1).run(spec, tmp_path / "whole")
    cut = Pipeline([], workers=1, shard_bytes=200_000).run(spec, tmp_path / "cut")
    files = cut.manifest["outputs"]["data"]
    assert len(files) >= 3
    assert all(f["bytes"] < 400_000 for f in files)
    assert sum(f["rows"] for f in files) == whole.rows_kept == 999
    assert cut.kept_table().column("id").to_pylist() == whole.kept_table().column("id").to_pylist()


def test_run_writes_report_by_default_and_report_rebuilds_it(tmp_path: Path) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(f"inputs:\n  - path: {REPO / 'sample_data/messages_content_parts.jsonl'}\n"
                      "stages:\n  - dedup: {action: drop}\nworkers: 1\n")
    out = tmp_path / "o"
    run = _cli("run", str(config), "--output", str(out))
    assert run.returncode == 0, run.stderr
    html = out / "audit.html"
    first = html.read_text()
    assert "unfilled_placeholder" in first and (out / "audit.json").is_file()
    html.unlink()
    rebuilt = _cli("report", str(out), "--html", str(tmp_path / "again.html"))
    assert rebuilt.returncode == 0, rebuilt.stderr
    again = (tmp_path / "again.html").read_text()
    assert "unfilled_placeholder" in again and "exact_duplicate" not in again  # no dups in this slice
    stats = json.loads((tmp_path / "again.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert stats["counts"] == manifest["counts"]  # the machine-readable twin sits beside the page
    assert stats["counts"]["rows_in"] == 250 and stats["nothing_lost"]


def test_manifest_records_every_parameter_with_its_default(tmp_path):
    """A config that relies on defaults still says, in the manifest, what ran."""
    from sklearn.linear_model import LogisticRegression

    from dataguard.config import load_config
    from dataguard.run.manifest import params_json as _params_json
    from dataguard.stages.noise.stage import NoiseStage

    src = Path(__file__).resolve().parent.parent / "sample_data" / "alpaca_en_demo.json"
    spec = tmp_path / "p.yaml"
    spec.write_text(f"inputs:\n  - path: {src}\noutput: {tmp_path / 'out'}\nstages:\n  - dedup: {{action: drop}}\n")
    cfg = load_config(spec)
    manifest = cfg.pipeline(workers=1).run(cfg.inputs, cfg.output).manifest
    by_name = {s["name"]: s for s in manifest["stages"]}
    assert by_name["dedup"]["params"] == {"action": "drop", "scope": "messages"}  # scope: the default
    assert by_name["normalize"]["params"]["check_placeholders"] is True
    assert manifest["config"]["stages"] == [{"dedup": {"action": "drop"}}]  # the config as written
    # defaults that matter for reproducibility are there; an estimator object is named by its repr
    noise = _params_json(NoiseStage(classifier=LogisticRegression(C=2.0)))
    assert noise["features"] == "auto" and noise["min_rows_per_class"] == 5
    assert noise["classifier"] == "LogisticRegression(C=2.0)"


def test_manifest_packages_are_dataguards_requirements_that_shape_outputs() -> None:
    """The package list is derived from dataguard's own requirements; whatever is left out
    says why (tooling, the report, the training runner), so a new dependency is recorded
    unless someone decides otherwise."""
    import re
    import tomllib

    from dataguard.run.manifest import _NOT_RECORDED, recorded_packages

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    names = {re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0].lower() for r in declared}
    recorded = recorded_packages()
    assert recorded[0] == "dataguard" and len(recorded) == len(set(recorded))
    assert set(recorded) == {"dataguard"} | (names - set(_NOT_RECORDED))
    assert {"pyarrow", "tiktoken", "torch", "scikit-learn", "ray"} <= set(recorded)
