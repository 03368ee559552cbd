"""Activation checkpointing around random ops (optimus.capture.checkpoint_rng): the optimized module's
backward recomputes a checkpointed block with the forward's random numbers, as eager does, so
its gradients are eager's; the block is still checkpointed (recomputed, not stored)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from caller_world_models import CONFIGS
from torch import nn
from torch.utils.checkpoint import checkpoint

import optimus
from optimus.capture.checkpoint_rng import checkpointed


class CheckpointedTowers(nn.Module):
    """Six Linear -> ReLU -> Dropout -> Linear towers over a split input, every other one run
    under ``torch.utils.checkpoint``; the others are batched by Optimus."""

    def __init__(self, reentrant: bool, p: float = 0.3) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.towers = nn.ModuleList(
            [nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 16)) for _ in range(6)]
        )
        self.head = nn.Linear(96, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, 16, 1)
        outs = [
            checkpoint(t, p, use_reentrant=self.reentrant) if i % 2 == 0 else t(p)
            for i, (t, p) in enumerate(zip(self.towers, parts, strict=True))
        ]
        return self.head(torch.cat(outs, 1))


def _step(fn: object, model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    out = fn(x)  # type: ignore[operator]
    out.square().sum().backward()
    return out.detach(), [None if p.grad is None else p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_checkpointed_dropout_gets_eagers_gradients(config: str, reentrant: bool) -> None:
    torch.manual_seed(0)
    model = CheckpointedTowers(reentrant)
    ref = copy.deepcopy(model)
    x = torch.randn(8, 96, requires_grad=True)
    gm = optimus.optimize(model, (x,), config=CONFIGS[config])
    assert gm.optimus_report.capture == "export"
    assert gm.optimus_report.rules_fired.get("batch_unary", 0) >= 1  # the unchecked towers
    want, want_grads = _step(ref, ref, x)
    got, got_grads = _step(gm, model, x)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert a is not None and b is not None
        torch.testing.assert_close(a, b)


def test_the_block_stays_checkpointed() -> None:
    """Recomputed in the backward, not stored: each checkpointed tower is one call of the block."""
    torch.manual_seed(0)
    model = CheckpointedTowers(False)
    gm = optimus.optimize(model, (torch.randn(8, 96),))
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is checkpointed]
    assert len(calls) == 3


@pytest.mark.slow
@pytest.mark.compile
def test_compiling_the_optimized_module_keeps_the_gradients() -> None:
    """torch.compile of the result turns the call back into Dynamo's checkpoint op for Inductor."""
    torch.manual_seed(0)
    model = CheckpointedTowers(False, p=0.0)  # Inductor draws its own dropout masks: compare without
    ref = copy.deepcopy(model)
    x = torch.randn(8, 96, requires_grad=True)
    torch._dynamo.reset()  # each optimized module is a type of its own: a fresh recompile budget
    compiled = torch.compile(optimus.optimize(model, (x,)), fullgraph=True)
    want, want_grads = _step(ref, ref, x)
    got, got_grads = _step(compiled, model, x)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b)


class ReentrantOnRawInput(nn.Module):
    """HF-style reentrant checkpointing of a block whose explicit input (``z``) does not require
    grad, beside one whose input (``x``) does: eager's first output does not require grad and its
    block's parameters get no gradient (PyTorch warns "None of the inputs have requires_grad")."""

    def __init__(self) -> None:
        super().__init__()
        self.raw = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8))
        self.fed = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return checkpoint(self.raw, z, use_reentrant=True), checkpoint(self.fed, x, use_reentrant=True)


def _reentrant_step(
    fn: object, model: nn.Module, x: torch.Tensor, z: torch.Tensor
) -> tuple[list[bool], list[Any]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
        outs = fn(x, z)  # type: ignore[operator]
    sum(o.square().sum() for o in outs if o.requires_grad).backward()
    return [o.requires_grad for o in outs], [
        None if p.grad is None else p.grad.clone() for p in model.parameters()
    ]


def _backend_eager(model: nn.Module, x: torch.Tensor, z: torch.Tensor) -> Any:
    torch._dynamo.reset()
    return torch.compile(model, backend=optimus.backend(inner="eager"), dynamic=False)


def _optimize(model: nn.Module, x: torch.Tensor, z: torch.Tensor) -> Any:
    return optimus.optimize(model, (x, z), config=CONFIGS["relayout"])


@pytest.mark.parametrize("make", [_optimize, _backend_eager], ids=["optimize", "backend-eager"])
def test_reentrant_block_on_an_input_without_grad_gets_no_gradient(make: Any) -> None:
    torch.manual_seed(0)
    model = ReentrantOnRawInput()
    ref = copy.deepcopy(model)
    x, z = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    want_flags, want_grads = _reentrant_step(ref, ref, x, z)
    assert want_flags == [False, True]
    got_flags, got_grads = _reentrant_step(make(model, x, z), model, x, z)
    assert got_flags == want_flags
    for a, b in zip(got_grads, want_grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)


def test_backend_eager_runs_checkpointed_dropout_as_eager() -> None:
    """``optimus.backend(inner="eager")``: the gradients of checkpointed dropout blocks are eager's
    (Dynamo's own eager backend recomputes them with new random numbers)."""
    torch.manual_seed(0)
    model = CheckpointedTowers(False)
    ref = copy.deepcopy(model)
    x = torch.randn(8, 96, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=optimus.backend(inner="eager"), dynamic=False)
    want, want_grads = _step(ref, ref, x)
    got, got_grads = _step(compiled, model, x)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_backend_rejects_an_unknown_inner_name() -> None:
    with pytest.raises(ValueError, match=r'inner must be a compiler callable, None \(Inductor\) or "eager"'):
        optimus.backend(inner="inductor")
