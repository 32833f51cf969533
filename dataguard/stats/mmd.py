"""Maximum mean discrepancy (MMD) two-sample test with an RBF kernel and a seeded permutation test.

PSI and KL look at one column at a time; MMD compares the *joint* distribution of several
features (the drift stage's numeric columns, or its text embeddings). With the RBF kernel
k(x, y) = exp(-gamma |x - y|^2),

    MMD^2 = mean k(X, X') + mean k(Y, Y') - 2 mean k(X, Y)

(the biased V-statistic: ``s^T K s`` with s = +1/n on X rows and -1/m on Y rows). ``gamma``
is 1 / median of the pooled squared distances (the median heuristic), fixed before the
permutations. The p-value is (1 + #{permutations with MMD^2 >= observed}) / (1 + n_perm),
with the rows' X/Y labels shuffled by a seeded generator, so results are reproducible.

Cost is bounded by the sample: at most ``max_rows`` per side (the caller's bottom-k samples)
gives one (n+m)^2 kernel matrix and one matrix product with the permutation sign vectors;
500 + 500 rows and 200 permutations take well under a second.

Verdicts are on the p-value (``DEFAULT_MMD_THRESHOLDS``): p < 0.01 major, p < 0.05
moderate, else stable. A p-value measures evidence, not size: with large samples a
small shift is significant, which is why MMD^2 is reported beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_MMD_THRESHOLDS = (0.01, 0.05)  # p-value: below the first major, below the second moderate
DEFAULT_PERMUTATIONS = 200


@dataclass(frozen=True)
class MMDResult:
    """MMD^2 (biased), its permutation p-value, and the sample sizes and kernel width used."""

    mmd2: float
    p_value: float
    n_x: int
    n_y: int
    gamma: float
    permutations: int


def mmd_verdict(p_value: float | None, thresholds: tuple[float, float] = DEFAULT_MMD_THRESHOLDS) -> str:
    """'major' when p < thresholds[0], 'moderate' when p < thresholds[1], else 'stable'."""
    if p_value is None or p_value != p_value:
        return "unknown"
    if p_value < thresholds[0]:
        return "major"
    return "moderate" if p_value < thresholds[1] else "stable"


def standardize(x: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both samples scaled by the reference's mean and standard deviation per feature (a
    constant feature keeps scale 1); NaN becomes the reference mean (0 after scaling)."""
    ref = np.asarray(reference, dtype=np.float64)
    mean = np.nanmean(ref, axis=0) if ref.size else np.zeros(ref.shape[1])
    sd = np.nanstd(ref, axis=0) if ref.size else np.ones(ref.shape[1])
    mean = np.nan_to_num(mean)
    sd = np.where(np.isfinite(sd) & (sd > 0), sd, 1.0)

    def scale(a: np.ndarray) -> np.ndarray:
        return np.nan_to_num((np.asarray(a, dtype=np.float64) - mean) / sd)

    return scale(x), scale(ref)


def mmd_test(x: np.ndarray, y: np.ndarray, *, seed: int = 0, permutations: int = DEFAULT_PERMUTATIONS,
             max_rows: int | None = None) -> MMDResult | None:
    """RBF-kernel MMD^2 between samples ``x`` (n, d) and ``y`` (m, d) and its permutation
    p-value; None when either side has fewer than 2 rows. ``max_rows`` keeps the first rows
    of each side (pass bottom-k samples, whose prefixes are samples too)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if max_rows is not None:
        x, y = x[:max_rows], y[:max_rows]
    n, m = len(x), len(y)
    if n < 2 or m < 2:
        return None
    z = np.vstack([x, y])
    sq = np.sum(z * z, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (z @ z.T), 0.0)
    off = d2[np.triu_indices(n + m, k=1)]
    med = float(np.median(off)) if off.size else 0.0
    gamma = 1.0 / med if med > 0 else 1.0
    k = np.exp(-gamma * d2)
    sign = np.concatenate([np.full(n, 1.0 / n), np.full(m, -1.0 / m)])
    observed = float(sign @ k @ sign)
    rng = np.random.default_rng(seed)
    signs = np.stack([rng.permutation(sign) for _ in range(permutations)], axis=1) if permutations else \
        np.empty((n + m, 0))
    null = np.einsum("ip,ip->p", signs, k @ signs)
    # a permuted statistic equal to the observed one (up to rounding) counts as reaching it
    reached = int(np.sum(null >= observed - 1e-12 * max(1.0, abs(observed))))
    return MMDResult(mmd2=max(observed, 0.0), p_value=(1 + reached) / (1 + permutations), n_x=n, n_y=m,
                     gamma=gamma, permutations=permutations)
