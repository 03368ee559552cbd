"""LayoutSnapshot: a driver run's re-layout undone, so a graph put back leaves the parameters and
the GraphModule exactly as the caller had them (what the measured guard relies on when it rejects
a rewrite), and the same parameters can be re-laid out again afterwards."""

from __future__ import annotations

import torch
from optimus_helpers import LAUNCH_BOUND
from torch import fx, nn

import optimus
from models.synthetic_towers import Towers
from optimus.params.contract import BINDINGS_KEY
from optimus.params.group import GROUP_ATTR
from optimus.params.relayout import OWNED_FLAG, PREFIX, RelayoutParams
from optimus.params.snapshot import LayoutSnapshot
from optimus.semantics.graph_copy import copy_graph
from optimus.semantics.meta import record


def traced(model: nn.Module, x: torch.Tensor) -> fx.GraphModule:
    gm = fx.symbolic_trace(model)
    record(gm, (x,))
    setattr(gm, OWNED_FLAG, True)  # as optimize() marks the graphs it owns
    return gm


def looks(model: nn.Module) -> list[tuple[int, tuple[int, ...], bool, object, object, int]]:
    """Storage address, strides, group tag, hook dicts and the identity of ``.grad``, per parameter."""
    return [
        (
            p.data_ptr(),
            p.stride(),
            hasattr(p, GROUP_ATTR),
            p._backward_hooks,
            p._post_accumulate_grad_hooks,
            id(p.grad),
        )
        for p in model.parameters()
    ]


def test_restore_undoes_the_relayout_of_a_driver_run() -> None:
    torch.manual_seed(0)
    model = Towers(4, 3, 5, slices="index", body=("linear", "tanh"))
    x = torch.randn(4, 2, 3)
    gm = traced(model, x)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = looks(model)
    keys = set(gm.state_dict())
    plain = copy_graph(gm.graph)
    snapshot = LayoutSnapshot(gm)
    cfg = optimus.OptimusConfig(layout=RelayoutParams(), cost_model=LAUNCH_BOUND)
    report = optimus.optimize_graph_module(gm, cfg)
    assert report.rules_fired.get("batch_linear") == 1
    assert looks(model) != before and [n for n, _ in gm.named_parameters() if n.startswith(PREFIX)]
    assert gm._forward_pre_hooks and gm.meta.get(BINDINGS_KEY)

    snapshot.restore()
    gm.graph = plain
    assert looks(model) == before
    assert not [n for n, _ in gm.named_parameters() if n.startswith(PREFIX)]
    assert not gm._forward_pre_hooks and BINDINGS_KEY not in gm.meta and "_apply" not in gm.__dict__
    assert set(gm.state_dict()) == keys
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)

    # the same parameters re-lay out again, as they did the first time
    again = optimus.optimize(fx.symbolic_trace(model), (x,), config=cfg)
    assert again.optimus_report.rules_fired.get("batch_linear") == 1
    model.zero_grad(set_to_none=True)
    again(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    for p, g in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)
