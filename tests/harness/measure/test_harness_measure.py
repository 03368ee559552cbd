"""Measurement primitives: iteration budget, summaries, CPU peak memory."""

from __future__ import annotations

import time

import pytest
import torch

from harness.measure import memory, timing


def test_time_iterations_respects_count_and_budget() -> None:
    calls = []
    samples = timing.time_iterations(
        lambda: calls.append(1), warmup=2, min_iters=3, max_iters=7, budget_s=10.0
    )
    assert len(samples) == 7 and len(calls) == 9  # budget never reached: stops at max_iters
    samples = timing.time_iterations(
        lambda: time.sleep(0.01), warmup=0, min_iters=2, max_iters=1000, budget_s=0.05
    )
    assert 2 <= len(samples) <= 10  # budget reached after ~5 samples
    assert all(s >= 9.0 for s in samples)  # milliseconds
    with pytest.raises(ValueError, match="min_iters"):
        timing.time_iterations(lambda: None, min_iters=5, max_iters=2)


def test_summarize() -> None:
    s = timing.summarize([4.0, 1.0, 3.0, 2.0, 100.0])
    assert s["median"] == 3.0 and s["q1"] == 2.0 and s["q3"] == 4.0 and s["iqr"] == 2.0 and s["n"] == 5
    assert s["samples"] == [4.0, 1.0, 3.0, 2.0, 100.0]  # raw, in order
    with pytest.raises(ValueError, match="empty"):
        timing.summarize([])


def test_storage_bytes_counts_shared_storage_once() -> None:
    w = torch.zeros(10, 10)
    assert memory.storage_bytes([w, w[0], w.t(), torch.zeros(5)]) == 400 + 20


def test_cpu_step_peak_is_the_steps_own_allocations_and_repeatable() -> None:
    x = torch.randn(256, 64)
    w1, w2 = torch.randn(64, 512), torch.randn(512, 8)
    garbage = torch.randn(1000, 1000)  # allocated before the step: must not count

    def step() -> torch.Tensor:
        h = x @ w1  # 256*512*4 = 512 KiB
        h2 = torch.relu(h)  # another 512 KiB live at once
        return (h2 @ w2).sum()

    peaks = [memory.cpu_step_peak(step)[0] for _ in range(3)]
    assert peaks[0] == peaks[1] == peaks[2], "same allocation sequence -> same peak, to the byte"
    assert 2 * 256 * 512 * 4 <= peaks[0] < 2 * 256 * 512 * 4 + 64 * 1024
    del garbage


def test_step_peak_memory_adds_static_tensors() -> None:
    w = torch.randn(100, 100)
    out = memory.step_peak_memory(lambda: w * 2, "cpu", [w])
    assert out["peak_mem_static_bytes"] == 40000
    assert out["peak_mem_bytes"] == 40000 + out["peak_mem_step_bytes"]
    assert out["peak_mem_step_bytes"] >= 40000


def test_a_block_has_enough_steps_to_last_block_s_the_same_count_for_every_step() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def step_of(seconds: float):  # type: ignore[no-untyped-def]
        def step() -> None:
            now[0] += seconds

        return step

    # powers of two, so that the fake clock's sums are exact
    fast, slow, block = step_of(2.0**-13), step_of(2.0**-8), 2.0**-5
    # the fastest step sets the count: 0.12 ms a step, 31 ms a block
    assert timing.block_steps([slow, fast], 5, block, clock=clock) == 256
    assert timing.block_steps([slow], 5, block, clock=clock) == 8
    assert timing.block_steps([step_of(0.25)], 5, block, clock=clock) == 5  # never below at_least
    assert timing.block_steps([fast], 5, block, clock=clock, most=100) == 100
    assert timing.block_steps([fast], 5, 0.0, clock=clock) == 5
    with pytest.raises(ValueError, match="block_steps"):
        timing.block_steps([fast], 0, block, clock=clock)
