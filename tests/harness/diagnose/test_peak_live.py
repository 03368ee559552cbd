"""harness.diagnose.peak_live: the buffers live at a step's peak, by where they were allocated.

Steps whose live set at the peak is known by construction: named regions allocate buffers of
known sizes, some freed before the peak and some after."""

from __future__ import annotations

import torch
from torch.profiler import record_function

from harness.diagnose.peak_live import live_at_peak, markdown_rows
from harness.measure import memory

F32 = 4


def _known_step() -> None:
    with record_function("first"):
        a = torch.ones(1024)  # 4 KiB, live at the peak
    with record_function("gone"):
        g = torch.ones(4096)  # 16 KiB, freed before the peak
    del g
    with record_function("second"):
        b = torch.ones(2048)  # 8 KiB: the peak is a + b + tmp
        tmp = torch.ones(3072)  # 12 KiB
    del a, b, tmp


def test_the_live_set_is_what_was_allocated_and_not_yet_freed_at_the_peak() -> None:
    live = live_at_peak(_known_step)
    expected = {"first > aten::empty": 1024 * F32, "second > aten::empty": (2048 + 3072) * F32}
    got = {g["where"]: g["bytes"] for g in live.groups()}
    assert got == expected
    assert live.peak_bytes == sum(expected.values())
    assert live.at is not None and live.at.startswith("second")
    assert [g["count"] for g in live.groups()] == [2, 1]  # most bytes first


def test_the_peak_agrees_with_the_harness_memory_figure() -> None:
    """The same running sum as the cells' ``peak_mem_bytes`` (harness.measure.memory.cpu_step_peak)."""
    x, w = torch.randn(64, 256), torch.randn(256, 1024)

    def step() -> torch.Tensor:
        return (x @ w).relu().sum()

    peak, where = memory.cpu_step_peak(step)
    live = live_at_peak(step)
    assert (live.peak_bytes, live.at) == (peak, where)
    assert sum(b.nbytes for b in live.buffers) >= 2 * 64 * 1024 * F32  # mm and relu outputs


def test_a_backward_is_told_from_what_the_forward_saved() -> None:
    """In training the peak's buffers are named by phase: saved by the forward vs made by the
    backward (the split that explained towers medium training's +35%)."""
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(128, 256)

    def step() -> None:
        h = lin(x).sigmoid()  # sigmoid saves its output for the backward
        (h * h).sum().backward()

    places = {g["where"].split(" > ")[0] for g in live_at_peak(step).groups()}
    assert any("Backward" in p for p in places), places
    assert any(p.startswith(("aten::", "autograd::")) and "Backward" not in p for p in places), places


def test_the_table_lists_the_largest_places_and_sums_the_rest() -> None:
    live = live_at_peak(_known_step).as_dict()
    assert live["live_bytes"] == live["peak_step_bytes"] == (1024 + 2048 + 3072) * F32
    rows = markdown_rows(live, top=1)
    assert "| `second > aten::empty` | 20,480 | 2 |" in rows
    assert "| 1 other places | 4,096 | 1 |" in rows
    assert [b["bytes"] for b in live["largest"]] == [4096, 8192, 12288]  # oldest first


def test_a_step_that_allocates_nothing_has_no_peak() -> None:
    t = torch.ones(4)
    live = live_at_peak(lambda: t)
    assert (live.peak_bytes, live.at, live.buffers) == (0, None, [])
