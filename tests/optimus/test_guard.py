"""The measured guard (optimus.guard): what it keeps, what it rejects, what it leaves as it was.

The verdicts are driven by fake clocks (``guard_measure``) that rate graphs by what they hold, so
every test is deterministic and none is timed; the real figure (a model whose analytic
favourite is slower on this CPU) is measured by ``benchmarks/guard_check.py``. Each fake still
runs the step it is given, so the measured runs really happen and must leave the caller's world
(parameters, their storage, ``.grad``, BatchNorm statistics, the RNG, the inputs) as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from caller_world_models import (
    CONFIGS,
    ModeTowers,
    RecordingTowers,
    assert_same_state,
    backward_grads,
    seeded,
    state_of,
)
from optimus_helpers import LAUNCH_BOUND, count_calls
from torch import fx, nn

import optimus
from optimus.guard import EXTENSIONS, paired_speedup
from optimus.params.group import GROUP_ATTR
from optimus.params.relayout import PREFIX, RelayoutParams
from optimus.report import OptimusReport


class TanhTowers(nn.Module):
    """Eight Linear -> tanh towers over a split input: batch_linear and batch_unary both fire."""

    def __init__(self, n: int = 8, width: int = 16) -> None:
        super().__init__()
        self.width = width
        self.linears = nn.ModuleList([nn.Linear(width, width) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, self.width, dim=1)
        return torch.cat([torch.tanh(lin(p)) for p, lin in zip(parts, self.linears, strict=True)], dim=1)


class FourLinears(nn.Module):
    """Four linears over four inputs (symbolic_trace takes it: no split to iterate)."""

    def __init__(self) -> None:
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return torch.cat([lin(v) for v, lin in zip((a, b, c, d), self.linears, strict=True)], 1)


def rating(per_call: Callable[[fx.GraphModule], float]) -> Callable[[fx.GraphModule, Any, int], float]:
    """A fake ``guard_measure``: runs the step once, returns ``calls`` times the graph's rating."""

    def measure(gm: fx.GraphModule, step: Callable[[], object], calls: int) -> float:
        step()
        return per_call(gm) * calls

    return measure


def batched(gm: fx.GraphModule) -> bool:
    return count_calls(gm, torch.baddbmm) > 0


SLOWER = rating(lambda gm: 2.0 if batched(gm) else 1.0)  # the batched graph takes twice as long
FASTER = rating(lambda gm: 0.5 if batched(gm) else 1.0)


def param_layout(module: nn.Module) -> list[tuple[int, tuple[int, ...], bool, Any, Any]]:
    """What the re-layout changes on a parameter: storage address, strides, tag, hook dicts."""
    return [
        (p.data_ptr(), p.stride(), hasattr(p, GROUP_ATTR), p._backward_hooks, p._post_accumulate_grad_hooks)
        for p in module.parameters()
    ]


@pytest.mark.parametrize("layout", ["default", "relayout"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_slower_rewrite_is_rejected_and_named(layout: str, mode: str) -> None:
    torch.manual_seed(0)
    model = getattr(ModeTowers(), mode)()
    x = torch.randn(8, 256)
    x_before = x.clone()
    for p in model.parameters():  # a gradient the caller holds must survive the measured backward
        p.grad = torch.full_like(p, 3.0)
    grads_before = [p.grad for p in model.parameters()]
    layout_before = param_layout(model)
    state_before = state_of(model)
    rng_before = torch.get_rng_state()

    cfg = CONFIGS[layout].with_(guard="graph", guard_measure=SLOWER)
    gm = optimus.optimize(model, (x,), config=cfg)
    report = gm.optimus_report

    assert report.guard == "rejected"
    assert report.guard_rejected.get("batch_linear") == 1  # names what it rejected
    assert report.rules_fired == {}  # the returned graph holds no rewrite
    (trial,) = report.guard_trials
    assert (trial.speedup, trial.low, trial.high, trial.kept) == (0.5, 0.5, 0.5, False)
    assert "rejected the rewrite (0.500x" in report.notes[-1] and "batch_linear x1" in report.notes[-1]
    summary = report.guard_summary()
    assert "; rejected " in summary and "batch_linear x1" in summary.split("; rejected ", 1)[1]
    assert not batched(gm) and report.nodes_after == report.nodes_before
    assert report.guard_seconds > 0 and report.seconds >= report.guard_seconds
    # the caller's world as it was: parameters in their own storage, untagged, their .grad,
    # buffers (BatchNorm statistics), the RNG, the inputs
    assert param_layout(model) == layout_before
    assert all(p.grad is g for p, g in zip(model.parameters(), grads_before, strict=True))
    assert_same_state(state_before, state_of(model))
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert torch.equal(x, x_before)
    assert not [n for n, _ in gm.named_parameters() if n.startswith(PREFIX)]
    assert not gm._forward_pre_hooks  # the re-layout's per-call check is gone with it
    # and it computes what eager computes, forward and backward, module state included
    torch.testing.assert_close(seeded(gm, x), seeded(model, x), rtol=0, atol=0)
    eager = backward_grads(model, lambda v: seeded(model, v), x)
    mine = backward_grads(model, lambda v: seeded(gm, v), x)
    for a, b in zip(eager, mine, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["default", "relayout"])
def test_a_faster_rewrite_is_kept_with_results_unchanged(layout: str) -> None:
    torch.manual_seed(0)
    model = ModeTowers().train()
    x = torch.randn(8, 256)
    state_before = state_of(model)
    rng_before = torch.get_rng_state()
    gm = optimus.optimize(model, (x,), config=CONFIGS[layout].with_(guard="graph", guard_measure=FASTER))
    report = gm.optimus_report
    assert report.guard == "kept" and report.guard_rejected == {}
    assert report.rules_fired.get("batch_linear") == 1 and batched(gm)
    assert report.guard_trials[0].speedup == 2.0 and report.guard_trials[0].kept
    if layout == "relayout":
        assert [n for n, _ in gm.named_parameters() if n.startswith(PREFIX)]
    assert_same_state(state_before, state_of(model))
    assert torch.equal(torch.get_rng_state(), rng_before)
    out = seeded(gm, x)
    expected = seeded(model, x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    eager = backward_grads(model, lambda v: seeded(model, v), x)
    mine = backward_grads(model, lambda v: seeded(gm, v), x)
    for a, b in zip(eager, mine, strict=True):
        assert a is not None and b is not None
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    # one more training step each: BatchNorm's statistics move exactly alike
    fresh = ModeTowers().train()
    fresh.load_state_dict(state_of(model))
    seeded(fresh, x)
    seeded(gm, x)
    assert_same_state(state_of(fresh), state_of(model))


def test_rules_keeps_the_best_variant_without_the_slow_rule() -> None:
    """The whole rewrite is slower only because of batch_unary's fused tanh: the guard keeps the
    rewrite without it and names batch_unary as rejected."""
    torch.manual_seed(0)
    model = TanhTowers()
    x = torch.randn(4, 128)

    def per_call(gm: fx.GraphModule) -> float:
        fused_tanh = 0 < count_calls(gm, torch.tanh) < 8
        return 3.0 if fused_tanh else 0.5 if batched(gm) else 1.0

    cfg = optimus.OptimusConfig(cost_model=LAUNCH_BOUND, layout=RelayoutParams(), guard="rules")
    whole = optimus.optimize(TanhTowers(), (x,), config=cfg.with_(guard="off")).optimus_report.rules_fired
    assert {"batch_linear", "batch_unary"} <= set(whole)
    layout_before = param_layout(model)
    gm = optimus.optimize(model, (x,), config=cfg.with_(guard_measure=rating(per_call)))
    report = gm.optimus_report
    assert report.guard == "kept without batch_unary"
    assert "batch_unary" in report.guard_rejected and "batch_unary" not in report.rules_fired
    assert report.rules_fired.get("batch_linear") == 1 and batched(gm)
    assert count_calls(gm, torch.tanh) == 8
    assert [t.left_out for t in report.guard_trials][:2] == [None, "batch_linear"]
    assert [t.kept for t in report.guard_trials if t.left_out == "batch_unary"] == [True]
    assert report.guard_trials[0].speedup == pytest.approx(1 / 3)
    torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-6)
    # the kept variant's re-layout is in place; nothing of the rejected runs is left behind
    assert param_layout(model) != layout_before
    assert len([n for n, _ in gm.named_parameters() if n.startswith(PREFIX)]) == 2  # weights, biases


def test_rules_without_a_winning_variant_returns_the_plain_capture() -> None:
    torch.manual_seed(0)
    model = TanhTowers()
    x = torch.randn(4, 128)
    layout_before = param_layout(model)
    slow = rating(lambda gm: 1.0 if count_calls(gm, torch.tanh) == 8 and not batched(gm) else 2.0)
    cfg = optimus.OptimusConfig(
        cost_model=LAUNCH_BOUND, layout=RelayoutParams(), guard="rules", guard_measure=slow
    )
    gm = optimus.optimize(model, (x,), config=cfg)
    report = gm.optimus_report
    assert report.guard == "rejected"
    assert {"batch_linear", "batch_unary"} <= set(report.guard_rejected)
    assert len(report.guard_trials) >= 2 and not any(t.kept for t in report.guard_trials)
    assert param_layout(model) == layout_before
    assert not batched(gm) and count_calls(gm, torch.tanh) == 8


def test_the_time_limit_stops_the_variants() -> None:
    model = TanhTowers()
    x = torch.randn(4, 128)
    cfg = optimus.OptimusConfig(
        cost_model=LAUNCH_BOUND, guard="rules", guard_time_limit_s=0.0, guard_measure=SLOWER
    )
    report = optimus.optimize(model, (x,), config=cfg).optimus_report
    assert report.guard == "rejected" and len(report.guard_trials) == 1
    assert any("guard_time_limit_s=0.0" in n for n in report.notes)


def test_rounds_are_paired_in_alternating_order() -> None:
    gm_a = fx.symbolic_trace(nn.Linear(4, 4))
    gm_b = fx.symbolic_trace(nn.Linear(4, 4))
    order: list[str] = []
    times = {id(gm_a): 3.0, id(gm_b): 1.0}

    def measure(gm: fx.GraphModule, step: Callable[[], object], calls: int) -> float:
        order.append("A" if gm is gm_a else "B")
        return times[id(gm)] * calls

    median, low, high, rounds = paired_speedup(gm_a, gm_b, [torch.randn(2, 4)], True, 4, measure)
    assert order[2:] == list("ABBAABBA")  # after the two one-call probes
    assert (median, low, high, rounds) == (3.0, 3.0, 3.0, 4)  # clear: no more rounds


def test_a_close_call_is_measured_on_more_rounds() -> None:
    """While the interval of the median holds 1.0 the guard adds rounds (at most EXTENSIONS
    times ``rounds``), then decides on all of them."""
    gm_a = fx.symbolic_trace(nn.Linear(4, 4))
    gm_b = fx.symbolic_trace(nn.Linear(4, 4))
    b_seconds = iter([1.0] + [0.9, 1.1] * 20)  # the probe, then B is faster, slower, faster, ...

    def measure(gm: fx.GraphModule, step: Callable[[], object], calls: int) -> float:
        return (1.0 if gm is gm_a else next(b_seconds)) * calls

    median, low, high, rounds = paired_speedup(gm_a, gm_b, [torch.randn(2, 4)], False, 4, measure)
    assert rounds == 4 * (1 + EXTENSIONS)
    assert low < 1.0 < high and median == pytest.approx((1 / 0.9 + 1 / 1.1) / 2)


def test_nothing_rewritten_and_no_inputs_say_why() -> None:
    cfg = optimus.OptimusConfig(guard="graph", guard_measure=SLOWER)
    report = optimus.optimize(nn.Linear(4, 4), (torch.randn(2, 4),), config=cfg).optimus_report
    assert report.guard == "not run: nothing was rewritten" and report.guard_trials == []
    gm = fx.symbolic_trace(FourLinears())
    report = optimus.optimize_graph_module(gm, cfg.with_(cost_model=LAUNCH_BOUND))
    assert report.guard.startswith("not run: no example inputs")


def test_a_failing_measurement_returns_the_plain_capture_untouched() -> None:
    model = TanhTowers()
    x = torch.randn(4, 128)
    layout_before = param_layout(model)

    def broken(gm: fx.GraphModule, step: Callable[[], object], calls: int) -> float:
        raise RuntimeError("clock unplugged")

    cfg = optimus.OptimusConfig(
        cost_model=LAUNCH_BOUND, layout=RelayoutParams(), guard="graph", guard_measure=broken
    )
    gm = optimus.optimize(model, (x,), config=cfg)
    report = gm.optimus_report
    assert report.guard.startswith("failed (RuntimeError)")
    assert param_layout(model) == layout_before and not batched(gm)
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("guard", "on"),
        ("guard", True),
        ("guard_rounds", 2),
        ("guard_rounds", 5.0),
        ("guard_time_limit_s", -1.0),
    ],
)
def test_bad_guard_options_are_refused(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        optimus.OptimusConfig(**{field: value})


def test_guard_options_are_in_the_fingerprint() -> None:
    base = optimus.OptimusConfig()
    assert base.guard == "off"
    prints = {
        base.fingerprint(),
        base.with_(guard="graph").fingerprint(),
        base.with_(guard_rounds=5).fingerprint(),
    }
    assert len(prints) == 3


def test_dynamo_subgraphs_are_not_guarded_and_say_so() -> None:
    """A forward with Python side effects takes the Dynamo-subgraph path: no whole step to time."""
    torch.manual_seed(0)
    model = RecordingTowers().eval()
    cfg = CONFIGS["default"].with_(guard="graph", guard_measure=SLOWER)
    report = optimus.optimize(model, (torch.randn(8, 256),), config=cfg).optimus_report
    assert report.capture == "dynamo-subgraphs"
    assert report.guard.startswith("not run: Dynamo subgraphs") and report.guard_trials == []


def test_verify_and_the_guard_together() -> None:
    """verify checks every rewrite of every driver run the guard makes; the guard still decides."""
    torch.manual_seed(0)
    model = TanhTowers()
    x = torch.randn(4, 128)
    fused_tanh_wins = rating(
        lambda gm: 2.0 if batched(gm) else 0.5 if count_calls(gm, torch.tanh) < 8 else 1.0
    )
    cfg = optimus.OptimusConfig(
        cost_model=LAUNCH_BOUND, verify=True, guard="rules", guard_measure=fused_tanh_wins
    )
    gm = optimus.optimize(model, (x,), config=cfg)
    report = gm.optimus_report
    assert report.rolled_back == {}
    assert report.guard == "kept without batch_linear" and "batch_linear" in report.guard_rejected
    assert not batched(gm) and report.rules_fired.get("batch_unary") == 1
    torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-6)


def test_guard_compile_times_both_graphs_as_they_will_run() -> None:
    """With ``guard_compile`` the guard times the compiled forms of the plain and the rewritten
    graph (a stand-in compiler here that records what it compiled and what ran)."""
    torch.manual_seed(0)
    model = TanhTowers()
    x = torch.randn(4, 128)
    compiled: list[fx.GraphModule] = []
    ran: list[fx.GraphModule] = []

    def compile_(gm: fx.GraphModule) -> Callable[..., Any]:
        compiled.append(gm)

        def run(*args: Any) -> Any:
            ran.append(gm)
            return gm(*args)

        return run

    cfg = optimus.OptimusConfig(
        cost_model=LAUNCH_BOUND, guard="graph", guard_measure=FASTER, guard_compile=compile_
    )
    gm = optimus.optimize(model, (x,), config=cfg)
    assert gm.optimus_report.guard == "kept"
    assert len(compiled) == 2 and compiled[1] is gm and compiled[0] is not gm
    assert {id(g) for g in ran} == {id(g) for g in compiled}  # every timed call went through them
    with pytest.raises(ValueError, match="guard_compile"):
        optimus.OptimusConfig(guard_compile="inductor")  # type: ignore[arg-type]


class DictTowers(nn.Module):
    """ModeTowers over a dict of features, as torch-rechub's models take them: the exported
    graph's ``forward`` takes the dict and flattens it (pytree code), while the guard is given
    the flat placeholders."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = ModeTowers()

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.towers(torch.cat([features["a"], features["b"]], dim=1))


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize(("measure", "verdict"), [(FASTER, "kept"), (SLOWER, "rejected")])
def test_a_graph_taking_a_dict_is_measured_with_the_dict(
    mode: str, measure: Callable[[fx.GraphModule, Any, int], float], verdict: str
) -> None:
    torch.manual_seed(0)
    model = getattr(DictTowers(), mode)()
    features = {"a": torch.randn(8, 128), "b": torch.randn(8, 128)}
    before = {k: v.clone() for k, v in features.items()}
    state_before = state_of(model)
    rng_before = torch.get_rng_state()
    gm = optimus.optimize(
        model, (features,), config=CONFIGS["relayout"].with_(guard="graph", guard_measure=measure)
    )
    report: OptimusReport = gm.optimus_report  # type: ignore[assignment]
    assert report.capture == "export"
    assert report.guard == verdict  # not "failed (TypeError)": the graph ran on the dict
    assert [t.speedup for t in report.guard_trials] == [2.0 if verdict == "kept" else 0.5]
    assert batched(gm) == (verdict == "kept")
    assert_same_state(state_before, state_of(model))
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert all(torch.equal(features[k], before[k]) for k in features)
    torch.testing.assert_close(seeded(gm, features), seeded(model, features), rtol=1e-5, atol=1e-6)
    eager = backward_grads(model, lambda v: seeded(model, v), features)
    mine = backward_grads(model, lambda v: seeded(gm, v), features)
    for a, b in zip(eager, mine, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
