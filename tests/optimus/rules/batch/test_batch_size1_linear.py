"""batch_size1_linear: ``nn.Linear(1, N)`` per dense feature -> one broadcast multiply-add.

Firing cases check values, layouts and gradients against eager (to rounding: the GEMM may fuse
its multiply-add); must-not-fire cases: K > 1 (batch_linear's), other widths, and the cost-model
decline where launches cost nothing.
"""

from __future__ import annotations

import copy

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

G = 13  # Criteo's dense features


class DenseProjections(nn.Module):
    def __init__(self, k: int = 1, widths: list[int] | None = None, bias: bool = True) -> None:
        super().__init__()
        self.k = k
        widths = widths or [8] * G
        self.proj = nn.ModuleList([nn.Linear(k, n, bias=bias) for n in widths])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [p(x[:, i * self.k : (i + 1) * self.k]) for i, p in enumerate(self.proj)]


def _step(fn: object, x: torch.Tensor) -> list[torch.Tensor]:
    outs = fn(x)  # type: ignore[operator]
    sum((o * (i + 1)).square().sum() for i, o in enumerate(outs)).backward()
    return [o.detach() for o in outs]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("relayout", [False, True], ids=["default", "relayout"])
def test_one_feature_projections_become_one_multiply_add(bias: bool, relayout: bool) -> None:
    torch.manual_seed(0)
    model = DenseProjections(bias=bias)
    ref = copy.deepcopy(model)
    x = torch.randn(32, G)
    config = OptimusConfig(layout=RelayoutParams()) if relayout else OptimusConfig()
    gm = optimus.optimize(model, (x,), config=config)
    assert gm.optimus_report.rules_fired.get("batch_size1_linear") == 1
    assert not any(n.target is F.linear for n in gm.graph.nodes)
    for a, b in zip(_step(ref, x), _step(gm, x), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    for p, q in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5)
    assert_same_results(ref(x), gm(x), sources=[x])


def test_wider_inputs_are_batch_linears_and_other_widths_are_not_grouped() -> None:
    torch.manual_seed(0)
    wide = DenseProjections(k=2)
    x = torch.randn(32, 2 * G)
    gm = optimus.optimize(wide, (x,), cost_model=LAUNCH_BOUND)
    assert "batch_size1_linear" not in gm.optimus_report.rules_fired
    assert gm.optimus_report.rules_fired.get("batch_linear", 0) >= 1
    mixed = DenseProjections(widths=[8, 4] * G)
    x = torch.randn(32, 2 * G)
    gm = optimus.optimize(mixed, (x,), cost_model=LAUNCH_BOUND)
    assert gm.optimus_report.rules_fired.get("batch_size1_linear") == 2  # one group per width
    assert_same_results(copy.deepcopy(mixed)(x), gm(x), sources=[x])


def test_cost_model_declines_where_launches_are_free() -> None:
    torch.manual_seed(0)
    model = DenseProjections()
    x = torch.randn(32, G)
    free = AnalyticCostModel(cpu=DeviceConstants(launch_s=0.0, bytes_per_s=1e9, flops_per_s=1e9))
    gm = optimus.optimize(model, (x,), cost_model=free)
    report = gm.optimus_report
    assert "batch_size1_linear" not in report.rules_fired
    assert report.declined.get("batch_size1_linear", 0) >= 1, report.declined


def test_under_autocast_the_projections_stay_linears() -> None:
    """Found by the fuzzer: autocast runs each linear in bfloat16, an addcmul it would run in
    float32, so the fused form would hand back another dtype. Declined by the key."""

    class Autocast(DenseProjections):
        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return super().forward(x)

    torch.manual_seed(0)
    model = Autocast()
    x = torch.randn(8, G)
    gm = optimus.optimize(model, (x,), config=OptimusConfig(layout=RelayoutParams()), cost_model=LAUNCH_BOUND)
    assert "batch_size1_linear" not in gm.optimus_report.rules_fired
    want, got = model(x), gm(x)
    assert [t.dtype for t in got] == [t.dtype for t in want] == [torch.bfloat16] * G
    assert_same_results(want, got, sources=[x])
