"""Statistics for comparing two sets of latency samples.

Why hand-written: scipy is not part of the stack, and these are a few lines of numpy.
Mann-Whitney U makes no normality assumption (latency samples are skewed, with outliers
from other processes); the bootstrap interval of the median ratio says how large the
change is, which a p-value alone does not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks (1-based) and the sizes of tie groups."""
    order = np.argsort(values, kind="mergesort")
    sorted_vals = values[order]
    ranks = np.empty(len(values), dtype=float)
    ties = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    return ranks, np.array(ties, dtype=float)


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test: returns (U of ``a``, p-value).

    Normal approximation with tie and continuity correction; fine from about 8 samples per
    side, conservative below (the p-value is then large, so nothing is flagged on too few
    samples, which is the behaviour we want in CI).
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError(f"samples: need at least one sample on each side, got {n1} and {n2}")
    ranks, ties = _ranks(np.concatenate([x, y]))
    u1 = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2.0)
    n = n1 + n2
    mu = n1 * n2 / 2.0
    tie_term = float((ties**3 - ties).sum()) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:
        return u1, 1.0
    z = (abs(u1 - mu) - 0.5) / math.sqrt(var)
    p = math.erfc(max(z, 0.0) / math.sqrt(2.0))
    return u1, min(1.0, p)


def bootstrap_median_ratio(
    base: Sequence[float], new: Sequence[float], *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Seeded percentile bootstrap confidence interval of median(new) / median(base)."""
    x, y = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    rng = np.random.default_rng(seed)
    mb = np.median(rng.choice(x, size=(n_boot, len(x)), replace=True), axis=1)
    mn = np.median(rng.choice(y, size=(n_boot, len(y)), replace=True), axis=1)
    ratios = mn / np.maximum(mb, 1e-300)
    lo, hi = np.percentile(ratios, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def bootstrap_median(
    values: Sequence[float], *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Seeded percentile bootstrap confidence interval of the median of ``values`` (e.g. the
    per-round paired ratios of an interleaved run, where pairing already cancelled the drift)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("values: empty; need at least one sample")
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(x, size=(n_boot, len(x)), replace=True), axis=1)
    lo, hi = np.percentile(meds, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)
