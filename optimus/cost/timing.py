"""The one block timer: seconds taken by ``calls`` back-to-back calls of a step.

WHY here: it is the timing primitive both sides of the layering need. The optimizer's measured
cost model (``optimus.cost.measured``) times its calibration probes with it, and optimus must not
import the harness; the harness's interleaved rounds (``harness.interleaved.interleave``) time each
mode's block with it too, so a block is timed one way everywhere. The harness's per-step sampler
(``harness.measure.time_iterations``: budget, CUDA events, injected slowdown) is the other core;
everything that samples latency goes through one of the two.
"""

from __future__ import annotations

import time
from collections.abc import Callable


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
