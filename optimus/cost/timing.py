"""The one block timer: seconds taken by ``calls`` back-to-back calls of a step.

WHY here: it is the timing primitive both sides of the layering need. The optimizer's measured
cost model (``optimus.cost.measured``) times its calibration probes with it, and optimus must not
import the harness; the harness's interleaved rounds (``harness.interleaved.interleave``) time each
mode's block with it too, so a block is timed one way everywhere. The harness's per-step sampler
(``harness.measure.time_iterations``: budget, CUDA events, injected slowdown) is the other core;
everything that samples latency goes through one of the two.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence


def _no_sync() -> None:
    return None


def time_block(
    step: Callable[[], object],
    calls: int,
    sync: Callable[[], None] = _no_sync,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Elapsed ``clock`` seconds of ``calls`` calls of ``step``, with ``sync`` (e.g. a CUDA
    synchronize) before the clock is read at the end. Per call: divide by ``calls``."""
    if calls < 1:
        raise ValueError(f"calls: need an int >= 1, got {calls!r}")
    t0 = clock()
    for _ in range(calls):
        step()
    sync()
    return clock() - t0


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(median, low, high)`` of ``values``: the low and high ends are order statistics that hold
    the population median with probability at least ``level`` (the binomial, distribution-free
    interval; with too few values for ``level`` it is the smallest and largest value).

    WHY order statistics and not a bootstrap: the guard (``optimus.guard``) judges a handful of
    paired rounds, where a bootstrap's interval is too narrow, and optimus does not depend on
    numpy; this interval is exact for any distribution of the per-round ratios."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        raise ValueError("values: empty; need at least one value")
    if not 0 < level < 1:
        raise ValueError(f"level: need a number between 0 and 1, got {level!r}")
    mid = n // 2
    median = xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2
    # the largest k with P(Binomial(n, 1/2) < k) <= (1 - level) / 2: [x_(k), x_(n + 1 - k)]
    alpha, k, below = (1 - level) / 2, 0, 0.0
    while k < mid:
        below += math.comb(n, k) / 2**n
        if below > alpha:
            break
        k += 1
    k = max(k, 1)
    return median, xs[k - 1], xs[n - k]
