"""Issue 22, section 2: what the runner is handed is checked before any training.

A: a hand-edited or foreign ``manifest.json`` is checked against its typed schema (and its
row counts and classes against the shards) when the config is loaded: one line naming
manifest.json, the value's line and its key path, exit 2; `RunShards.open` raises the same.
B: config values are range-checked at load time (one ``file:line: key`` error, exit 2), and
YAML 1.1's numbers-read-as-text (``1e300``: no dot) say "a number out of range", not "not a
number". The defaults pass the same checks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from dataguard.cli import main
from dataguard.config import ConfigError, load_config
from dataguard.config_yaml import Located
from dataguard.train import config_checks as C
from dataguard.train.config import TrainConfig, checked_setting, load_train_config
from dataguard.train.data import RunShards, class_vector, curriculum_schedule
from dataguard.train.data.labels import LabelMap
from dataguard.train.data.manifest_schema import ManifestError
from dataguard.train.tasks import get_task

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
    ("lr: 1e300", r"t\.yaml:4: lr: must be a positive number <= 10, got '1e300' \(a number out of range\)$"),
    ("lr: 1.0e308", r"t\.yaml:4: lr: must be a positive number <= 10, got '1\.0e308' \(a number out of range\)$"),
    ("lr: 1e400", r"t\.yaml:4: lr: must be a positive number <= 10, got '1e400' \(a number out of range\)$"),
    ("lr: .inf", r"t\.yaml:4: lr: must be a positive number <= 10, got inf$"),
    ("lr: -1", r"t\.yaml:4: lr: must be a positive number, got -1$"),
    ("lr: 2e-5", r"t\.yaml:4: lr: must be a positive number <= 10, got '2e-5' \(YAML reads it as text: write "
                 r"2\.0e-5\)$"),
    (f"seed: {2**70}", rf"t\.yaml:4: seed: must be an integer in \[0, {2**63 - 1}\], got {2**70}$"),
    ("seed: 1e30", r"t\.yaml:4: seed: must be an integer in \[0, \d+\], got '1e30' \(a number out of range\)$"),
    (f"threads: {10**9}", r"t\.yaml:4: threads: must be a positive integer <= 4096 or null, got 1000000000$"),
    (f"max_steps: {10**30}", rf"t\.yaml:4: max_steps: must be a positive integer <= 1000000000 or null, "
                             rf"got {10**30}$"),
    ("max_steps: 1e30", r"t\.yaml:4: max_steps: .* got '1e30' \(a number out of range\)$"),
    ("max_steps: 1e3", r"t\.yaml:4: max_steps: must be a positive integer <= 1000000000 or null, got '1e3' "
                       r"\(YAML reads it as text: write 1000\)$"),
    ("min_lr: 0.1", r"t\.yaml:4: min_lr: must not exceed lr \(2e-05\), got 0\.1$"),
    ("min_lr: 1.0e+300", r"t\.yaml:4: min_lr: must be a number in \[0, 10\], got 1e\+300$"),
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


@pytest.mark.parametrize("line", ["lr: 1.0e+300", "lr: 1e300", f"seed: {2**70}", f"threads: {10**9}", f"max_steps: {10**30}",
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
        assert checked_setting(f.name, default, (f.name,), loc) == default, f.name
    cfg = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "d"})
    assert load_train_config(cfg.to_dict()) == cfg
    for path in sorted((REPO / "pipelines").glob("train_*.yaml")):  # the shipped examples load too
        assert load_train_config(path).lr <= C.MAX_LR


@pytest.mark.parametrize(("line", "expected"), [
    ("batch_rows: 100000000000000000000", r"p\.yaml:3: batch_rows: must be a positive integer <= 1000000000, "
                                          r"got 100000000000000000000$"),
    ("batch_rows: 1e20", r"p\.yaml:3: batch_rows: must be a positive integer <= 1000000000, got '1e20' "
                         r"\(a number out of range\)$"),
    ("batch_rows: 1e3", r"p\.yaml:3: batch_rows: must be a positive integer <= 1000000000, got '1e3' \(YAML "
                        r"reads it as text: write 1000\)$"),
    ("workers: 100000", r"p\.yaml:3: workers: must be a positive integer <= 4096 or null, got 100000$"),
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


# ------------------------------------------------------------------ A: the manifest's typed schema
@pytest.fixture(scope="module")
def cls_run(tmp_path_factory) -> Path:
    """banking77 -> length (the length section) -> longtail (classes, offsets, curriculum)."""
    tmp = tmp_path_factory.mktemp("cls")
    path = tmp / "cls.yaml"
    path.write_text(f"inputs:\n  - {{path: {SAMPLE / 'banking77' / 'train.csv'}, format: labelled_text, "
                    "aliases: {category: label}}\n"
                    "stages:\n  - length: {percentile: 90, factor: 1.0, action: truncate}\n"
                    "  - longtail: {tau: 1.0, phases: [0.5, 0.8], tail_boost: 2.0, seed: 0}\n")
    cfg = load_config(path)
    cfg.pipeline(workers=1).run(cfg.inputs, tmp / "out")
    return tmp / "out"


def _edited(run: Path, tmp_path: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of ``run`` whose manifest.json went through ``edit`` (written as the pipeline
    writes it, so the error's line can be checked)."""
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    edit(manifest)
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return dst


def _classify_yaml(tmp_path: Path, data: Path) -> Path:
    return _write(tmp_path, f"task: classify\nmodel: tiny-classifier\ndata: {data}\n"
                            f"output: {tmp_path / 'train'}\nmax_steps: 2\ntensorboard: false\n", "c.yaml")


def _lt(m: dict) -> dict:
    return m["training"]["longtail"]


def _set(get: Callable[[dict], dict], key: str, value) -> Callable[[dict], None]:
    return lambda m: get(m).__setitem__(key, value)


def _keep_first(n: int) -> Callable[[dict], None]:
    """Every per-class list cut to its first n classes, consistently (a 'shortened' copy)."""
    def edit(m: dict) -> None:
        state = _lt(m)
        for key in ("classes", "counts", "priors", "logit_offsets", "class_weights"):
            state[key] = state[key][:n]
        cur = state["curriculum"]
        cur["class_phase"] = cur["class_phase"][:n]
        cur["phase_multipliers"] = [row[:n] for row in cur["phase_multipliers"]]
    return edit


def _offset(i: int, value: float) -> Callable[[dict], None]:
    return lambda m: _lt(m)["logit_offsets"].__setitem__(i, value)


BAD_MANIFESTS = [
    # tracebacks before (ValueError, IndexError, AttributeError deep in the runner)
    ("boundaries_text", lambda m: _lt(m)["curriculum"].__setitem__("boundaries", "soon"),
     "training.longtail.curriculum.boundaries", r"must be increasing fractions in \(0, 1\], got 'soon'"),
    ("classes_longer", lambda m: _lt(m)["classes"].append("extra_class"),
     "training.longtail.counts",
     r"must hold one value per class \(78 in training\.longtail\.classes\), got 77"),
    ("short_multiplier_row", lambda m: _lt(m)["curriculum"]["phase_multipliers"][1].pop(),
     "training.longtail.curriculum.phase_multipliers[1]", r"must hold one multiplier per class \(77\), got 76"),
    ("data_paths_as_strings", lambda m: m["outputs"].__setitem__("data", [e["path"] for e in m["outputs"]["data"]]),
     "outputs.data[0]", r"must be a mapping, got 'data/data-00000\.arrow'"),
    ("data_as_mapping", lambda m: m["outputs"].__setitem__("data", {e["path"]: e for e in m["outputs"]["data"]}),
     "outputs.data", r"must be a non-empty list, got \{'data/data-00000\.arrow': \{.*\.\.\."),
    ("training_as_list", lambda m: m.__setitem__("training", list(m["training"].values())),
     "training", r"must be a mapping or null, got \[\{.*\.\.\."),
    ("counts_as_list", _set(lambda m: m, "counts", [1, 2]), "counts", r"must be a mapping or null, got \[1, 2\]"),
    ("length_cap_text", _set(lambda m: m["training"]["length"], "cap", "25 tokens"),
     "training.length.cap", r"must be a positive integer or null, got '25 tokens'"),
    # accepted silently before
    ("classes_shortened", lambda m: _lt(m)["classes"].pop(),
     "training.longtail.counts", r"must hold one value per class \(76 in training\.longtail\.classes\), got 77"),
    ("classes_shortened_everywhere", _keep_first(70), "training.longtail.classes",
     r"does not list 7 labels of the shards \(('\w+', ){5}\.\.\.\); the manifest is not this run's, "
     r"or was edited \(rerun the pipeline\)"),
    ("classes_as_ints", lambda m: _lt(m).__setitem__("classes", list(range(77))),
     "training.longtail.classes[0]", r"must be a class name \(a string\), got 0"),
    ("classes_twice", lambda m: _lt(m)["classes"].__setitem__(1, _lt(m)["classes"][0]),
     "training.longtail.classes[1]", r"'\w+' is listed twice \(also at \[0\]\)"),
    ("offset_nan", _offset(3, math.nan), "training.longtail.logit_offsets[3]",
     r"must be a finite number or null, got nan"),
    ("offset_inf", _offset(0, -math.inf), "training.longtail.logit_offsets[0]",
     r"must be a finite number or null, got -inf"),
    ("offsets_all_nan", lambda m: _lt(m).__setitem__("logit_offsets", [math.nan] * 77),
     "training.longtail.logit_offsets[0]", r"must be a finite number or null, got nan"),
    ("weight_negative", lambda m: _lt(m)["class_weights"].__setitem__(5, -1.0),
     "training.longtail.class_weights[5]", r"must be a finite number >= 0, got -1\.0"),
    ("shard_rows", _set(lambda m: m["outputs"]["data"][0], "rows", 1000), "outputs.data[0].rows",
     r"says 1000 rows but the shard data/data-00000\.arrow holds \d+"),
    ("rows_kept", _set(lambda m: m["counts"], "rows_kept", 10), "counts.rows_kept",
     r"says 10 rows but the shards hold \d+"),
    ("curriculum_unit", _set(lambda m: _lt(m)["curriculum"], "unit", "weeks"), "training.longtail.curriculum.unit",
     r"must be one of steps, epochs, got 'weeks'"),
    ("boundaries_short", _set(lambda m: _lt(m)["curriculum"], "boundaries", [0.5]),
     "training.longtail.curriculum.boundaries", r"3 phases need 2 boundaries, got \[0\.5\]"),
    ("shard_outside", _set(lambda m: m["outputs"]["data"][0], "path", "../../elsewhere.arrow"),
     "outputs.data[0].path", r"must be a relative path inside the run folder, got '\.\./\.\./elsewhere\.arrow'"),
]


@pytest.mark.parametrize(("edit", "key", "message"), [c[1:] for c in BAD_MANIFESTS],
                         ids=[c[0] for c in BAD_MANIFESTS])
def test_bad_manifest_is_refused_in_one_line(cls_run, tmp_path, capsys, edit, key, message):
    run = _edited(cls_run, tmp_path, edit)
    manifest = run / "manifest.json"
    code, err = _cli(capsys, "train", str(_classify_yaml(tmp_path, run)))
    assert code == 2, err
    m = re.fullmatch(rf"dataguard: config error: {re.escape(str(manifest))}:(\d+): {re.escape(key)}: {message}",
                     err)
    assert m, err
    if not key.endswith("]"):  # the line named is the key's own line in the file
        line = manifest.read_text().splitlines()[int(m.group(1)) - 1]
        assert f'"{key.rsplit(".", 1)[-1]}"' in line, (key, line)
    assert not (tmp_path / "train").exists()  # nothing was made: refused before the run
    with pytest.raises(ManifestError, match=rf"^{re.escape(str(manifest))}:\d+: {re.escape(key)}: {message}$"):
        RunShards.open(run, task="classify")  # the library path says the same


def test_pipeline_manifest_passes_and_lines_up(cls_run, tmp_path):
    """The pipeline's own manifest passes, and the checked values are what the runner uses."""
    cfg = load_train_config(_classify_yaml(tmp_path, cls_run))
    run = RunShards.open(cfg.data, task="classify")
    labels = LabelMap.from_run(run.table, run.training)
    assert labels.classes == run.training["longtail"]["classes"] and len(labels) == 77
    offsets = class_vector(run.training, labels, "logit_offsets")
    assert offsets is not None and all(math.isfinite(v) for v in offsets)
    mult, bounds = curriculum_schedule(run.training, labels)
    assert bounds == [0.25, 0.5] and [len(r) for r in mult] == [77, 77, 77]


def _class_without_rows(m: dict) -> None:
    """A class the shards no longer hold (a later stage dropped its rows): listed, no rows."""
    state = _lt(m)
    for key, value in (("classes", "ghost"), ("counts", 0), ("priors", 0.0), ("logit_offsets", None),
                       ("class_weights", 1.0)):
        state[key].append(value)
    state["curriculum"]["class_phase"].append(3)
    for row in state["curriculum"]["phase_multipliers"]:
        row.append(1.0)


@pytest.fixture(scope="module")
def tokenizer():
    """The built-in tiny classifier's tokenizer (offline MiniLM WordPiece)."""
    from transformers import AutoTokenizer

    from dataguard.train.model.tiny import minilm_path

    return AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)


@pytest.mark.parametrize("edit", [
    _offset(3, None),  # the pipeline writes null for a class of prior 0
    _class_without_rows,
    lambda m: m["outputs"]["data"][0].pop("rows"),  # an older manifest: no per-shard rows
    _set(lambda m: m, "zz_newer_pipeline_key", {"anything": [1, "x"]}),  # keys the runner never reads
], ids=["null_offset", "class_without_rows", "no_rows_field", "unknown_keys"])
def test_manifest_variants_the_runner_can_use_are_accepted(cls_run, tmp_path, tokenizer, edit):
    run = _edited(cls_run, tmp_path, edit)
    cfg = load_train_config(_classify_yaml(tmp_path, run))
    shards = RunShards.open(cfg.data, task="classify")
    label_map = LabelMap.from_run(shards.table, shards.training)  # as setup_run builds them
    encoded = get_task("classify").encode(shards.table, tokenizer, max_length=16, label_map=label_map,
                                          allow_empty=False)
    n = len(label_map)
    assert n == len(shards.training["longtail"]["classes"]) and len(encoded) == shards.table.num_rows
    schedule = curriculum_schedule(shards.training, label_map)
    assert schedule is not None and all(len(row) == n for row in schedule[0])


def test_a_folder_without_manifest_is_left_to_the_runner(tmp_path):
    """The config of a run not made yet loads; opening it says what is missing."""
    (tmp_path / "empty").mkdir()
    cfg = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": str(tmp_path / "empty")})
    with pytest.raises(Exception, match="no manifest.json"):
        RunShards.open(cfg.data)


def test_unreadable_manifest_is_a_config_error(cls_run, tmp_path, capsys):
    run = _edited(cls_run, tmp_path, lambda m: None)
    (run / "manifest.json").write_text('{"outputs": {"data": [}')
    code, err = _cli(capsys, "train", str(_classify_yaml(tmp_path, run)))
    assert code == 2 and err.startswith(f"dataguard: config error: {run / 'manifest.json'}: unreadable manifest")
    (run / "manifest.json").write_text(json.dumps([1, 2]))
    code, err = _cli(capsys, "train", str(_classify_yaml(tmp_path, run)))
    assert code == 2 and "not a dataguard manifest" in err
    (run / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)  # deeper than json can parse
    code, err = _cli(capsys, "train", str(_classify_yaml(tmp_path, run)))
    assert code == 2 and err.endswith("manifest.json: unreadable manifest: nested too deeply")
