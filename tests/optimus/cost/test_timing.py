"""optimus.cost.timing.time_block, the block timer of the harness's interleaved rounds and of the
measured cost model: it calls the step exactly ``calls`` times, syncs once before the last clock
read, and returns the clock difference."""

from __future__ import annotations

import pytest

from optimus.cost.timing import median_interval, time_block


def test_calls_sync_and_clock() -> None:
    events: list[str] = []
    ticks = iter([10.0, 12.5])

    def clock() -> float:
        events.append("clock")
        return next(ticks)

    elapsed = time_block(lambda: events.append("step"), 3, sync=lambda: events.append("sync"), clock=clock)
    assert elapsed == 2.5
    assert events == ["clock", "step", "step", "step", "sync", "clock"]


@pytest.mark.parametrize("calls", [0, -1])
def test_needs_at_least_one_call(calls: int) -> None:
    with pytest.raises(ValueError, match="calls"):
        time_block(lambda: None, calls)


@pytest.mark.parametrize(
    ("n", "ranks"),
    # the textbook distribution-free 95% intervals for the median: ranks (1-based) of the ends
    [(6, (1, 6)), (9, (2, 8)), (10, (2, 9)), (20, (6, 15)), (27, (8, 20))],
)
def test_median_interval_is_the_binomial_order_statistic_interval(n: int, ranks: tuple[int, int]) -> None:
    values = [float(v) for v in reversed(range(1, n + 1))]  # unsorted on purpose
    median, low, high = median_interval(values)
    assert median == (n + 1) / 2
    assert (low, high) == (float(ranks[0]), float(ranks[1]))


def test_median_interval_of_too_few_values_is_their_range() -> None:
    assert median_interval([2.0, 1.0]) == (1.5, 1.0, 2.0)
    assert median_interval([4.0]) == (4.0, 4.0, 4.0)


@pytest.mark.parametrize(("values", "level"), [([], 0.95), ([1.0], 1.0), ([1.0], 0.0)])
def test_median_interval_refuses_bad_input(values: list[float], level: float) -> None:
    with pytest.raises(ValueError, match=r"values|level"):
        median_interval(values, level)
