"""FlatPyTreeCodeGen: exported GraphModules with flat inputs/outputs skip pytree (un)flattening
and keep the calling convention; nested specs keep the pytree code."""

from __future__ import annotations

import torch
from torch import nn

import optimus
from optimus.capture.codegen_flat import use_flat_codegen


class TwoOut(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x * y


class DictIn(nn.Module):
    def forward(self, x: torch.Tensor, d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"a": x + d["k"]}


def export(mod: nn.Module, *args: object) -> torch.fx.GraphModule:
    gm, _ = torch._dynamo.export(mod, aten_graph=False, assume_static_by_default=True)(*args)
    return gm


def test_flat_specs_bind_and_return_directly() -> None:
    x, y = torch.randn(3), torch.randn(3)
    gm = export(TwoOut(), x, y)
    want = gm(x, y)
    assert use_flat_codegen(gm)
    assert "tree_flatten_spec" not in gm.code and "tree_unflatten" not in gm.code
    for got in (gm(x, y), gm(x=x, y=y)):
        assert isinstance(got, tuple) and len(got) == 2
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)


def test_nested_specs_keep_pytree_code() -> None:
    x, y = torch.randn(3), torch.randn(3)
    gm = export(DictIn(), x, {"k": y})
    use_flat_codegen(gm)
    assert "tree_flatten_spec" in gm.code and "tree_unflatten" in gm.code
    torch.testing.assert_close(gm(x, {"k": y})["a"], x + y)


def test_optimize_output_uses_flat_code_and_backprops() -> None:
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3)
    gm = optimus.optimize(TwoOut(), (x, y))
    assert "tree_unflatten" not in gm.code
    a, b = gm(x, y)
    (a.sum() + b.sum()).backward()
    torch.testing.assert_close(x.grad, 1 + y)
