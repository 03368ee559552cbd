"""Timing primitives: latency samples, their summary, and modes timed side by side in rounds.

Why separate functions: the harness cells, the asv suite (benchmarks/) and the nightly job
all measure with exactly this code, so their figures agree. Nothing here knows about
models or modes; each takes a zero-argument ``step`` callable.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimus.cost.timing import time_block

INJECT_SLOWDOWN_ENV = "OPTIMUS_BENCH_INJECT_SLOWDOWN"


def injected_slowdown() -> float:
    """Fraction of extra time to add to every timed step (``OPTIMUS_BENCH_INJECT_SLOWDOWN``).

    Why it exists: the nightly's regression detection is tested end to end by making every
    measured step really take e.g. 15% longer, here where the harness measures, so nothing
    downstream (samples, compare, reruns, asv figures) can tell it from a real slowdown.
    Unset or empty: 0.
    """
    raw = os.environ.get(INJECT_SLOWDOWN_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        frac = float(raw)
    except ValueError:
        frac = -1.0
    if not math.isfinite(frac) or frac < 0:
        raise ValueError(f"{INJECT_SLOWDOWN_ENV}: must be a number >= 0 (e.g. 0.15 for 15%), got {raw!r}")
    return frac


def _stall(seconds: float) -> None:
    """Busy-wait (sleep overshoots by ~0.1 ms, too coarse for sub-millisecond steps)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def time_iterations(
    step: Callable[[], object],
    *,
    warmup: int = 3,
    min_iters: int = 5,
    max_iters: int = 200,
    budget_s: float = 2.0,
    device: str = "cpu",
) -> list[float]:
    """Run ``step`` ``warmup`` times untimed, then time it until the budget is spent.

    Stops after ``max_iters`` samples, or once at least ``min_iters`` samples were taken and
    ``budget_s`` seconds of timed iterations have passed. Returns per-iteration milliseconds.
    On CUDA each iteration is bracketed by CUDA events and synchronized, so the sample is GPU
    time of the step, not the time to enqueue it.
    """
    if min_iters < 1 or max_iters < min_iters:
        raise ValueError(f"need 1 <= min_iters <= max_iters, got min_iters={min_iters} max_iters={max_iters}")
    import torch

    cuda = device == "cuda"
    slow = injected_slowdown()
    last_ms = 0.0
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()

    def sample() -> float:
        nonlocal last_ms
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            stall_ms = slow * last_ms  # scaled by the previous step: this one is not timed yet
            if stall_ms:  # host stall inside the event pair: the GPU idles, the sample grows
                _stall(stall_ms / 1e3)
            step()
            end.record()
            end.synchronize()
            elapsed_ms = float(begin.elapsed_time(end))
            last_ms = max(0.0, elapsed_ms - stall_ms)
            return elapsed_ms
        t0 = time.perf_counter()
        step()
        if slow:
            _stall(slow * (time.perf_counter() - t0))
        return (time.perf_counter() - t0) * 1e3

    return timed_loop(sample, min_iters=min_iters, max_iters=max_iters, budget_s=budget_s)


def timed_loop(
    sample: Callable[[], float],
    *,
    min_iters: int,
    max_iters: int,
    budget_s: float,
    agree: Callable[[bool], bool] | None = None,
) -> list[float]:
    """The one timing loop: ``sample()`` times one step (ms) until ``max_iters`` samples, or
    until at least ``min_iters`` were taken and ``budget_s`` seconds have passed.

    ``agree`` (a sharded cell's ranks): turns this process's go/stop into the one every process
    takes, before every step, so all take the same number of steps."""
    samples: list[float] = []
    start = time.perf_counter()
    while True:
        go = len(samples) < max_iters and not (
            len(samples) >= min_iters and time.perf_counter() - start >= budget_s
        )
        if agree is not None:
            go = agree(go)
        if not go:
            return samples
        samples.append(sample())


def summarize(samples: Iterable[float]) -> dict[str, Any]:
    """Median, quartiles and interquartile range of raw samples (samples kept verbatim)."""
    xs = [float(s) for s in samples]
    if not xs:
        raise ValueError("samples: empty; need at least one timing sample")
    q1, med, q3 = (float(v) for v in np.percentile(xs, [25, 50, 75]))
    return {"median": med, "q1": q1, "q3": q3, "iqr": q3 - q1, "n": len(xs), "samples": xs}


@dataclass
class Contender:
    """One mode of the model, ready to step: its module, its optimizer, its first output."""

    mode: str
    step: Callable[[], Any]
    first_call_s: float
    first_out: Any
    module: Any = None
    optimizer: Any = None


def block_steps(
    steps: Sequence[Callable[[], object]],
    at_least: int,
    block_s: float,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
    most: int = 1000,
) -> int:
    """Steps per timed block, the same for every one of ``steps``: ``at_least``, or more so that
    the fastest step's block lasts ``block_s`` (at most ``most``). Each step runs ``at_least``
    times to estimate it.

    WHY: a block of a few sub-millisecond steps is shorter than a scheduler's time slice, so on a
    shared machine a preemption either misses a block or takes it whole, and the per-round ratio
    of two such blocks swings by several times (intervals of 0.1-11x on torchrec's models at 5
    steps a block). A block of tens of milliseconds averages the preemptions in. One count for all
    keeps the contenders' blocks alike, so a round's ratio compares like with like."""
    if at_least < 1 or not block_s >= 0 or most < at_least:
        raise ValueError(f"block_steps: at_least {at_least}, block_s {block_s}, most {most}")
    if block_s == 0:
        return at_least
    fastest = min(time_block(s, at_least, sync, clock) / at_least for s in steps)
    return max(at_least, min(most, math.ceil(block_s / max(fastest, 1e-9))))


def interleave(
    contenders: Sequence[Contender],
    rounds: int,
    steps: int,
    warmup: int,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """ms per step of each contender, one value per round (the mean over ``steps`` steps)."""
    for c in contenders:
        for _ in range(warmup):
            c.step()
    sync()
    out: dict[str, list[float]] = {c.mode: [] for c in contenders}
    for r in range(rounds):
        order = contenders if r % 2 == 0 else list(reversed(contenders))
        for c in order:
            out[c.mode].append(time_block(c.step, steps, sync, clock) * 1e3 / steps)
        if progress is not None:
            progress(r + 1)
    return out
