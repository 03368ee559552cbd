"""optimus.cost.timing.time_block, the block timer of the harness's interleaved rounds and of the
measured cost model: it calls the step exactly ``calls`` times, syncs once before the last clock
read, and returns the clock difference."""

from __future__ import annotations

import pytest

from optimus.cost.timing import time_block


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
