"""cat_pieces (cat of adjacent equal pieces along another dim -> one clone) and split_squeeze (a
size-1 split squeezed on its dim -> an unbind): fire with eager's values, gradients and a fresh
contiguous result; must not fire for permuted or gapped pieces, the same dim (split_cat's), a
squeeze on another dim, or a squeeze in another grad-mode region."""

from __future__ import annotations

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND, assert_parity
from split_cat_helpers import fired, ops

import optimus


@pytest.mark.parametrize(("d", "e"), [(1, 2), (1, 0), (2, 1), (0, 2)])
def test_cat_of_pieces_on_another_dim_is_one_clone(d: int, e: int) -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.cat(torch.split(x, 2, dim=d), dim=e)

    x = torch.randn(4, 6, 8)
    gm = run(f, [x], ["cat_pieces"])
    assert fired(gm, "cat_pieces") == 1 and ops(gm, "split") == 0 and ops(gm, "cat") == 0
    got, want = gm(x), f(None, x)
    torch.testing.assert_close(got, want)
    assert got.is_contiguous() and got.stride() == want.stride()
    assert got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_a_run_inside_a_split_that_stays_is_declined_by_the_cost_model() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b, c, rest = torch.split(x, [2, 2, 2, 4], dim=1)
        return torch.cat([a, b, c], dim=0), rest * 2  # the split stays for `rest`: nothing saved

    gm = run(f, [torch.randn(3, 10)], ["cat_pieces"])
    assert fired(gm, "cat_pieces") == 0 and gm.optimus_report.declined.get("cat_pieces") == 1


@pytest.mark.parametrize("case", ["permuted", "gap", "same-dim", "unequal"])
def test_cat_pieces_must_not_fire(case: str) -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.split(x, [2, 2, 2, 2] if case != "unequal" else [2, 2, 4], dim=1)
        if case == "permuted":
            return torch.cat([p[1], p[0], p[2]], dim=0)
        if case == "gap":
            return torch.cat([p[0], p[2]], dim=0)
        if case == "same-dim":
            return torch.cat([p[0], p[1]], dim=1)
        return torch.cat([p[0], p[1]], dim=0) * 1.0, p[2]

    gm = run(f, [torch.randn(3, 8)], ["cat_pieces"])
    assert fired(gm, "cat_pieces") == 0


def test_size1_split_squeezed_is_an_unbind() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b, c = torch.split(x * 2.0, 1, dim=1)
        return torch.stack([a.squeeze(1), torch.squeeze(b, 1), c.squeeze(-2)], 1)

    x = torch.randn(4, 3, 5)
    gm = run(f, [x], ["split_squeeze", "stack_unbind"])
    assert fired(gm, "split_squeeze") == 3 and fired(gm, "stack_unbind") == 1
    assert ops(gm, "squeeze") == 0


@pytest.mark.parametrize("case", ["other-dim", "no-dim", "size-2"])
def test_split_squeeze_must_not_fire(case: str) -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        h = x * 2.0
        if case == "size-2":
            a, b = torch.split(h, 2, dim=1)
            return a.squeeze(1), b.squeeze(1)
        a, b = torch.split(h, 1, dim=1)
        if case == "other-dim":
            return a.squeeze(0), b.squeeze(0)
        return a.squeeze(), b.squeeze()

    x = torch.randn(1, 2, 4) if case != "size-2" else torch.randn(3, 4, 1)
    gm = run(f, [x], ["split_squeeze"])
    assert fired(gm, "split_squeeze") == 0


def test_split_squeeze_must_not_fire_across_a_grad_mode_region() -> None:
    class M(torch.nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            a, b = torch.split(x * 2.0, 1, dim=1)
            with torch.no_grad():
                return a.squeeze(1), b.squeeze(1)

    x = torch.randn(3, 2, 4, requires_grad=True)
    gm = optimus.optimize(M(), (x,), rules=["split_squeeze"])
    assert fired(gm, "split_squeeze") == 0
    assert [t.requires_grad for t in gm(x)] == [t.requires_grad for t in M()(x)]


def run(f, inputs, rules):  # type: ignore[no-untyped-def]
    """Export-captured (Dynamo unrolls the split tuples), optimized with ``rules`` (launch-bound
    cost model), checked forward and backward against eager."""
    module = _module(f)
    gm = optimus.optimize(
        module, tuple(inputs), rules=["normalize_split_cat", *rules], cost_model=LAUNCH_BOUND
    )
    assert_parity(module, gm, inputs)
    return gm


def _module(f):  # type: ignore[no-untyped-def]
    class M(torch.nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            return f(self, x)

    return M()
