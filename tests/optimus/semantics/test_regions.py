"""Regions: nothing is grouped, merged or moved across a grad-mode / autocast / context boundary.

Each model mixes ops under ``torch.no_grad()`` / ``torch.autocast`` with the same ops outside;
before regions existed the engine batched them together (frozen and trainable towers all ran
without grad; fp32 towers came back bfloat16). Checked under ``optimize`` (default cost model,
a launch-bound one that makes every rule fire, and the parameter re-layout), under
``torch.compile(backend="optimus")`` and under the Inductor pre-grad pass.
"""

from __future__ import annotations

import copy

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND
from torch import fx, nn

import optimus
from optimus.backend import OptimusPreGradPass
from optimus.params.relayout import RelayoutParams

CONFIGS = {
    "default": lambda: optimus.OptimusConfig(),
    "launch_bound": lambda: optimus.OptimusConfig(cost_model=LAUNCH_BOUND),
    "relayout": lambda: optimus.OptimusConfig(layout=RelayoutParams()),
    "relayout_launch_bound": lambda: optimus.OptimusConfig(cost_model=LAUNCH_BOUND, layout=RelayoutParams()),
}


class NoGradTowers(nn.Module):
    """Two frozen towers computed under no_grad, two trainable ones: all on the same input."""

    def __init__(self, n: int = 2, width: int = 8) -> None:
        super().__init__()
        self.frozen = nn.ModuleList(nn.Linear(width, width) for _ in range(n))
        self.trained = nn.ModuleList(nn.Linear(width, width) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            f = [torch.tanh(t(x)) for t in self.frozen]
        g = [torch.tanh(t(x)) for t in self.trained]
        return torch.stack(f + g).sum(0)


class AutocastTowers(nn.Module):
    """Two linears under autocast(cpu, bfloat16), two in fp32."""

    def __init__(self, n: int = 2, width: int = 8) -> None:
        super().__init__()
        self.low = nn.ModuleList(nn.Linear(width, width) for _ in range(n))
        self.full = nn.ModuleList(nn.Linear(width, width) for _ in range(n))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = [t(x) for t in self.low]
        full = [t(x) for t in self.full]
        return (*low, *full)


def _grads_after_backward(module: nn.Module, fn: object, x: torch.Tensor) -> dict[str, torch.Tensor | None]:
    for p in module.parameters():
        p.grad = None
    out = fn(x)  # type: ignore[operator]
    out.sum().backward()
    return {name: (None if p.grad is None else p.grad.clone()) for name, p in module.named_parameters()}


def _check_no_grad_towers(module: NoGradTowers, fn: object, x: torch.Tensor) -> None:
    reference = copy.deepcopy(module)
    want = _grads_after_backward(reference, reference, x)
    got = _grads_after_backward(module, fn, x)
    for name, g in want.items():
        if name.startswith("frozen"):
            assert g is None and got[name] is None, name
        else:
            assert got[name] is not None, f"{name}: trainable tower lost its gradient"
            torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fn(x), reference(x), rtol=1e-4, atol=1e-5)  # type: ignore[operator]


def _check_autocast(module: AutocastTowers, fn: object, x: torch.Tensor) -> None:
    want = module(x)
    got = fn(x)  # type: ignore[operator]
    assert [o.dtype for o in got] == [o.dtype for o in want] == [torch.bfloat16] * 2 + [torch.float32] * 2
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_no_grad_towers_keep_their_grad_mode(config: str) -> None:
    torch.manual_seed(0)
    module = NoGradTowers()
    x = torch.randn(4, 8)
    gm = optimus.optimize(module, (x,), config=CONFIGS[config]())
    _check_no_grad_towers(module, gm, x)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_autocast_towers_keep_their_dtype(config: str) -> None:
    torch.manual_seed(0)
    module = AutocastTowers()
    x = torch.randn(4, 8)
    gm = optimus.optimize(module, (x,), config=CONFIGS[config]())
    _check_autocast(module, gm, x)


def test_grouping_across_a_region_is_declined_with_a_reason() -> None:
    torch.manual_seed(0)
    module = NoGradTowers(n=3)
    gm = optimus.optimize(module, (torch.randn(4, 8),), cost_model=LAUNCH_BOUND)
    reasons = gm.optimus_report.declined_reasons
    assert any("grouping across grad region" in r for r in reasons), reasons
    # each region is still optimized on its own
    assert gm.optimus_report.rules_fired.get("batch_unary") == 2


class MixedModes(nn.Module):
    """set_grad_enabled, enable_grad nested in no_grad, inference_mode and CSE candidates in
    different regions: every op must run in the mode eager runs it in."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.tanh(x * 2)
        with torch.no_grad():
            b = torch.tanh(x * 2)  # same call as ``a``: must not be merged with it
            with torch.enable_grad():
                c = torch.tanh(x * 3)
            d = torch.tanh(x * 3)
        with torch.set_grad_enabled(False):
            e = torch.tanh(x * 4)
        f = torch.tanh(x * 4)
        return a, b, c, d, e, f


@pytest.mark.parametrize("config", ["launch_bound", "default"])
def test_grad_modes_survive_cse_and_batching(config: str) -> None:
    x = torch.randn(4, 8, requires_grad=True)
    gm = optimus.optimize(MixedModes(), (x,), config=CONFIGS[config]())
    got, want = gm(x), MixedModes()(x)
    assert (
        [o.requires_grad for o in got]
        == [o.requires_grad for o in want]
        == [True, False, True, False, False, True]
    )
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


class InferenceBlock(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.inference_mode():
            a = torch.tanh(x + 1)
            b = torch.tanh(x + 2)
        c = torch.tanh(x + 3)
        d = torch.tanh(x + 4)
        return a, b, c, d


def test_inference_mode_region_is_kept() -> None:
    x = torch.randn(4, 8, requires_grad=True)
    gm = optimus.optimize(InferenceBlock(), (x,), cost_model=LAUNCH_BOUND)
    got, want = gm(x), InferenceBlock()(x)
    assert [o.is_inference() for o in got] == [o.is_inference() for o in want] == [True, True, False, False]
    assert [o.requires_grad for o in got] == [o.requires_grad for o in want]


def test_unknown_context_node_is_a_boundary_with_a_note() -> None:
    """A context node the engine has no model of (here forward-AD's dual level, as Dynamo records
    it) still cuts the graph: nothing is grouped or moved across it, and the report says why."""
    from torch._functorch.predispatch import _enter_dual_level, _exit_dual_level

    g = fx.Graph()
    x = g.placeholder("x")
    outs = [g.call_function(torch.tanh, (g.call_function(torch.add, (x, 1.0)),))]
    level = g.call_function(_enter_dual_level, ())
    outs += [g.call_function(torch.tanh, (g.call_function(torch.add, (x, float(i))),)) for i in range(2, 4)]
    g.call_function(_exit_dual_level, (), {"level": level})
    outs += [g.call_function(torch.tanh, (g.call_function(torch.add, (x, float(i))),)) for i in range(4, 6)]
    g.output(tuple(outs))
    gm = fx.GraphModule(nn.Module(), g)
    x0 = torch.randn(4, 8)
    out = optimus.optimize(gm, (x0,), cost_model=LAUNCH_BOUND)
    rep = out.optimus_report
    assert any("unknown context node _enter_dual_level" in n for n in rep.notes), rep.notes
    # the enter/exit nodes survive, and no tanh moved across them
    order = [n for n in out.graph.nodes if n.op == "call_function"]
    enter = next(i for i, n in enumerate(order) if n.target is _enter_dual_level)
    leave = next(i for i, n in enumerate(order) if n.target is _exit_dual_level)
    inside = [n for n in order[enter + 1 : leave] if n.target in (torch.tanh, torch.stack)]
    assert inside, "the region's own ops stay inside it"
    for node in order[:enter] + order[leave + 1 :]:
        assert not (node.target is torch.stack and len(node.args[0]) > 2), node.format_node()
    for a, b in zip(out(x0), gm(x0), strict=True):
        torch.testing.assert_close(a, b)


# -- torch.compile (Inductor): few and tiny ---------------------------------------------------------


@pytest.mark.compile
def test_backend_keeps_grad_mode_and_autocast() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    towers = NoGradTowers()
    x = torch.randn(4, 8)
    backend = optimus.backend(optimus.OptimusConfig(cost_model=LAUNCH_BOUND))
    _check_no_grad_towers(towers, torch.compile(towers, backend=backend), x)
    cast = AutocastTowers()
    _check_autocast(cast, torch.compile(cast, backend=backend), x)


@pytest.mark.compile
def test_pre_grad_pass_keeps_grad_mode() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    towers = NoGradTowers()
    x = torch.randn(4, 8)
    tuned = OptimusPreGradPass(optimus.OptimusConfig(cost_model=LAUNCH_BOUND))
    with torch._inductor.config.patch(pre_grad_custom_pass=tuned, force_disable_caches=True):
        _check_no_grad_towers(towers, torch.compile(towers), x)
    assert any(r.capture == "pre_grad" for r in tuned.reports)


def test_topological_sort_never_moves_a_node_across_a_boundary() -> None:
    """The safety net under every rewrite: if a (buggy) rewrite made a node before a grad-mode
    switch read one computed after it, the sort must fail (the round is rolled back) instead of
    silently moving the later node, and its grad mode, across the switch."""
    from optimus.semantics.graph_index import CycleError, stable_toposort

    g = fx.Graph()
    x = g.placeholder("x")
    off = g.call_function(torch._C._set_grad_enabled, (False,))
    early = g.call_function(torch.tanh, (x,))
    on = g.call_function(torch._C._set_grad_enabled, (True,))
    late = g.call_function(torch.sigmoid, (x,))
    g.output((early, late))
    early.args = (late,)  # now "early" (no_grad) reads "late" (grad enabled)
    with pytest.raises(CycleError):
        stable_toposort(g, {off, on})


class _Modes(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x.sin()
        with torch.no_grad():
            b = x.cos()
            with torch.enable_grad():
                c = x.tan()
            d = x.exp()
        with torch.inference_mode():
            e = x.abs()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            f = x.neg()
        return a, b, c, d, e, f


def test_regions_know_where_grad_mode_is_off() -> None:
    """``Regions.grad_disabled``: the grad mode each op runs in, from the context nodes alone, so
    it also holds for nodes a rule made (they record no ``requires_grad``)."""
    from optimus.capture.export import export
    from optimus.semantics.regions import Regions

    x = torch.randn(3, requires_grad=True)
    gm = export(_Modes(), (x,))
    nodes = list(gm.graph.nodes)
    regions = Regions(nodes)
    methods = {n.target: n for n in nodes if n.op == "call_method"}
    off = {name: regions.grad_disabled(methods[name]) for name in ("sin", "cos", "tan", "exp", "abs", "neg")}
    assert off == {"sin": False, "cos": True, "tan": False, "exp": True, "abs": True, "neg": False}
