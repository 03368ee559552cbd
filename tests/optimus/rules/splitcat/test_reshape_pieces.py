"""reshape_pieces: stack/cat of adjacent equal split pieces that each get the same reshape -> one
reshape of the moved source and one contiguous clone (Inductor's move_reshape_out_of_split_stack)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND, assert_parity
from split_cat_helpers import fired, module_of, ops
from torch import fx

import optimus

RULES = ["reshape_pieces"]


def run(fn: Any, inputs: Sequence[torch.Tensor], rules: Sequence[str], **kw: Any) -> fx.GraphModule:
    """``split_cat_helpers.run`` through export capture (the cases iterate over a split's pieces,
    which symbolic_trace cannot): optimize ``fn(self, *inputs)`` with ``rules``, check forward
    and backward parity, return the graph."""
    mod = module_of(fn)
    kw.setdefault("cost_model", LAUNCH_BOUND)
    gm = optimus.optimize(mod, tuple(inputs), rules=list(rules), **kw)
    assert_parity(mod, gm, inputs)
    assert gm.optimus_report.rolled_back == {}, gm.optimus_report.rolled_back
    return gm


def _clones(gm) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for n in gm.graph.nodes if n.target is torch.clone)


# (shape of x, function of the pieces' source): each returns the stack/cat raw, so its layout and
# freshness are observed; the source is the model input itself unless the case says otherwise
CASES = {
    # split on dim 1, reshape views, stacked at 1 (the pattern-class case)
    "stack_views": (
        (2, 32, 8, 4),
        lambda x: torch.stack([s.reshape(2, -1) for s in torch.split(x, 4, 1)], 1),
    ),
    "stack_dim0": (
        (2, 32, 8, 4),
        lambda x: torch.stack([s.reshape(-1, 32) for s in torch.split(x, 8, 1)], 0),
    ),
    "stack_last": ((6, 12), lambda x: torch.stack([s.reshape(3, 2, 4) for s in torch.split(x, 2, 0)], 3)),
    # the pieces are not viewable as S: each reshape copies in eager, the moved reshape copies too
    "stack_copying": ((6, 32), lambda x: torch.stack([s.reshape(-1) for s in torch.split(x, 4, 1)], 0)),
    "view_forms": ((4, 24), lambda x: torch.stack([s.view(4, 2, 3) for s in torch.split(x, 6, 1)], 1)),
    "flatten_chunk": ((3, 4, 8, 5), lambda x: torch.stack([s.flatten(1) for s in torch.chunk(x, 4, 2)], 2)),
    "partial_run": ((3, 24), lambda x: torch.stack([s.reshape(-1, 2) for s in torch.split(x, 4, 1)[1:5]], 0)),
    "narrows": ((3, 16), lambda x: torch.stack([x.narrow(1, 4 * i, 4).reshape(2, 6) for i in range(4)], 0)),
    "cat_views": ((2, 32, 8, 4), lambda x: torch.cat([s.reshape(2, -1) for s in torch.split(x, 4, 1)], 1)),
    "cat_dim0": ((32, 8), lambda x: torch.cat([s.view(-1, 4) for s in torch.split(x, 4, 0)], 0)),
    "cat_copying": ((6, 32), lambda x: torch.cat([s.reshape(3, -1) for s in torch.split(x, 8, 1)], 1)),
    "of_an_intermediate": (
        (4, 24),
        lambda x: (torch.stack([s.reshape(2, 4, 3) for s in torch.split(x * 2.0, 6, 1)], 1), x * 2.0),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_equally_reshaped_pieces_become_one_reshape_and_one_clone(case: str) -> None:
    shape, body = CASES[case]

    def f(self, x):  # type: ignore[no-untyped-def]
        return body(x)

    torch.manual_seed(0)
    x = torch.randn(shape)
    gm = run(f, [x], RULES)  # forward and backward parity
    assert fired(gm, "reshape_pieces") == 1, gm.optimus_report.declined
    assert ops(gm, "split") == ops(gm, "stack") == ops(gm, "cat") == 0
    assert _clones(gm) == 1
    # values, strides, contiguity, and no result sharing memory with x (eager's stack is fresh)
    assert_same_results(module_of(f)(x), gm(x), sources=[x])


def test_under_export_capture_and_the_default_cost_model() -> None:
    class M(torch.nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.stack([s.reshape(2, -1) for s in torch.split(x, 4, 1)], 1)

    x = torch.randn(2, 32, 8, 4)
    gm = optimus.optimize(M(), (x,))
    assert gm.optimus_report.rules_fired.get("reshape_pieces") == 1
    assert_same_results(M()(x), gm(x), sources=[x])


@pytest.mark.parametrize("case", ["permuted", "gap", "two_sources", "transposed", "other_dims"])
def test_must_not_fire(case: str) -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.split(x, 4, 1)
        if case == "permuted":
            return torch.stack([p[1].reshape(-1), p[0].reshape(-1)], 0)
        if case == "gap":
            return torch.stack([p[0].reshape(-1), p[2].reshape(-1)], 0)
        if case == "two_sources":
            return torch.stack([p[0].reshape(-1), torch.split(x * 2.0, 4, 1)[1].reshape(-1)], 0)
        if case == "transposed":  # a layout op, not a reshape
            return torch.stack([p[0].t(), p[1].t()], 0)
        # pieces of x along two dims ([4, 3] and [1, 12]), reshaped alike
        return torch.stack([torch.split(x, 3, 1)[0].reshape(-1), torch.split(x, 1, 0)[0].reshape(-1)], 0)

    gm = run(f, [torch.randn(4, 12)], RULES)
    assert fired(gm, "reshape_pieces") == 0
    assert ops(gm, "stack") == 1


def test_a_dtype_view_is_not_a_reshape() -> None:
    """``p.view(torch.int32)`` reinterprets the bytes (same count of elements, another dtype):
    not a reshape, so the stack stays (no gradients to compare: the view cuts them)."""

    class M(torch.nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.stack([s.contiguous().view(torch.int32) for s in torch.split(x, 4, 1)], 0)

    x = torch.randn(3, 8)
    gm = optimus.optimize(M(), (x,), rules=RULES, cost_model=LAUNCH_BOUND)
    assert fired(gm, "reshape_pieces") == 0 and ops(gm, "stack") == 1
    assert_same_results(M()(x), gm(x), sources=[x])


def test_a_source_written_in_place_keeps_the_pieces() -> None:
    """Real aliasing: the pieces (and their reshapes) are views of h, so writing h after the
    reshapes changes what the stack reads; nothing of it is moved or replaced (integer inputs:
    autograd forbids writing the base of a split's views)."""

    def f(self, x):  # type: ignore[no-untyped-def]
        h = x * 1
        r = [s.reshape(-1) for s in torch.split(h, 2, 1)]
        h.add_(1)
        return torch.stack(r, 0)

    gm = run(f, [torch.randint(0, 9, (3, 4))], RULES)
    assert fired(gm, "reshape_pieces") == 0 and ops(gm, "stack") == 1


def test_declined_when_the_reshapes_stay_alive() -> None:
    """Two pieces whose reshapes are also read elsewhere: the unflatten, reshape and clone cost
    more than the two-input stack they replace (the reshapes and the split stay for the other
    readers): the default cost model declines it."""

    def f(self, x):  # type: ignore[no-untyped-def]
        r = [s.reshape(3, 4) for s in torch.split(x, 2, 0)]
        return torch.stack(r, 0), r[0] * 2.0, r[1] * 3.0

    gm = run(f, [torch.randn(4, 6)], RULES, cost_model=optimus.AnalyticCostModel())
    assert fired(gm, "reshape_pieces") == 0 and ops(gm, "stack") == 1
    assert gm.optimus_report.declined.get("reshape_pieces", 0) >= 1
