"""Row weights mean what the manifest says (issue #23, section 2), through the real loop.

The loss of an optimizer step is ``sum(w * loss) / sum(w)`` over every micro-batch of the step
and every process (per supervised token for SFT). So the same rows with weights 1, 2 and 10
must give the same gradient as one batch of 3, as 3 accumulated batches of 1, and as one batch
of 3 split over 2 processes (slices of 2 and 1 rows); and with equal weights the step's loss
is the plain mean. The gradients are read where the loop clips them (before clipping, after
DDP's all-reduce), from `Trainer.fit` runs of one step on the tiny models, dropout off so that
a batch of 3 and three batches of 1 see the same network.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from dataguard.io.readers import InputSpec, file_sha256
from dataguard.io.writer import read_table, write_table
from dataguard.pipeline import Pipeline
from dataguard.train import loop
from dataguard.train.config import load_train_config
from dataguard.train.data import LabelMap, RunShards
from dataguard.train.loop import Trainer
from dataguard.train.model import tiny
from dataguard.train.tasks import get_task

REPO = Path(__file__).resolve().parent.parent
WEIGHTS = [1.0, 2.0, 10.0]
TOL = 1e-6


# ------------------------------------------------------------------ three rows, weights written into the shard
def _three_rows(folder: Path, task: str) -> Path:
    """A real pipeline run over three short rows (SFT: alpaca; classify: banking77, three labels)."""
    folder.mkdir(parents=True, exist_ok=True)
    if task == "sft":
        rows = json.loads((REPO / "sample_data/alpaca_en_demo.json").read_text())
        rows = sorted(rows, key=lambda r: len(json.dumps(r)))[:3]
        src = folder / "rows.json"
        src.write_text(json.dumps(rows))
        spec = InputSpec(path=str(src))
    else:
        lines = (REPO / "sample_data/banking77/train.csv").read_text().splitlines()
        picked, labels = [], set()
        for line in lines[1:]:
            label = line.rsplit(",", 1)[1]
            if label not in labels and len(line) < 60 and '"' not in line:
                picked.append(line)
                labels.add(label)
            if len(picked) == 3:
                break
        src = folder / "rows.csv"
        src.write_text("\n".join([lines[0], *picked]) + "\n")
        spec = InputSpec(path=str(src), format="labelled_text", aliases={"category": "label"})
    out = folder / "shards"
    Pipeline([], workers=1).run([spec], out)
    return out


def _weighted(base: Path, dst: Path, weights: list[float]) -> Path:
    """A copy of ``base`` whose shard carries ``sample_weight`` (the manifest's sha256 updated)."""
    shutil.copytree(base, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    (entry,) = manifest["outputs"]["data"]
    table = read_table(dst / entry["path"])
    assert table.num_rows == len(weights)
    write_table(dst / entry["path"], table.append_column("sample_weight", pa.array(weights, pa.float32())))
    entry["sha256"] = file_sha256(dst / entry["path"])
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rows")
    return {task: _three_rows(root / task, task) for task in ("sft", "classify")}


def _cfg(task: str, data: Path, out: Path, **kw: Any) -> Any:
    values = {"task": task, "data": str(data), "output": str(out), "max_steps": 1, "lr": 1e-3,
              "eval_fraction": 0.0, "eval_every": 100, "save_every": 100, "tensorboard": False, "seed": 5,
              "device": "cpu", "threads": 1}
    if task == "sft":
        values.update(model="tiny-causal-lm", max_length=256)
    else:
        values.update(model="tiny-classifier", max_length=32, label_smoothing=0.0, logit_adjustment=False)
    values.update(kw)
    return load_train_config(values)


def _no_dropout(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tiny.tiny_classifier

    def built(*args: Any, **kwargs: Any) -> Any:
        model = real(*args, **kwargs)
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        return model

    monkeypatch.setattr(tiny, "tiny_classifier", built)


def _first_step(cfg: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, torch.Tensor], float, Any]:
    """(gradients the loop is about to clip, logged loss, model) of a one-step run."""
    seen: dict[str, Any] = {}
    real = loop.clip_gradients

    def spy(model: Any, clip_cfg: Any, kinds: Any) -> Any:
        seen["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        seen["model"] = model
        seen["reference"] = _reference(model, cfg)  # same weights: before the optimizer moves them
        return real(model, clip_cfg, kinds)

    with monkeypatch.context() as m:
        _no_dropout(m)
        m.setattr(loop, "clip_gradients", spy)
        result = Trainer(cfg).fit()
    assert result.steps == 1 and result.skipped_steps == 0
    return seen["grads"], float(result.history[0]["loss"]), seen


def _reference(model: Any, cfg: Any) -> dict[str, Any]:
    """The step's weighted mean written out row by row (unpadded, one forward per row), and
    the plain mean, each with its gradient: what the loop has to reproduce."""
    run = RunShards.open(cfg.data, cfg.task)
    if cfg.task == "sft":
        tok = tiny.tiny_tokenizer()
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tiny.minilm_path(), local_files_only=True)
    label_map = LabelMap.from_run(run.table, run.training) if cfg.task == "classify" else None
    enc = get_task(cfg.task).encode(run.table, tok, max_length=cfg.max_length, label_map=label_map,
                                    allow_empty=False)  # the runner's encoder, every row
    assert len(enc) == 3
    sums, counts = [], []
    for i in range(len(enc)):
        ids = torch.tensor([enc.input_ids[i]])
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
        if cfg.task == "sft":
            labels = torch.tensor(enc.labels[i][1:])
            sums.append(F.cross_entropy(logits[0, :-1], labels, ignore_index=-100, reduction="sum"))
            counts.append(float((labels != -100).sum()))
        else:
            sums.append(F.cross_entropy(logits, torch.tensor([enc.labels[i]]), reduction="sum"))
            counts.append(1.0)
    w = [float(x) for x in enc.weights]
    weighted = sum(wi * s for wi, s in zip(w, sums, strict=True)) / sum(wi * c for wi, c in zip(w, counts, strict=True))
    plain = sum(sums) / sum(counts)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    g_weighted = torch.autograd.grad(weighted, params, retain_graph=True, allow_unused=True)
    g_plain = torch.autograd.grad(plain, params, allow_unused=True)
    return {"loss": float(weighted.detach()), "plain_loss": float(plain.detach()),
            "grads": {n: g for n, g in zip(names, g_weighted, strict=True) if g is not None},
            "plain_grads": {n: g for n, g in zip(names, g_plain, strict=True) if g is not None}}


def _apart(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ------------------------------------------------------------------ one process
@pytest.mark.parametrize("task", ["sft", "classify"])
def test_accumulated_batches_of_one_match_one_batch_of_three(task, bases, tmp_path, monkeypatch):
    data = _weighted(bases[task], tmp_path / "data", WEIGHTS)
    g3, loss3, seen3 = _first_step(_cfg(task, data, tmp_path / "b3", batch_size=3), monkeypatch)
    g1, loss1, seen1 = _first_step(_cfg(task, data, tmp_path / "b1x3", batch_size=1, grad_accum=3), monkeypatch)
    ref = seen3["reference"]
    print(f"\n{task}: |bs3 - bs1x3| = {_apart(g3, g1):.2e}, |bs3 - reference| = {_apart(g3, ref['grads']):.2e}, "
          f"|weighted - plain| = {_apart(ref['grads'], ref['plain_grads']):.2e}; losses {loss3:.6f} {loss1:.6f}")
    assert _apart(g3, g1) < TOL
    assert _apart(g3, ref["grads"]) < TOL and _apart(g1, seen1["reference"]["grads"]) < TOL
    assert loss3 == pytest.approx(ref["loss"], rel=1e-6) and loss1 == pytest.approx(ref["loss"], rel=1e-6)
    # the weights matter: the plain mean's gradient is far from the weighted one
    assert _apart(ref["grads"], ref["plain_grads"]) > 1000 * TOL


@pytest.mark.parametrize("task", ["sft", "classify"])
def test_equal_weights_give_the_plain_mean_of_the_step(task, bases, tmp_path, monkeypatch):
    data = _weighted(bases[task], tmp_path / "data", [2.5, 2.5, 2.5])
    grads, loss, seen = _first_step(_cfg(task, data, tmp_path / "run", batch_size=1, grad_accum=3), monkeypatch)
    ref = seen["reference"]
    assert loss == pytest.approx(ref["plain_loss"], rel=1e-6)  # per token (sft) / per row (classify)
    assert _apart(grads, ref["plain_grads"]) < TOL


# ------------------------------------------------------------------ two processes (torchrun, gloo on CPU)
_DRIVER = """
import json, os, sys
from pathlib import Path
import torch
from dataguard.train import loop
from dataguard.train.model import tiny
from dataguard.train.config import load_train_config

real_cls, real_clip = tiny.tiny_classifier, loop.clip_gradients

def no_dropout(*args, **kwargs):
    model = real_cls(*args, **kwargs)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model

tiny.tiny_classifier = no_dropout
out = Path(sys.argv[1])
for case in json.loads(sys.argv[2]):
    def spy(model, clip_cfg, kinds, name=case["name"]):
        if os.environ.get("RANK", "0") == "0":
            torch.save({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
                       out / (name + ".pt"))
        return real_clip(model, clip_cfg, kinds)
    loop.clip_gradients = spy
    loop.Trainer(load_train_config(case["config"])).fit()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(tmp: Path, processes: int, cases: list[dict[str, Any]]) -> Path:
    out = tmp / f"grads-{processes}"
    out.mkdir()
    driver = tmp / "driver.py"
    driver.write_text(_DRIVER)
    runs = [{"name": c["name"], "config": {**c["config"], "output": str(out / c["name"])}} for c in cases]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(driver), str(out), json.dumps(runs)]
    if processes > 1:
        cmd[1:2] = ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr",
                    "127.0.0.1", "--master_port", str(_free_port()), str(driver)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _loss(run: Path) -> float:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return next(x["loss"] for x in lines if "loss" in x)


def test_two_processes_with_unequal_slices_match_one(bases, tmp_path):
    """batch_size 3 over 2 ranks: slices of 2 rows and 1 row. DDP averages the two ranks'
    gradients equally, so each slice has to carry its share of the global denominator (x2)."""
    cases = []
    for task in ("sft", "classify"):
        data = _weighted(bases[task], tmp_path / f"data-{task}", WEIGHTS)
        for bs, ga in ((3, 1), (3, 2)):
            cfg = _cfg(task, data, tmp_path / "unused", batch_size=bs, grad_accum=ga).to_dict()
            cases.append({"name": f"{task}-bs{bs}-ga{ga}", "config": {k: v for k, v in cfg.items() if v is not None}})
    one, two = _launch(tmp_path, 1, cases), _launch(tmp_path, 2, cases)
    for case in cases:
        name = case["name"]
        assert json.loads((two / name / "run.json").read_text())["processes"] == 2
        g1, g2 = torch.load(one / f"{name}.pt"), torch.load(two / f"{name}.pt")
        print(f"\n{name}: |1 process - 2 processes| = {_apart(g1, g2):.2e}, "
              f"losses {_loss(one / name):.6f} {_loss(two / name):.6f}")
        assert _apart(g1, g2) < TOL, name
        assert _loss(two / name) == pytest.approx(_loss(one / name), rel=1e-6), name
