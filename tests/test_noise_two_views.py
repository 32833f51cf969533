"""The noise stage with cross-validated inputs and a training run's dynamics beside them
(`dataguard.stages.noise.two_views`): the method decides how many rows are flagged, the two
views' mean percentile rank decides which, rows the run never judged keep the cross-validated
rank, and every config mistake is one line naming the file, line and key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from banking_slice import BANKING, banking_rows, banking_shards
from config_errors import assert_one_line_errors

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stages.noise.dynamics import aggregate
from dataguard.stages.noise.stage import NoiseStage
from dataguard.stages.noise.two_views import percentile_ranks
from dataguard.train.config import load_train_config
from dataguard.train.data import RunShards
from dataguard.train.dynamics.file import read_dynamics
from dataguard.train.loop import Trainer

REPO = Path(__file__).resolve().parent.parent
CLASSES = ("card_arrival", "exchange_rate", "lost_or_stolen_card", "top_up_failed", "pin_blocked", "age_limit")


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory) -> tuple[pa.Table, str, set[str]]:
    """Six banking77 intents, 40 rows each, 36 labels flipped (seeded); a tiny classifier
    trained on them for 4 epochs with dynamics (10% held out, so some rows are never judged)."""
    tmp = tmp_path_factory.mktemp("two_views")
    picked = banking_rows(CLASSES, 40)
    rng = np.random.default_rng(3)
    flip = set(rng.choice(len(picked), size=36, replace=False).tolist())
    for i in flip:
        others = [c for c in CLASSES if c != picked[i]["category"]]
        picked[i] = {"text": picked[i]["text"], "category": others[int(rng.integers(len(others)))]}
    data = banking_shards(tmp, picked)
    run = tmp / "run"
    Trainer(load_train_config({"task": "classify", "model": "tiny-classifier", "data": str(data), "output": str(run),
                               "epochs": 4, "batch_size": 16, "lr": 3e-3, "save_every": 1000, "eval_every": 1000,
                               "tensorboard": False, "logit_adjustment": False, "threads": 1}), progress=False).fit()
    table = RunShards.open(data, task="classify").table
    ids = table.column("id").to_pylist()
    return table, str(run), {ids[i] for i in flip}


def _run(table: pa.Table, **params) -> tuple[NoiseStage, pa.Table, pa.Table]:
    stage = NoiseStage(features="tfidf", **params)
    stage.fit([stage.summarize(table)])
    out = stage.apply(table)
    return stage, out.kept, out.rejected


def test_percentile_ranks_share_ties_keep_nan_and_ignore_row_order():
    values = np.array([3.0, np.nan, 1.0, 3.0, 2.0])
    ranks = percentile_ranks(values)
    assert np.isnan(ranks[1])
    assert ranks[2] == pytest.approx(1 / 8) and ranks[4] == pytest.approx(3 / 8)
    assert ranks[0] == ranks[3] == pytest.approx(6 / 8)  # the two 3.0s share ranks 3 and 4 of 4
    perm = np.array([4, 2, 0, 1, 3])
    assert np.array_equal(percentile_ranks(values[perm]), ranks[perm], equal_nan=True)


def test_the_method_counts_and_both_views_pick_the_rows(noisy_run):
    table, run, _ = noisy_run
    plain, plain_out, _ = _run(table, min_rows_per_class=0)
    stage, out, _ = _run(table, min_rows_per_class=0, dynamics=run)
    ids = out.column("id").to_pylist()
    assert ids == plain_out.column("id").to_pylist()
    n_plain = sum(plain_out.column("is_label_issue").to_pylist())
    flags = np.asarray(out.column("is_label_issue").to_pylist(), dtype=bool)
    assert 0 < n_plain == flags.sum()  # how many: confident learning's count, unchanged

    # the combined rank by hand: the cross-validated label quality's percentile rank and the
    # run's AUM rank among the rows it judged, averaged; the CV rank alone for the rest
    cv = percentile_ranks(np.asarray(plain_out.column("label_quality").to_pylist(), dtype=np.float64))
    rows = aggregate(read_dynamics(run)[0])
    aum = dict(zip(rows.ids, rows.aum, strict=True))
    dyn = percentile_ranks(np.array([aum.get(i, np.nan) for i in ids]))
    want = np.where(np.isfinite(dyn), (cv + dyn) / 2, cv)
    assert np.allclose(np.asarray(out.column("label_quality").to_pylist()), want, atol=1e-6)
    unjudged = ~np.isfinite(dyn)
    assert 0 < unjudged.sum() < len(ids)  # the held-out split: never trained on, CV rank alone
    order = np.lexsort((np.arange(len(ids)), want))
    assert set(np.flatnonzero(flags)) == set(order[:n_plain].tolist())
    assert stage.describe()["summary"]["second_view"] == {"runs": [run], "score": "aum",
                                                          "rows_judged": int((~unjudged).sum()),
                                                          "rows_unjudged": int(unjudged.sum()),
                                                          "rows_other_label": 0}
    assert "second_view" not in plain.describe()["summary"]


def test_drop_rejects_the_flagged_rows_with_the_rule_and_loses_none(noisy_run):
    table, run, flipped = noisy_run
    _, kept, rejected = _run(table, dynamics=run, action="drop")
    assert kept.num_rows + rejected.num_rows == table.num_rows
    assert rejected.num_rows > 0 and set(rejected.column("reason").to_pylist()) == {"label_issue"}
    assert all("training AUM" in d for d in rejected.column("detail").to_pylist())
    found = flipped & set(rejected.column("id").to_pylist())
    assert len(found) / rejected.num_rows > 36 / 240  # better than a random pick of the same size


def test_rare_classes_and_the_budget_act_on_the_combined_rank(noisy_run):
    table, run, _ = noisy_run
    _, out, _ = _run(table, dynamics=run, max_flagged=5)
    flags = np.asarray(out.column("is_label_issue").to_pylist(), dtype=bool)
    quality = np.asarray(out.column("label_quality").to_pylist())
    assert flags.sum() == 5 and quality[flags].max() <= quality[~flags].min()
    _, out, _ = _run(table, dynamics=run, min_rows_per_class=40)  # every class keeps all 40 or fewer
    labels = out.column("label").to_pylist()
    flags = np.asarray(out.column("is_label_issue").to_pylist(), dtype=bool)
    for c in set(labels):
        rows = [i for i, lab in enumerate(labels) if lab == c]
        assert len(rows) - flags[rows].sum() >= min(len(rows), 40)


def test_config_mistakes_are_one_line(noisy_run, tmp_path):
    _, run, _ = noisy_run
    sft_data = tmp_path / "sft"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], sft_data)
    sft_run = tmp_path / "sft_run"
    Trainer(load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": str(sft_data), "output": str(sft_run),
                               "max_steps": 2, "batch_size": 4, "max_length": 64, "save_every": 1000,
                               "eval_every": 1000, "tensorboard": False, "threads": 1}), progress=False).fit()
    base = f"inputs:\n  - path: {BANKING}\n    format: labelled_text\n    aliases: {{category: label}}\nstages:\n"
    cases = {
        f"  - noise: {{features: tfidf, dynamics: {sft_run}}}\n": r"p\.yaml:6: stages\[0\]\.noise\.dynamics: beside "
                                                                  r"cross-validated inputs the run must be a classify",
        f"  - noise: {{features: tfidf, dynamics: {run}, rounds: 2}}\n": r"noise\.rounds: rounds > 1 .* use rounds: 1",
        f"  - noise: {{features: tfidf, dynamics: {run}, dynamics_cut: 0.5}}\n": r"noise\.dynamics_cut: applies only",
        f"  - noise: {{features: tfidf, dynamics: {tmp_path}}}\n": r"noise\.dynamics: .*no dynamics\.arrow",
    }
    assert_one_line_errors(tmp_path, base, cases)
