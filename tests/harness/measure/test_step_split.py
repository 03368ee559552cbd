"""The step split (harness/measure/step_split.py): profiled steps with known phases, no torchrun."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from harness.measure import step_split as ss
from harness.measure.step_split import Event


class _SlowBackward(torch.autograd.Function):
    """An op whose backward takes a known time: the sparse side's backward in the test step."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        time.sleep(0.004)
        return grad


def _synthetic_step() -> Any:
    """A training step marked as a sharded rank marks it, with sleeps of known length in the
    sparse forward (3 ms), the sparse backward (4 ms) and the optimizer (2 ms), and the
    re-layout's hand-off (optimus.params.attach) in the dense arch."""
    from optimus.params.attach import attach_members

    torch.manual_seed(0)
    table = torch.randn(64, 16, requires_grad=True)
    members = [torch.nn.Parameter(torch.randn(16, 16)) for _ in range(3)]
    stacked = torch.stack([m.detach() for m in members])
    opt = ss.marked_optimizer(torch.optim.SGD([table, *members], lr=0.01))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with ss.mark("sparse"):
            time.sleep(0.003)
            pooled = _SlowBackward.apply(table[:32])
        with ss.mark("dense_forward"):
            w = attach_members(stacked, None, *members)
            h = pooled
            for i in range(3):
                h = torch.relu(h @ w[i])
        loss = h.square().mean()
        with ss.mark("backward"):
            loss.backward()
        with ss.mark("optimizer"):
            time.sleep(0.002)
        opt.step()

    return step


def test_split_of_a_profiled_step_with_known_phases() -> None:
    got = ss.profile_split(_synthetic_step(), steps=3)
    assert got["steps"] == 3
    assert set(ss.COMPONENTS) <= set(got)
    assert all(got[c] >= 0 for c in ss.COMPONENTS)
    assert got["sparse"] >= 3.0 + 4.0  # its forward sleep and its autograd node's backward sleep
    assert got["dense_backward"] < 4.0  # the sparse node's backward is not counted here
    assert got["optimizer"] >= 2.0
    assert got["dense_forward"] > 0 and got["dense_backward"] > 0 and got["handoff"] > 0
    assert got["allreduce"] >= 0 and got["allreduce_busy"] == 0  # no process group
    parts = sum(got[c] for c in ss.COMPONENTS)
    assert parts == pytest.approx(got["step"], rel=1e-6)  # the median step's own split


def test_marks_are_no_ops_outside_the_profiler() -> None:
    assert ss.mark("sparse") is ss.mark("dense_forward")  # the shared null context
    assert ss.marked_optimizer(None) is None


def _ev(name: str, start: float, end: float, thread: int = 1, seq: int = -1) -> Event:
    return Event(name, thread, start, end, seq)


def test_split_of_events_innermost_wins_and_the_backward_tail_is_the_all_reduce() -> None:
    node = ss._NODE
    events = [
        _ev(ss.STEP, 0, 10_000),
        _ev(ss.PREFIX + "sparse", 0, 2_000),
        _ev("aten::embedding_bag", 100, 1_000, seq=7),
        _ev(ss.PREFIX + "dense_forward", 2_000, 3_000),
        _ev("aten::addmm", 2_100, 2_900, seq=8),
        _ev(ss.PREFIX + "backward", 3_000, 9_000),
        _ev(node + "AddmmBackward0", 3_000, 4_000, seq=8),
        _ev(node + "torch::autograd::AccumulateGrad", 4_000, 5_000),
        _ev("c10d::allreduce_", 4_500, 4_800),  # DDP's launch from the gradient's hook
        _ev(node + "EmbeddingBagBackward0", 5_000, 8_000, seq=7),
        # 8_000-9_000: after the last node, DDP waits for its buckets
        _ev(ss.PREFIX + "optimizer", 9_000, 9_500),
        _ev("gloo:all_reduce", 4_600, 7_000, thread=2),  # gloo's thread: beside the split
    ]
    got = ss.split(events)
    assert got["sparse"] == pytest.approx(2.0 + 3.0)
    assert got["dense_forward"] == pytest.approx(1.0)
    assert got["dense_backward"] == pytest.approx(1.0 + 0.7)
    assert got["allreduce"] == pytest.approx(0.3 + 1.0)
    assert got["optimizer"] == pytest.approx(0.5)
    assert got["other"] == pytest.approx(0.5)  # the step after the optimizer
    assert got["handoff"] == 0.0
    assert sum(got[c] for c in ss.COMPONENTS) == pytest.approx(got["step"]) == 10.0
    assert got["allreduce_busy"] == pytest.approx(2.4)


def test_the_split_is_the_median_steps_own_and_adds_up() -> None:
    # three steps whose parts differ: the medians per part (sparse 3, optimizer 1: 4 ms) would
    # not add up to the median step (5 ms); the median step's own split does
    events = []
    for k, (sparse, opt) in enumerate([(1_000, 4_000), (4_000, 1_000), (3_000, 1_000)]):
        t = k * 100_000
        events += [
            _ev(ss.STEP, t, t + sparse + opt),
            _ev(ss.PREFIX + "sparse", t, t + sparse),
            _ev(ss.PREFIX + "optimizer", t + sparse, t + sparse + opt),
        ]
    got = ss.split(events)
    assert got["steps"] == 3
    assert got["step"] == pytest.approx(5.0)
    assert (got["sparse"], got["optimizer"]) in ((1.0, 4.0), (4.0, 1.0))
    assert sum(got[c] for c in ss.COMPONENTS) == pytest.approx(got["step"])
    # an even count takes the lower median's step: of 5 ms and 4 ms, the 4 ms one
    got = ss.split(events[:3] + events[6:])
    assert got["steps"] == 2
    assert (got["step"], got["sparse"], got["optimizer"]) == pytest.approx((4.0, 3.0, 1.0))


def test_split_needs_a_profiled_step() -> None:
    with pytest.raises(ValueError, match="no profiled step"):
        ss.split([_ev("aten::mm", 0, 1)])
