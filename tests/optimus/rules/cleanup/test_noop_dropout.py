"""noop_dropout: a dropout that returns its input itself (p == 0, or training off) is replaced by
its input; one that draws from the RNG, or a Dropout module (its p and mode are read at run time),
stays. Then an MMoE-style block (merged expert linears, relu, dropout(p=0), expert linears) batches
end to end: the dropouts no longer sit between one batched group and the next."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from layout_helpers import assert_same_results
from optimus_helpers import assert_parity, optimize_traced
from torch import nn

import optimus
from optimus.config import OptimusConfig
from optimus.params.relayout import RelayoutParams


def _dropouts(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if "dropout" in str(n.target))


class Chain(nn.Module):
    def __init__(self, p: float, training: bool) -> None:
        super().__init__()
        self.p, self.flag = p, training
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.dropout(torch.relu(self.lin(x)), self.p, self.flag)
        return h, torch.dropout(h * 2, self.p, self.flag)


def test_a_dropout_that_is_off_is_its_input_and_results_are_eager_s() -> None:
    for p, training in ((0.0, True), (0.5, False)):
        torch.manual_seed(0)
        model, x = Chain(p, training), torch.randn(4, 8)
        gm = optimize_traced(model, [x])
        assert gm.optimus_report.rules_fired.get("noop_dropout") == 2
        assert _dropouts(gm) == 0
        assert_parity(model, gm, [x])
        assert_same_results(model(x), gm(x), sources=[x, *model.parameters()])


def test_a_dropout_that_draws_stays_and_the_rng_stream_is_eager_s() -> None:
    torch.manual_seed(0)
    model, x = Chain(0.5, True), torch.randn(4, 8)
    gm = optimize_traced(model, [x])
    assert "noop_dropout" not in gm.optimus_report.rules_fired
    assert _dropouts(gm) == 2
    torch.manual_seed(7)
    want = model(x)
    torch.manual_seed(7)
    got = gm(x)
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(b, a)


def test_a_dropout_module_is_left_alone() -> None:
    class WithModule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.drop = nn.Linear(8, 8), nn.Dropout(0.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(self.lin(x))

    model, x = WithModule(), torch.randn(4, 8)
    gm = optimus.optimize(torch.fx.symbolic_trace(model), (x,), rules=["noop_dropout"])
    assert "noop_dropout" not in gm.optimus_report.rules_fired
    model.drop.p = 0.5  # the module's p is read at every call: the graph must still see it
    torch.manual_seed(3)
    want = model(x)
    torch.manual_seed(3)
    torch.testing.assert_close(gm(x), want)


class Experts(nn.Module):
    """MMoE's experts as DeepCTR writes them: linear -> relu -> dropout(p=0) -> linear, stacked."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.first = nn.ModuleList([nn.Linear(16, 32) for _ in range(n)])
        self.second = nn.ModuleList([nn.Linear(32, 8) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for a, b in zip(self.first, self.second, strict=True):
            h = F.dropout(torch.relu(a(x)), 0.0, self.training)
            outs.append(F.dropout(torch.relu(b(h)), 0.0, self.training))
        return torch.stack(outs, 1)


def test_experts_batch_end_to_end_once_the_dropouts_are_gone() -> None:
    torch.manual_seed(0)
    model, x = Experts(), torch.randn(64, 16)
    ref = copy.deepcopy(model)
    gm = optimus.optimize(model, (x,), config=OptimusConfig(layout=RelayoutParams()))
    fired = gm.optimus_report.rules_fired
    assert fired.get("noop_dropout") == 8 and fired.get("merge_shared_linear") == 1, fired
    assert fired.get("batch_linear") == 1 and fired.get("stack_unbind") == 1, fired
    targets = [n.target for n in gm.graph.nodes]
    assert F.linear not in targets and torch._C._nn.linear not in targets
    assert targets.count(torch.baddbmm) == 2  # one per layer, the stack one contiguous clone
    assert torch.stack not in targets and torch.unbind not in targets
    w = torch.randn(64, 4, 8)
    want, got = ref(x), gm(x)
    (want * w).sum().backward()
    (got * w).sum().backward()
    assert_same_results(want, got, sources=[x])
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
