"""The training step's estimated peak (``optimus.memory.step``) and the memory ceiling in training:
the joint trace leaves the module, the grad mode and the RNG alone; it sees what the backward
holds; the ceiling declines, in training, a fusion whose forward fits but whose step does not,
keeps one whose step fits, and says so where the step cannot be traced."""

from __future__ import annotations

from typing import Any

import torch
from optimus_helpers import LAUNCH_BOUND, assert_parity
from torch import fx, nn

import optimus
from optimus import api
from optimus.memory.live import ceiling_budget, static_bytes
from optimus.memory.step import joint_graph, step_peak
from optimus.semantics.meta import record

G, B, N = 6, 64, 16


class NormTowersBesideWide(nn.Module):
    """G towers linear -> relu -> layer_norm -> sum, beside a wide value the backward never reads
    (sigmoid of an input without a gradient): the wide value holds the forward's peak, so fusing
    the towers does not lift it, but the fused backward holds every tower's gradient at once."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.ModuleList(nn.Linear(N, N) for _ in range(G))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        wide = torch.sigmoid(z).sum()
        towers = [
            nn.functional.layer_norm(torch.relu(lin(x[i])), (N,)).sum(0) for i, lin in enumerate(self.lin)
        ]
        return torch.stack(towers) + wide


class WideMatmul(nn.Module):
    """Two linears reading one input, beside a matmul whose [rows, rows] output dwarfs them in
    both passes: merging the linears fits under that peak."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(N, N), nn.Linear(N, N)
        self.w = nn.Parameter(torch.randn(N, 512))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x) + (x @ self.w).sum()


def _inputs(rows: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(G, B, N, generator=gen), torch.randn(rows, N, generator=gen)


def _captured(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    gm = fx.symbolic_trace(module)
    record(gm, inputs)
    return gm


def _optimize_train(module: nn.Module, inputs: tuple[torch.Tensor, ...], **kw: Any) -> fx.GraphModule:
    traced = fx.symbolic_trace(module)
    traced.train()
    kw.setdefault("cost_model", LAUNCH_BOUND)
    return optimus.optimize(traced, inputs, **kw)


def test_joint_graph_holds_the_backward_and_leaves_the_world_alone() -> None:
    torch.manual_seed(0)
    module, inputs = NormTowersBesideWide(), _inputs()
    gm = _captured(module, inputs)
    params = [p.detach().clone() for p in gm.parameters()]
    rng, grad_mode = torch.get_rng_state(), torch.is_grad_enabled()
    with torch.no_grad():
        joint = joint_graph(gm)
    targets = {str(n.target) for n in joint.graph.nodes if n.op == "call_function"}
    assert any("native_layer_norm_backward" in t for t in targets)  # the backward is in it
    outputs = next(n for n in joint.graph.nodes if n.op == "output").args[0]
    assert len(outputs) == 2 * G  # one gradient per weight and bias
    assert torch.equal(torch.get_rng_state(), rng) and torch.is_grad_enabled() == grad_mode
    for p, before in zip(gm.parameters(), params, strict=True):
        assert torch.equal(p, before) and p.grad is None


def test_step_peak_sees_the_saved_activations_the_forward_does_not() -> None:
    """A saved activation is alive until the backward reads it: the step's peak is above the
    forward's live peak plus the parameters and their gradients."""
    torch.manual_seed(0)
    module, inputs = NormTowersBesideWide(), _inputs(rows=8)
    gm = _captured(module, inputs)
    config = optimus.OptimusConfig(cost_model=LAUNCH_BOUND)
    forward = api._forward_peak(gm, config)
    assert step_peak(gm, inductor=False) > forward + 2 * static_bytes(gm)


def test_training_ceiling_declines_a_fusion_whose_step_breaks_it() -> None:
    """Must decline: the forward fits (the wide value holds its peak either way), the step does
    not. Without the step estimate the fusion was kept (it is, with no ceiling)."""
    torch.manual_seed(0)
    module, inputs = NormTowersBesideWide(), _inputs()
    free = _optimize_train(module, inputs)
    assert free.optimus_report.rules_fired.get("batch_layer_norm") == 1  # type: ignore[union-attr]
    captured = _captured(module, inputs)
    config = optimus.OptimusConfig(cost_model=LAUNCH_BOUND, memory_ceiling=0.02)
    static = static_bytes(captured)
    fits = ceiling_budget(static, api._forward_peak(captured, config), 0.02)
    assert api._forward_peak(free, config) <= fits  # the forward alone would have kept it
    budget = ceiling_budget(0, step_peak(captured, inductor=False), 0.02)
    assert step_peak(free, inductor=False) > budget

    gm = _optimize_train(module, inputs, config=config)
    report: Any = gm.optimus_report
    assert any(n.startswith("memory_ceiling: unchanged") for n in report.notes)  # no gated trial
    assert report.rules_fired == {}
    assert str(report.stop_reason) == "unchanged"
    assert_parity(module, gm, inputs)  # outputs and the parameters' gradients


def test_training_ceiling_keeps_a_fusion_whose_step_fits() -> None:
    """Must not decline: the wide matmul holds the step's peak, so the merged linears fit, and
    the run is the run without a ceiling."""
    torch.manual_seed(0)
    module, inputs = WideMatmul(), (torch.randn(512, N),)
    free = _optimize_train(module, inputs)
    assert free.optimus_report.rules_fired  # type: ignore[union-attr]
    gm = _optimize_train(module, inputs, config=optimus.OptimusConfig(memory_ceiling=0.02))
    report: Any = gm.optimus_report
    assert not any("memory_ceiling" in n for n in report.notes)
    assert report.rules_fired == free.optimus_report.rules_fired  # type: ignore[union-attr]
    assert gm.code == free.code
    assert_parity(module, gm, inputs)


def test_a_step_that_cannot_be_traced_runs_unjudged_and_says_why() -> None:
    """Must not block: with every parameter frozen no output needs a gradient, so there is no
    step to estimate; the run is made as without a ceiling and the report says why."""
    torch.manual_seed(0)
    module, inputs = NormTowersBesideWide(), _inputs()
    module.requires_grad_(False)
    free = _optimize_train(module, inputs)
    gm = _optimize_train(module, inputs, config=optimus.OptimusConfig(memory_ceiling=0.02))
    report: Any = gm.optimus_report
    assert any(
        n.startswith("memory_ceiling: training step not judged") and "needs a gradient" in n
        for n in report.notes
    )
    assert report.rules_fired == free.optimus_report.rules_fired  # type: ignore[union-attr]
    with torch.no_grad():
        torch.testing.assert_close(gm(*inputs), module(*inputs))


class Halves(nn.Module):
    """A value read as two slices: each slice's backward is a full-size zero-filled gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(B, 2 * N))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.w
        return y[:, :N].sum(0) + y[:, N:].sum(0)


def test_a_slice_backward_is_computed_inside_its_reader_under_inductor() -> None:
    """Eager holds both slices' full-size gradients until they are added; Inductor computes each
    as a masked load inside the add (``live._LOWERED_POINTWISE``), so neither holds a buffer."""
    from optimus.memory.live import inductor_placement

    module, inputs = Halves(), (torch.randn(B, 2 * N),)
    gm = _captured(module, inputs)
    joint = joint_graph(gm)
    backs = [n for n in joint.graph.nodes if "slice_backward" in str(n.target)]
    assert len(backs) == 2
    fused, _ = inductor_placement(list(joint.graph.nodes))
    assert set(backs) <= fused
    full = B * 2 * N * 4
    assert step_peak(gm, inductor=False) - step_peak(gm, inductor=True) >= full
