"""cat_gather: a cat of repeated or reordered unbind pieces (PNN's pairwise ``cat([e[i] for i in
row], 1)``) -> one index_select; eager's values, gradients and contiguous fresh result; must not
fire for an in-order run (unbind_cat's), pieces of two sources or a written source; the cost model
declines a short gather without gradients."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND, assert_parity
from split_cat_helpers import fired, ops
from torch import nn

import optimus
from optimus.engine.builder import CONSTANT_PREFIX

F = 8
ROW, COL = zip(*itertools.combinations(range(F), 2), strict=True)


class Pairs(nn.Module):
    """DeepCTR's inner-product layer over F embedded features."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        embeds = torch.unbind(x * 1.0, 1)  # x: [B, F, 1, D] -> F pieces [B, 1, D]
        p = torch.cat([embeds[i] for i in ROW], 1)
        q = torch.cat([embeds[j] for j in COL], 1)
        return (p * q).sum(-1)


def test_pairwise_cats_become_gathers_with_eager_results() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, F, 1, 4, requires_grad=True)
    model = Pairs()
    gm = optimus.optimize(model, (x,))
    assert fired(gm, "cat_gather") == 2 and ops(gm, "cat") == 0
    assert_parity(model, gm, [x])
    assert_same_results(model(x), gm(x), sources=[x])


@pytest.mark.parametrize("case", ["in-order", "two-sources", "written"])
def test_must_not_fire(case: str) -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
            a, b = torch.unbind(x * 1.0, 1), torch.unbind(z * 1.0, 1)
            if case == "in-order":
                return torch.cat([a[0], a[1], a[2]], 1)
            if case == "two-sources":
                return torch.cat([a[1], b[0], a[1]], 1)
            h = x * 1.0
            pieces = torch.unbind(h, 1)
            out = torch.cat([pieces[1], pieces[0], pieces[1]], 1)
            h.add_(1.0)
            return out + h.sum()

    x, z = torch.randn(4, 3, 2), torch.randn(4, 3, 2)
    gm = optimus.optimize(M(), (x, z), cost_model=LAUNCH_BOUND)
    assert fired(gm, "cat_gather") == 0
    torch.testing.assert_close(gm(x, z), M()(x, z))


def test_the_cost_model_declines_a_short_gather_without_gradients() -> None:
    class Short(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = torch.unbind(x * 1.0, 1)
            return torch.cat([a[1], a[0], a[1]], 1)

    gm = optimus.optimize(Short(), (torch.randn(4, 3, 2),))  # no grad: the cat's backward never runs
    assert fired(gm, "cat_gather") == 0 and gm.optimus_report.declined.get("cat_gather") == 1


def test_the_index_is_a_buffer_made_once_outside_the_state_dict() -> None:
    torch.manual_seed(1)
    x = torch.randn(8, F, 1, 4, requires_grad=True)  # with gradients: 28 pieces gather
    model = Pairs()
    gm = optimus.optimize(model, (x,))
    assert fired(gm, "cat_gather") == 2
    assert not [n for n in gm.graph.nodes if n.target is torch.tensor]  # nothing built per call
    consts = [name for name, _ in gm.named_buffers() if name.startswith(CONSTANT_PREFIX)]
    assert len(consts) == 2
    assert not [k for k in gm.state_dict() if k.startswith(CONSTANT_PREFIX)]
    torch.testing.assert_close(copy.deepcopy(gm)(x), model(x))
    gm.double()  # the index stays int64; the gather follows the input's dtype
    assert all(b.dtype == torch.int64 for name, b in gm.named_buffers() if name in consts)
    torch.testing.assert_close(gm(x.double()), model(x.double()))


def test_a_rolled_back_run_leaves_no_index_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gathers are built (and their buffers registered), then the run fails and the graph is
    restored: the buffers no node reads are dropped with it."""
    from optimus.engine import driver

    def fail(report: object) -> None:
        raise RuntimeError("injected after the rewrites")

    monkeypatch.setattr(driver, "_note_unchanged", fail)
    x = torch.randn(8, F, 1, 4, requires_grad=True)
    model = Pairs()
    gm = optimus.optimize(model, (x,))
    assert "unchanged: RuntimeError: injected after the rewrites" in gm.optimus_report.notes
    assert not [name for name, _ in gm.named_buffers() if name.startswith(CONSTANT_PREFIX)]
    torch.testing.assert_close(gm(x), model(x))


def test_the_optimus_backend_and_inductor_run_the_gather() -> None:
    torch.manual_seed(2)
    x = torch.randn(8, F, 1, 4, requires_grad=True)
    model = Pairs()
    torch._dynamo.reset()
    backend_out = torch.compile(model, backend="optimus", fullgraph=True)(x)
    assert_same_results(model(x), backend_out, sources=[x])
    gm = optimus.optimize(model, (x,))
    assert fired(gm, "cat_gather") == 2
    inductor_out = torch.compile(gm, fullgraph=True)(x)
    torch.testing.assert_close(inductor_out, model(x))
    (g,) = torch.autograd.grad(inductor_out.sum(), x)
    (want,) = torch.autograd.grad(model(x).sum(), x)
    torch.testing.assert_close(g, want)
