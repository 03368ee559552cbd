"""The split/cat family on graphs as Dynamo produces them: Python loops and comprehensions over
split outputs, nested lists, mixed fused/unfused branches; through ``optimus.optimize`` (export
capture), through the ``optimus`` torch.compile backend with an eager inner compiler, and (one
smoke test) through Inductor."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND, assert_parity
from split_cat_helpers import FAMILY, fired, ops
from torch import nn

import optimus


class LoopRoundTrip(nn.Module):
    """Iterates over split outputs in Python; some pieces go through a op, the rest are re-glued."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2.0
        outs = []
        for p in torch.split(y, 4, dim=-1):
            outs.append(p)
        head = [t for t in y.chunk(2, 1)]
        return torch.cat(outs, -1) + 1.0, torch.cat(head, dim=1).tanh()


class NestedLists(nn.Module):
    """cat of cats of split pieces: flatten_cats then split_cat."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.split(x * 1.0, [2, 3, 3, 4], 1))
        left = torch.cat(parts[:2], 1)
        right = torch.cat(parts[2:], 1)
        return torch.cat([left, right], 1).relu()


class CatThenSplit(nn.Module):
    """Two heads concatenated then split again along the same dim (a fused-then-unfused round trip)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.cat([self.a(x), self.b(x)], dim=-1)
        u, v = h.split([4, 6], dim=1)
        return u.sigmoid(), v * 2.0


class RowsStack(nn.Module):
    """unbind in a loop, stack back; and stack then iterate."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = [r for r in (x + 1.0).unbind(1)]
        back = torch.stack(rows, dim=1)
        s = torch.stack([x * 2.0, y * 3.0], -1)
        a, b = s.unbind(-1)
        return back * 2.0, a + b


class MixedTowers(nn.Module):
    """Half the pieces go through a Linear (batch-fusible), half pass through unchanged; a piece
    also has another reader (the side output)."""

    def __init__(self, n: int = 6, w: int = 4) -> None:
        super().__init__()
        self.w = w
        self.lins = nn.ModuleList([nn.Linear(w, w) for _ in range(n // 2)])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = torch.split(x, self.w, dim=1)
        half = len(parts) // 2
        done = [lin(p) for p, lin in zip(parts[:half], self.lins, strict=True)]
        rest = torch.cat(list(parts[half:]), dim=1)  # untouched pieces: a contiguous run -> a view
        return torch.cat(done, dim=1), rest * 2.0, parts[-1].sum()


class SliceGlue(nn.Module):
    """Slices as Dynamo records them (getitem with a tuple of slices), glued back in order."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.relu()
        whole = torch.cat([y[:, :3], y[:, 3:5], y[:, 5:]], dim=-1)
        part = torch.cat((y[:, 1:3], y[:, 3:6]), 1)
        return whole * 2.0, part + 1.0  # (part returned raw: a narrow view has other strides)


CASES: list[tuple[Any, list[torch.Tensor], dict[str, int]]] = [
    (LoopRoundTrip(), [torch.randn(3, 8)], {"split_cat": 2}),
    (NestedLists(), [torch.randn(2, 12)], {"flatten_cats": 1, "split_cat": 1}),
    (CatThenSplit(), [torch.randn(5, 8)], {"cat_split": 1}),
    (RowsStack(), [torch.randn(2, 3), torch.randn(2, 3)], {"stack_unbind": 2}),
    (MixedTowers(), [torch.randn(2, 24)], {"split_cat": 1}),
    (SliceGlue(), [torch.randn(4, 8)], {"split_cat": 2}),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[type(c[0]).__name__ for c in CASES])
def test_family_fires_on_exported_graphs(case: int) -> None:
    torch.manual_seed(case)
    mod, inputs, expected = CASES[case]
    gm = optimus.optimize(mod, inputs, rules=[*FAMILY, "dce"], cost_model=LAUNCH_BOUND)
    for rule, count in expected.items():
        assert fired(gm, rule) == count, gm.optimus_report.rules_fired
    assert gm.optimus_report.rolled_back == {}
    assert_parity(mod, gm, inputs)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[type(c[0]).__name__ for c in CASES])
def test_all_rules_keep_parity_with_the_default_cost_model(case: int) -> None:
    mod, inputs, _ = CASES[case]
    gm = optimus.optimize(mod, inputs, verify=True)
    assert gm.optimus_report.rolled_back == {}
    assert_parity(mod, gm, inputs)


def test_backend_graphs_with_lifted_parameters() -> None:
    """torch.compile's Dynamo graphs take parameters as inputs; the rules see the same forms."""
    torch._dynamo.reset()
    mod, inputs = MixedTowers(), [torch.randn(2, 24)]
    cfg = optimus.OptimusConfig(rules=(*FAMILY, "dce"), cost_model=LAUNCH_BOUND)
    seen: list[Any] = []

    def inner(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        seen.append(gm)
        return gm.forward

    compiled = torch.compile(mod, backend=optimus.backend(cfg, inner=inner), dynamic=False)
    assert_parity(mod, lambda *a: compiled(*a), inputs)
    assert seen and sum(fired(g, "split_cat") for g in seen) == 1
    assert all(ops(g, "cat") == 1 for g in seen)
    torch._dynamo.reset()


@pytest.mark.compile
def test_inductor_smoke() -> None:
    torch._dynamo.reset()
    mod, inputs = NestedLists(), [torch.randn(2, 12)]
    compiled = torch.compile(mod, backend="optimus")
    torch.testing.assert_close(compiled(*inputs), mod(*inputs))
    torch._dynamo.reset()
