"""Change points of one nightly series (a cell's metric, night after night), by a maintained library.

Why change points and not only tonight against last night: a pairwise gate sees one step at
a time. A 2%-a-night creep never trips it (each night is within its threshold of the one
before, and each becomes the next base), and on noisy nights it cannot say which commit
started a change. A change-point detector looks at the whole history and says where the
level moved.

The detector is Apache Otava's (formerly Hunter; ``otava.analysis.compute_change_points``):
E-Divisive means over sliding windows, each candidate kept only if a two-sided t-test
between the segments on either side gives p below ``max_pvalue``. It was chosen over MongoDB's
``signal-processing-algorithms`` (E-Divisive with a permutation test) by the replay benchmark
(``optimus-bench replay``, docs/nightly-changepoints.md), which runs both on the same series.

This module turns the detector's indices into what a person acts on (``Change``): the
night where the new level starts (so the commit range is the previous night's commit to
that night's), the relative size with a 95% interval (Welch's t on the logs of the two
segments around it, bounded by the neighbouring change points), the direction, and whether
it is a regression for a metric where lower is better.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol


class Detector(Protocol):
    """Finds change points: indices ``i`` where ``series[i]`` is the first value of a new level."""

    @property
    def name(self) -> str: ...

    def __call__(self, series: Sequence[float]) -> list[int]: ...


@dataclass(frozen=True)
class OtavaDetector:
    """Apache Otava's E-Divisive with a t-test (its defaults: window 50, p = 0.001)."""

    window: int = 50
    max_pvalue: float = 0.001
    name: str = "otava"

    def __call__(self, series: Sequence[float]) -> list[int]:
        from otava.analysis import compute_change_points

        if len(series) < 4:
            return []
        # A list, not an ndarray: otava 0.8.0 slices its sliding window only for sequences that
        # are not ndarrays (an ndarray makes every window the whole series, then fails).
        points, _ = compute_change_points([float(v) for v in series], self.window, self.max_pvalue)
        return sorted(int(cp.index) for cp in points)


@dataclass(frozen=True)
class EDivisiveDetector:
    """MongoDB's ``signal-processing-algorithms``: E-Divisive means with a permutation test.

    Not a dependency of the project (its 2.1.6 pins numpy < 2 and Python 3.11 only); the
    replay benchmark uses it when it is importable, to compare the two on the same series."""

    pvalue: float = 0.01
    permutations: int = 100
    name: str = "e-divisive"

    def __call__(self, series: Sequence[float]) -> list[int]:
        import numpy as np
        from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

        if len(series) < 4:
            return []
        found = e_divisive(
            np.asarray(series, dtype=float), pvalue=self.pvalue, permutations=self.permutations
        )
        return sorted(int(i) for i in found)


DETECTORS: dict[str, type[OtavaDetector] | type[EDivisiveDetector]] = {
    "otava": OtavaDetector,
    "e-divisive": EDivisiveDetector,
}


@dataclass(frozen=True)
class Change:
    """One change point of a series, as a person reads it."""

    index: int  # first night at the new level
    before: float  # mean of the segment before (up to the previous change point)
    after: float  # mean of the segment after (up to the next change point)
    change: float  # after / before - 1
    ci: tuple[float, float]  # 95% interval of after / before - 1
    direction: str  # "up" | "down"
    regression: bool  # the direction that is worse for this metric
    nights_after: int  # nights at the new level (up to the next change point, or so far)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _log_ratio_ci(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """95% interval of mean(after)/mean(before) - 1 by Welch's t on the logs (noise is multiplicative)."""
    import numpy as np
    from scipy.stats import t as student_t

    a, b = np.log(np.asarray(before, dtype=float)), np.log(np.asarray(after, dtype=float))
    diff = float(b.mean() - a.mean())
    va = float(a.var(ddof=1)) / len(a) if len(a) > 1 else 0.0
    vb = float(b.var(ddof=1)) / len(b) if len(b) > 1 else 0.0
    se = math.sqrt(va + vb)
    if se == 0.0:
        return math.expm1(diff), math.expm1(diff)
    num = (va + vb) ** 2
    den = (va**2 / (len(a) - 1) if len(a) > 1 else 0.0) + (vb**2 / (len(b) - 1) if len(b) > 1 else 0.0)
    dof = num / den if den > 0 else 1.0
    q = float(student_t.ppf(0.975, max(dof, 1.0)))
    return math.expm1(diff - q * se), math.expm1(diff + q * se)


def describe(series: Sequence[float], indices: Sequence[int], higher_is_better: bool = False) -> list[Change]:
    """``Change`` records for the detector's ``indices`` of ``series`` (all values > 0)."""
    if any(not (v > 0 and math.isfinite(v)) for v in series):
        raise ValueError("series: every value must be a finite number > 0")
    bounds = [0, *sorted(set(indices)), len(series)]
    out = []
    for k in range(1, len(bounds) - 1):
        lo, i, hi = bounds[k - 1], bounds[k], bounds[k + 1]
        before, after = list(series[lo:i]), list(series[i:hi])
        if not before or not after:
            continue
        mb, ma = sum(before) / len(before), sum(after) / len(after)
        up = ma > mb
        out.append(
            Change(
                index=i,
                before=mb,
                after=ma,
                change=ma / mb - 1.0,
                ci=_log_ratio_ci(before, after),
                direction="up" if up else "down",
                regression=up != higher_is_better,
                nights_after=hi - i,
            )
        )
    return out


def detect(series: Sequence[float], detector: Detector, higher_is_better: bool = False) -> list[Change]:
    """Change points of ``series`` found by ``detector``, described."""
    return describe(series, detector(series), higher_is_better)
