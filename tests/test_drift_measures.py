"""KL divergence and the MMD permutation test: hand values, and verdicts on real banking77 splits."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dataguard.stage import StageConfigError
from dataguard.stages.drift import DriftStage
from dataguard.stats.features import numeric_feature
from dataguard.stats.kl import kl_from_counts
from dataguard.stats.mmd import mmd_test, mmd_verdict
from dataguard.stats.psi import psi_from_counts


def _run(stage: DriftStage, table: pa.Table, batch: int = 2500) -> None:
    parts = [table.slice(i, batch) for i in range(0, table.num_rows, batch)]
    stage.fit([stage.summarize(p) for p in parts])
    stage.absorb([stage.apply(p).stats for p in parts])


def test_kl_matches_hand_computation_and_psi_is_its_symmetric_sum() -> None:
    ref, act = [50, 30, 20], [40, 40, 20]
    by_hand = 0.4 * math.log(0.4 / 0.5) + 0.4 * math.log(0.4 / 0.3) + 0.2 * math.log(0.2 / 0.2)
    assert kl_from_counts(ref, act) == pytest.approx(by_hand, abs=1e-12)
    assert kl_from_counts(ref, ref) == 0.0
    reverse = kl_from_counts(act, ref)
    assert psi_from_counts(ref, act) == pytest.approx(by_hand + reverse, abs=1e-12)
    # an empty bin on one side is finite (epsilon, then renormalised); an empty side is NaN
    assert 0 < kl_from_counts([10, 0], [5, 5]) < 10 and math.isnan(kl_from_counts([0, 0], [1, 1]))
    with pytest.raises(ValueError, match="bins"):
        kl_from_counts([1, 2], [1, 2, 3])


def test_mmd_separates_shifted_samples_and_not_same_ones() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 3)), rng.normal(size=(200, 3))
    same = mmd_test(x, y, seed=1)
    shifted = mmd_test(x, y + 0.5, seed=1)
    assert same is not None and shifted is not None
    assert same.p_value > 0.05 and shifted.p_value < 0.01 and shifted.mmd2 > same.mmd2
    assert mmd_verdict(same.p_value) == "stable" and mmd_verdict(shifted.p_value) == "major"
    assert mmd_test(x, y + 0.5, seed=1) == shifted  # seeded: reproducible
    assert mmd_test(x, y, max_rows=50).n_x == 50
    assert mmd_test(x[:1], y) is None and mmd_verdict(None) == "unknown"
    assert shifted.p_value >= 1 / (1 + shifted.permutations)


def test_verdicts_agree_on_shifted_and_unshifted_banking77_splits(banking77_splits) -> None:
    """train vs test is one distribution (every measure stable); test's short half vs its long
    half is a shift (every measure major)."""
    cols = ["prompt_chars", "prompt_words"]
    same = DriftStage(reference=banking77_splits["test"], columns=cols, text=False)
    _run(same, banking77_splits["train"])
    n = numeric_feature(banking77_splits["test"], "prompt_chars")
    short = pa.array(n <= np.median(n))
    shifted = DriftStage(reference=banking77_splits["test"].filter(pc.invert(short)), columns=cols, text=False)
    _run(shifted, banking77_splits["test"].filter(short))
    for stage, want in ((same, "stable"), (shifted, "major")):
        d = stage.describe()
        json.dumps(d)
        for c in cols:
            assert d["psi"][c]["verdict"] == d["psi"][c]["kl_verdict"] == want, (c, d["psi"][c])
            assert d["psi"][c]["kl"] > 0
        mmd = d["mmd"]["features"]
        assert mmd["verdict"] == want and mmd["n_training"] == mmd["n_reference"] == 500
        assert d["summary"]["mmd_verdicts"] == {"features": want}
    assert same.describe()["mmd"]["features"]["p_value"] > 0.05
    assert shifted.describe()["mmd"]["features"]["mmd2"] > 100 * same.describe()["mmd"]["features"]["mmd2"]
    table = next(b for b in shifted.describe()["blocks"] if b["title"].startswith("MMD"))
    assert table["rows"][0][0] == "features" and table["rows"][0][3] == "major"


def test_mmd_off_and_thresholds_are_configurable(banking77_splits) -> None:
    off = DriftStage(reference=banking77_splits["test"], text=False, mmd_sample=0)
    _run(off, banking77_splits["train"].slice(0, 500))
    assert off.describe()["mmd"] == {} and not any(b["title"].startswith("MMD") for b in off.describe()["blocks"])
    strict = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars"], text=False, kl_thresholds=(0.001, 0.002),
                        mmd_thresholds=(0.5, 0.9), mmd_permutations=50)
    _run(strict, banking77_splits["train"])
    assert strict.fitted.results["prompt_chars"]["kl_verdict"] == "major"
    assert strict.describe()["mmd"]["features"]["permutations"] == 50


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"kl_thresholds": (0.2, 0.1)}, "kl_thresholds"),
    ({"kl_thresholds": "0.1"}, "kl_thresholds"),
    ({"mmd_thresholds": (0.05, 1.5)}, "mmd_thresholds"),
    ({"mmd_sample": 5}, "mmd_sample"),
    ({"mmd_sample": 10**6}, "mmd_sample"),
    ({"mmd_sample": True}, "mmd_sample"),
    ({"mmd_permutations": 3}, "mmd_permutations"),
    ({"label_column": 7}, "label_column"),
])
def test_config_errors_name_the_parameter(banking77_splits, kwargs, param) -> None:
    with pytest.raises(StageConfigError, match=param) as err:
        DriftStage(reference=banking77_splits["test"], text=False, **kwargs)
    assert err.value.param == param
