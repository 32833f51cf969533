"""The train config: defaults, both file shapes, overrides, and file:line:key errors."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from dataguard.config import ConfigError
from dataguard.train.config import TrainConfig, load_train_config


def _write(tmp_path, text: str, name: str = "t.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_standalone_defaults(tmp_path):
    cfg = load_train_config(_write(tmp_path, """
        task: classify
        model: minilm
        data: out/run
    """))
    assert isinstance(cfg, TrainConfig)
    assert (cfg.task, cfg.model, cfg.data, cfg.output) == ("classify", "minilm", "out/run", "out/run-train")
    assert cfg.lr == 2e-5 and cfg.batch_size == 8 and cfg.warmup_ratio == 0.1 and cfg.max_grad_norm == 1.0
    assert cfg.lr_multipliers == {"embeddings": 0.1, "attention": 1.0, "mlp": 1.5, "other": 1.0, "head": 1.0}
    assert cfg.clip_rules == {"embeddings": {"value": 0.5}, "attention": {"norm": 1.0}}
    assert cfg.label_smoothing == 0.1 and cfg.logit_adjustment and cfg.curriculum and cfg.lora is None
    d = cfg.to_dict()
    assert json.loads(json.dumps(d)) == d and d["task"] == "classify"


def test_pipeline_train_section_and_merges(tmp_path):
    cfg = load_train_config(_write(tmp_path, """
        inputs: [{path: x.csv}]
        output: out/cls
        stages: []
        train:
          task: sft
          model: tiny-causal-lm
          lr: 1.0e-4
          lr_multipliers: {mlp: 2.0}
          clip_rules: {embeddings: null, mlp: {norm: 0.5}}
          lora: {r: 4}
          lr_patterns: {"lm_head": 0.5}
    """))
    assert cfg.data == "out/cls" and cfg.output == "out/cls-train" and cfg.lr == 1e-4
    assert cfg.lr_multipliers["mlp"] == 2.0 and cfg.lr_multipliers["embeddings"] == 0.1
    assert cfg.clip_rules == {"mlp": {"norm": 0.5}}
    assert cfg.lora == {"r": 4, "alpha": 16, "dropout": 0.0, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    assert cfg.lr_patterns == {"lm_head": 0.5}


def test_dotted_overrides_merge(tmp_path):
    path = _write(tmp_path, """
        task: sft
        model: tiny-causal-lm
        data: d
        lora: {r: 4, alpha: 8}
    """)
    cfg = load_train_config(path, overrides={"lora.r": 2, "lr_patterns.model\\.norm": 0.5,
                                             "lr_multipliers": {"mlp": 3.0}})
    assert cfg.lora["r"] == 2 and cfg.lora["alpha"] == 8.0
    assert cfg.lr_patterns == {"model\\.norm": 0.5} and cfg.lr_multipliers["mlp"] == 3.0
    with pytest.raises(ConfigError, match=r"<override>: lora\.r: must be a positive integer"):
        load_train_config(path, overrides={"lora.r": -2})


def test_pipeline_without_train_section(tmp_path):
    with pytest.raises(ConfigError, match=r"t\.yaml:1: a pipeline config without a train: section"):
        load_train_config(_write(tmp_path, "inputs: [{path: x}]\nstages: []\n"))


def test_dict_and_overrides():
    cfg = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "d", "lora": True},
                            overrides={"max_steps": 5, "seed": 3})
    assert cfg.max_steps == 5 and cfg.seed == 3 and cfg.lora["r"] == 8
    with pytest.raises(ConfigError, match=r"^<override>: max_steps: must be a positive integer or null, got 0"):
        load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "d"}, overrides={"max_steps": 0})
    with pytest.raises(ConfigError, match=r"<override>: bogus: unknown key"):
        load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "d"}, overrides={"bogus": 1})


@pytest.mark.parametrize(("body", "expected"), [
    ("  lr: -1\n", r"p\.yaml:5: train\.lr: must be a positive number, got -1$"),
    ("  lrr: 0.1\n", r"p\.yaml:5: train\.lrr: unknown key \(expected one of: task, model, .*lr,"),
    ("  precision: fp4\n", r"p\.yaml:5: train\.precision: must be one of fp32, bf16, fp16, fp8, got 'fp4'"),
    ("  batch_size: 2.5\n", r"p\.yaml:5: train\.batch_size: must be a positive integer, got 2\.5"),
    ("  threads: 0\n", r"p\.yaml:5: train\.threads: must be a positive integer or null, got 0"),
    ("  lora:\n    r: 0\n", r"p\.yaml:6: train\.lora\.r: must be a positive integer, got 0"),
    ("  lora:\n    rank: 4\n", r"p\.yaml:6: train\.lora\.rank: unknown key \(expected one of: r, alpha"),
    ("  clip_rules:\n    mlp: {max: 1}\n", r"p\.yaml:6: train\.clip_rules\.mlp: must be \{value: X\} or \{norm: X\}"),
    ("  lr_multipliers:\n    ffn: 2\n", r"p\.yaml:6: train\.lr_multipliers\.ffn: unknown key \(expected one of: "
                                       r"embeddings, attention, mlp, other, head, norm\)$"),
    ("  lr_patterns:\n    '([': 2\n", r"p\.yaml:6: train\.lr_patterns\.\(\[: key must be a regular expression, "
                                        r"got '\(\[' \(unterminated character set at position 1\)$"),
    ("  label_smoothing: 1.0\n", r"p\.yaml:5: train\.label_smoothing: must be a number in \[0, 1\), got 1\.0$"),
    ("  curriculum: yes please\n", r"p\.yaml:5: train\.curriculum: must be true or false"),
    ("  curriculum_boundaries: [0.8, 0.5]\n", r"p\.yaml:5: train\.curriculum_boundaries: must be a list of increasing "
                                            r"values each a positive number <= 1 or null, got \[0\.8, 0\.5\]$"),
    ("  curriculum_boundaries: [0.5, 2]\n", r"p\.yaml:5: train\.curriculum_boundaries\[1\]: must be a positive "
                                          r"number <= 1, got 2$"),
    ("  warmup_steps: 10\n  max_steps: 5\n", r"p\.yaml:5: train\.warmup_steps: must not exceed max_steps \(5\)"),
])
def test_errors_name_file_line_key(tmp_path, body, expected):
    path = _write(tmp_path, "output: out\ntrain:\n  task: classify\n  model: minilm\n" + body, "p.yaml")
    with pytest.raises(ConfigError, match=expected):
        load_train_config(path)


def test_structural_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"t\.yaml:1: missing required key: data"):
        load_train_config(_write(tmp_path, "task: sft\nmodel: tiny-causal-lm\n"))
    with pytest.raises(ConfigError, match=r"t\.yaml:3: model: must be one of tiny-causal-lm, tiny-classifier, minilm, "
                                           r"smollm2-135m or a local Hugging Face model folder, got 'no/such/dir'$"):
        load_train_config(_write(tmp_path, "task: sft\ndata: d\nmodel: no/such/dir\n"))
    with pytest.raises(ConfigError, match=r"t\.yaml:1: task: must be one of sft, classify"):
        load_train_config(_write(tmp_path, "task: regress\ndata: d\nmodel: minilm\n"))
    with pytest.raises(ConfigError, match=r"t\.yaml:4: packing: packing applies to task sft only"):
        load_train_config(_write(tmp_path, "task: classify\ndata: d\nmodel: minilm\npacking: true\n"))
    with pytest.raises(ConfigError, match=r"t\.yaml:1: train: must be a mapping"):
        load_train_config(_write(tmp_path, "train: 3\n"))
    with pytest.raises(ConfigError, match=r"config file not found"):
        load_train_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"t\.yaml:2: .*duplicate key"):
        load_train_config(_write(tmp_path, "task: sft\ntask: sft\n"))


def test_local_model_folder_accepted(tmp_path):
    (tmp_path / "m").mkdir()
    cfg = load_train_config({"task": "sft", "model": str(tmp_path / "m"), "data": "d"})
    assert cfg.model == str(tmp_path / "m")


def test_train_package_never_imports_stages():
    """The runner reads only shards + manifest.json: no module of dataguard/train imports
    dataguard.stages (directly or relatively)."""
    root = Path(__file__).resolve().parent.parent / "dataguard" / "train"
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            for name in names:
                assert not name.startswith(("dataguard.stages", "..stages")), f"{path.name} imports {name}"
