"""A parameter whose gradient is a tensor in eager is a tensor after optimize: a rewrite that
would cut a value requiring grad off from the output is declined, so a zero gradient never
becomes None (optimizers skip None: AdamW's weight decay and any momentum would stop moving the
parameter). A rewrite that cuts only values no gradient reaches still fires."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND, assert_parity, optimize_traced
from torch import nn

import optimus

D = 4


class SliceOfLookups(nn.Module):
    """DeepCTR's ``cat(lookups)[:, :D]``: only the first table reaches the output."""

    def __init__(self, tables: int = 4) -> None:
        super().__init__()
        self.tables = nn.ModuleList([nn.Embedding(10, D) for _ in range(tables)])
        self.head = nn.Linear(D, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        emb = torch.cat([t(ids[:, i]) for i, t in enumerate(self.tables)], 1)
        return self.head(emb[:, :D])


class SplitOfTowers(nn.Module):
    """``split(cat(towers))[0]``: the other towers' linears get zero gradients in eager."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = nn.ModuleList([nn.Linear(3, D) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(torch.cat([t(x) for t in self.towers], 1), [D, D, D], 1)
        return parts[0].tanh()


class SliceOfBufferAndParam(nn.Module):
    """The slice drops only a buffer: no gradient is lost, the rewrite fires."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, D)
        self.register_buffer("pad", torch.randn(5, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.lin(x), self.pad], 1)[:, :D].tanh()


class SliceAndTheRestElsewhere(nn.Module):
    """The dropped input still reaches the output another way: it keeps its gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, D), nn.Linear(3, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.b(x)
        return torch.cat([self.a(x), b], 1)[:, :D].tanh() + b.sum()


class SliceUnderNoGrad(nn.Module):
    """The slice runs under ``no_grad``: eager gives the dropped side no gradient either."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, D), nn.Linear(3, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            first = torch.cat([self.a(x), self.b(x)], 1)[:, :D]
        return first * x.sum()


def _ids() -> torch.Tensor:
    return torch.randint(0, 10, (5, 4), generator=torch.Generator().manual_seed(0))


def _optimize(mod: nn.Module, x: torch.Tensor, **kw: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optimus.optimize(mod, (x,), cost_model=LAUNCH_BOUND, **kw)


def _train(module: Any, params: list[nn.Parameter], make: Any, opt: str, steps: int = 3) -> None:
    optim: torch.optim.Optimizer = (
        torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
        if opt == "adamw"
        else torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=0.01)
    )
    for step in range(steps):
        module(*make(step)).square().sum().backward()
        optim.step()
        optim.zero_grad(set_to_none=True)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_the_dropped_tables_keep_their_zero_gradients_through_training(opt: str) -> None:
    torch.manual_seed(0)
    mod = SliceOfLookups()
    ref = copy.deepcopy(mod)
    gm = _optimize(mod, _ids())

    def make(step: int) -> tuple[torch.Tensor]:
        return (torch.randint(0, 10, (5, 4), generator=torch.Generator().manual_seed(step)),)

    ref(*make(0)).sum().backward()
    gm(*make(0)).sum().backward()
    for (name, p), q in zip(ref.named_parameters(), mod.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
    ref.zero_grad(set_to_none=True)
    mod.zero_grad(set_to_none=True)
    _train(ref, list(ref.parameters()), make, opt)
    _train(gm, list(mod.parameters()), make, opt)
    for (name, p), q in zip(ref.named_parameters(), mod.parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=name)
    assert any("cut" in r and "gradient" in r for r in gm.optimus_report.declined_reasons), (
        gm.optimus_report.declined_reasons
    )


@pytest.mark.parametrize(
    ("cls", "make"),
    [(SliceOfLookups, _ids), (SplitOfTowers, lambda: torch.randn(5, 3))],
)
def test_no_parameter_loses_its_gradient(cls: type[nn.Module], make: Any) -> None:
    torch.manual_seed(1)
    mod = cls()
    x = make()
    for gm in (_optimize(mod, x), optimize_traced(mod, [x])):
        assert_parity(mod, gm, [x])  # a zero gradient is not None


@pytest.mark.parametrize("cls", [SliceOfBufferAndParam, SliceAndTheRestElsewhere, SliceUnderNoGrad])
def test_the_rewrite_fires_where_no_gradient_is_lost(cls: type[nn.Module]) -> None:
    torch.manual_seed(2)
    mod = cls()
    x = torch.randn(5, 3)
    gm = _optimize(mod, x, rules=["cat_split"])
    assert gm.optimus_report.rules_fired.get("cat_split") == 1, gm.optimus_report.declined_reasons
    assert_parity(mod, gm, [x])
