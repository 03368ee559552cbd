"""matmul_as_linear: projections written as matmuls with a parameter become linears, bit for bit,
so the linear rules batch them; matmuls of two activations, batched parameters and other
contractions stay."""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND
from torch import nn

import optimus
from optimus.config import OptimusConfig
from optimus.cost.analytic import AnalyticCostModel, DeviceConstants
from optimus.params.relayout import RelayoutParams

FORMS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "operator": lambda x, w: x @ w,
    "torch.matmul": torch.matmul,
    "method": lambda x, w: x.matmul(w),
    "tensordot-1": lambda x, w: torch.tensordot(x, w, dims=1),
    "tensordot-last": lambda x, w: torch.tensordot(x, w, dims=([-1], [0])),
}


class Projections(nn.Module):
    """Four projections of one input (AutoInt's q, k, v and residual), written as ``form``."""

    def __init__(self, form: str, n: int = 4, d: int = 8) -> None:
        super().__init__()
        self.form = FORMS[form]
        self.ws = nn.ParameterList([nn.Parameter(torch.randn(d, d) * 0.3) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.tanh(self.form(x, w)) for w in self.ws], 1)


def _step(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    out = fn(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach()


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("relayout", [False, True], ids=["default", "relayout"])
def test_matmul_forms_become_linears_and_merge(form: str, relayout: bool) -> None:
    torch.manual_seed(0)
    model = Projections(form)
    ref = copy.deepcopy(model)
    x = torch.randn(5, 3, 8)
    config = OptimusConfig(layout=RelayoutParams()) if relayout else OptimusConfig()
    gm = optimus.optimize(model, (x,), config=config, cost_model=LAUNCH_BOUND)
    fired = gm.optimus_report.rules_fired
    assert fired.get("matmul_as_linear") == 4
    assert fired.get("merge_shared_linear", 0) >= 1, fired
    torch.testing.assert_close(_step(gm, x), _step(ref, x), rtol=1e-6, atol=1e-6)
    for p, q in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
    assert_same_results(ref(x), gm(x), sources=[x])
    assert set(model.state_dict()) == set(Projections(form).state_dict())


def test_alone_the_rewrite_is_bit_identical() -> None:
    """Without the merge (one projection), ``linear(x, W.t())`` runs eager's GEMM exactly."""
    torch.manual_seed(0)
    model = Projections("operator", n=1)
    ref = copy.deepcopy(model)
    x = torch.randn(6, 8)
    gm = optimus.optimize(model, (x,))
    assert gm.optimus_report.rules_fired.get("matmul_as_linear") == 1
    assert torch.equal(_step(gm, x), _step(ref, x))
    assert torch.equal(model.ws[0].grad, ref.ws[0].grad)


class NotProjections(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.batched = nn.Parameter(torch.randn(2, 8, 8))  # [E, in, r]: a batched matmul
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scores = x @ x.transpose(-1, -2)  # two activations
        experts = torch.matmul(x, self.batched.unsqueeze(1))  # a 3-D parameter operand
        first = torch.tensordot(x, self.w, dims=([0], [0]))  # contracts another dim
        left = operator.matmul(self.w, x.transpose(-1, -2))  # the parameter on the left
        return scores, experts, first, left


def test_matmuls_that_are_not_projections_stay() -> None:
    torch.manual_seed(0)
    model = NotProjections()
    x = torch.randn(8, 8)
    gm = optimus.optimize(model, (x,), cost_model=LAUNCH_BOUND)
    assert "matmul_as_linear" not in gm.optimus_report.rules_fired
    assert not any(n.target is F.linear for n in gm.graph.nodes)
    assert_same_results(model(x), gm(x), sources=[x, *model.parameters()])


def test_cost_model_declines_merging_what_it_exposed() -> None:
    """The rewrite is a cleanup (same GEMM); on a device where launches cost nothing, the merge it
    exposes is declined, and the four linears stay four GEMMs."""
    torch.manual_seed(0)
    model = Projections("torch.matmul")
    x = torch.randn(5, 3, 8)
    free = AnalyticCostModel(cpu=DeviceConstants(launch_s=0.0, bytes_per_s=1e9, flops_per_s=1e9))
    gm = optimus.optimize(model, (x,), cost_model=free)
    report = gm.optimus_report
    assert report.rules_fired.get("matmul_as_linear") == 4
    assert "merge_shared_linear" not in report.rules_fired
    assert report.declined.get("merge_shared_linear", 0) >= 1, report.declined
    assert sum(n.target is F.linear for n in gm.graph.nodes) == 4


def test_under_torch_compile_parameters_are_graph_inputs_and_still_rewritten() -> None:
    torch.manual_seed(0)
    model = Projections("tensordot-last")
    ref = copy.deepcopy(model)
    x = torch.randn(5, 3, 8)
    backend = optimus.backend(OptimusConfig(cost_model=LAUNCH_BOUND), inner=lambda gm, _: gm.forward)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    torch.testing.assert_close(_step(compiled, x), _step(ref, x), rtol=1e-6, atol=1e-6)
    fired = [r.rules_fired for r in backend.reports]
    assert any(f.get("matmul_as_linear") == 4 and f.get("merge_shared_linear") for f in fired), fired
    for p, q in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
