"""Runs of adjacent equal split pieces among other tensors in one cat/stack (Inductor's
``split_stack_to_cats`` / ``merge_getitem_cat`` shapes): ``stack_pieces``, ``cat_pieces`` (a cat on
another dim) and ``reshape_pieces`` (each piece reshaped alike) rewrite each run into one input
and keep the others. Checked: eager's values, gradients, strides and memory sharing (the result
is fresh storage, never the model input or a returned piece); nothing fires where a piece or
its source is written in place or the run is permuted or gapped; short runs are declined by the
cost model (``report.declined``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND, assert_parity
from split_cat_helpers import fired, module_of, ops
from torch import fx

import optimus


def run(fn: Any, inputs: Sequence[torch.Tensor], rules: Sequence[str], **kw: Any) -> fx.GraphModule:
    """Export-capture ``fn(self, *inputs)`` (the cases unpack a split's pieces), optimize with
    ``rules`` (launch-bound cost model unless given), check forward and backward parity and
    eager's layout and memory sharing with the inputs, return the graph."""
    mod = module_of(fn)
    kw.setdefault("cost_model", LAUNCH_BOUND)
    gm = optimus.optimize(mod, tuple(inputs), rules=["normalize_split_cat", *rules], **kw)
    assert gm.optimus_report.rolled_back == {}, gm.optimus_report.rolled_back
    assert_parity(mod, gm, inputs)
    assert_same_results(mod(*inputs), gm(*inputs), sources=list(inputs))
    return gm


def _cat_inputs(gm: fx.GraphModule) -> list[int]:
    return [len(n.args[0]) for n in gm.graph.nodes if n.target is torch.cat]


def _ones(*shape: int) -> torch.Tensor:
    return torch.ones(*shape)


# rule -> case -> (shape of x, body, inputs of the one cat the rewrite leaves)
FIRES: dict[str, dict[str, tuple[tuple[int, ...], Callable[..., Any], int]]] = {
    "stack_pieces": {
        "new_dim_1": (
            (2, 32, 3),
            lambda x: torch.stack([_ones(2, 2, 3), *torch.split(x, 2, 1), _ones(2, 2, 3)], 1),
            3,
        ),
        "new_dim_0": ((2, 32, 3), lambda x: torch.stack([*torch.split(x, 2, 1), x[:, :2] * 2.0], 0), 2),
        "last_dim": ((2, 32, 3), lambda x: torch.stack([x[:, :2] + 1.0, *torch.split(x, 2, 1)], 3), 2),
        "partial_run": (
            (2, 80),
            lambda x: torch.stack([_ones(2, 2), *torch.split(x, 2, 1)[2:38], _ones(2, 2)], 0),
            3,
        ),
        "two_runs": (
            (2, 32),
            lambda x: torch.stack([*torch.split(x, 2, 1), _ones(2, 2), *torch.split(x * 2.0, 2, 1)], 1),
            3,
        ),
        "slices": (
            (4, 36),
            lambda x: torch.stack([_ones(4, 2), *[x[:, i : i + 2] for i in range(0, 36, 2)]], 0),
            2,
        ),
    },
    "cat_pieces": {
        "leading": (
            (2, 128, 3),
            lambda x: torch.cat([x[:, :2] * 2.0, *torch.split(x, 2, 1), _ones(3, 2, 3)], 0),
            3,
        ),
        "partial_run": ((160, 3), lambda x: torch.cat([_ones(2, 4), *torch.split(x, 2, 0)[1:79]], 1), 2),
    },
    "reshape_pieces": {
        "stack": (
            (2, 64, 3),
            lambda x: torch.stack(
                [x[:, :4].reshape(2, -1) * 2.0, *[t.reshape(2, -1) for t in torch.split(x, 4, 1)]], 1
            ),
            2,
        ),
        "cat": (
            (2, 128, 6),
            lambda x: torch.cat([_ones(3, 4), *[t.reshape(6, -1) for t in torch.split(x, 2, 1)]], 0),
            2,
        ),
        "stack_of_views": (
            (64, 6),
            lambda x: torch.stack(
                [_ones(4, 4), *[t.view(4, 4) for t in torch.split(x.view(16, 24), 1, 1)]], 0
            ),
            2,
        ),
    },
}


@pytest.mark.parametrize(
    ("rule", "case"), [(rule, case) for rule, cases in FIRES.items() for case in sorted(cases)]
)
def test_a_run_inside_a_bigger_cat_or_stack_becomes_one_input(rule: str, case: str) -> None:
    shape, body, inputs = FIRES[rule][case]

    def f(self, x):  # type: ignore[no-untyped-def]
        return body(x)

    torch.manual_seed(0)
    gm = run(f, [torch.randn(shape)], [rule])
    assert fired(gm, rule) == 1, gm.optimus_report.declined
    assert ops(gm, "stack") == 0 and ops(gm, "split") == 0
    assert _cat_inputs(gm) == [inputs]


def test_a_returned_piece_keeps_the_split_and_the_result_stays_fresh() -> None:
    """Real aliasing: the run is of the model input and one piece is returned too; the rewritten
    cat is new storage, sharing memory with neither x nor the returned piece (run() checks it)."""

    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.split(x, 2, 1)
        return torch.stack([_ones(2, 2), *p, _ones(2, 2)], 0), p[3]

    gm = run(f, [torch.randn(2, 80)], ["stack_pieces"])
    assert fired(gm, "stack_pieces") == 1 and ops(gm, "split") == 1


def test_cat_on_another_dim_priced_for_inductor_takes_what_eager_declines() -> None:
    """On eager the run's flatten is a copy of its own: the default model declines the run;
    priced for Inductor (the flatten is written into the cat) the same graph is rewritten."""

    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.cat([_ones(2, 2, 3, 2), *torch.split(x, 2, dim=1), _ones(2, 2, 3, 2)], dim=2)

    x = torch.randn(2, 64, 3, 2)
    eager = run(f, [x], ["cat_pieces"], cost_model=optimus.AnalyticCostModel())
    assert fired(eager, "cat_pieces") == 0 and eager.optimus_report.declined.get("cat_pieces", 0) >= 1
    gm = run(f, [x], ["cat_pieces"], cost_model=optimus.AnalyticCostModel(inductor=True))
    assert fired(gm, "cat_pieces") == 1 and ops(gm, "split") == 0
    assert _cat_inputs(gm) == [3]


def _kept_reshapes(x: torch.Tensor) -> torch.Tensor:
    r = [t.reshape(-1, 3) for t in torch.split(x.view(6, 2), 1, 1)]
    return torch.stack([r[0] * 2.0, *r, r[1] * 3.0], 0)  # two reshapes stay for other readers


SHORT = {
    "stack_pieces": lambda x: torch.stack([_ones(2, 2), *torch.split(x, 2, 1), _ones(2, 2)], 0),
    "cat_pieces": lambda x: torch.cat([_ones(3, 2), *torch.split(x, 2, 1)], 0),
    "reshape_pieces": _kept_reshapes,
}


@pytest.mark.parametrize("rule", sorted(SHORT))
def test_a_short_run_is_declined_by_the_cost_model(rule: str) -> None:
    """A few pieces among other tensors: the views the run needs (the unsqueezes of the others for a
    stack, the flatten's copy for a cat on another dim) cost more than the cat inputs they save."""

    def f(self, x):  # type: ignore[no-untyped-def]
        return SHORT[rule](x)

    gm = run(f, [torch.randn(2, 6)], [rule], cost_model=optimus.AnalyticCostModel())
    assert fired(gm, rule) == 0 and gm.optimus_report.declined.get(rule, 0) >= 1


def _wrap(rule: str, pieces: Sequence[torch.Tensor]) -> torch.Tensor:
    """The long-run shape of each rule around ``pieces`` (pieces of a [2, 32] tensor along 1)."""
    if rule == "stack_pieces":
        return torch.stack([torch.ones_like(pieces[0]), *pieces], 0)
    if rule == "cat_pieces":
        return torch.cat([torch.ones_like(pieces[0]), *pieces], 0)
    return torch.stack([torch.ones(4, dtype=pieces[0].dtype), *[p.reshape(-1) for p in pieces]], 0)


@pytest.mark.parametrize("rule", sorted(SHORT))
@pytest.mark.parametrize("case", ["source_written", "piece_written", "permuted", "gap"])
def test_must_not_fire(rule: str, case: str) -> None:
    """Real aliasing (a source written after its pieces are taken, a piece written before the
    stack: integer inputs, as autograd forbids writing a split's views) and runs that are not in
    order: the cat/stack stays as it is."""

    def f(self, x):  # type: ignore[no-untyped-def]
        h = x * 1
        p = list(torch.split(h, 2, 1))
        if case == "source_written":
            h.add_(1)
        if case == "piece_written":
            p[3].mul_(2)
        if case == "permuted":  # no two pieces in order (in-order runs among swapped ones do fire)
            p = p[::-1]
        if case == "gap":
            p = p[::2]
        return _wrap(rule, p)

    gm = run(f, [torch.randint(-5, 5, (2, 32))], [rule])
    assert fired(gm, rule) == 0
