"""The re-layout under DistributedDataParallel: two gloo ranks on CPU (spawned processes), each
with half of every batch, against one process with the whole batch.

``optimize()`` under a process group lays fused parameters out with their members as the autograd
leaves (``RelayoutParams(gradients="auto")``, optimus/params/attach.py), so DDP all-reduces every
member's gradient: both ranks hold the same gradients, equal to the full batch's, and the same
parameters after 5 steps of SGD with momentum or Adam. With the gradient hooks instead (the
single-process default, and what every process group got before), the members' gradients stay
rank-local and DDP raises at the second step.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from two_ranks import gloo_rank, spawn_two

import optimus
from optimus.params.relayout import PREFIX, RelayoutParams

STEPS = 5
BATCH = 32


class LinearNormTowers(nn.Module):
    """Eight towers of Linear -> LayerNorm -> ReLU over the slices of one [B, 8, 32] input: two
    group kinds, the linears' weights and biases and the norms' affines."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.ReLU()) for _ in range(8)
        )
        self.head = nn.Linear(8 * 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([t(p) for t, p in zip(self.towers, x.unbind(1), strict=True)], 1))


def _linear_norm() -> tuple[nn.Module, tuple[torch.Tensor, ...], torch.Tensor, Callable[..., Any]]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, 8, 32, generator=g), torch.rand(BATCH, 1, generator=g)
    return LinearNormTowers(), (x,), y, nn.functional.mse_loss


def _towers_tiny() -> tuple[nn.Module, tuple[torch.Tensor, ...], torch.Tensor, Callable[..., Any]]:
    import models

    built = models.build("towers", scale="tiny", device="cpu", seed=0)
    batch = built.batches[0]
    with torch.no_grad():
        inputs = tuple(t.detach() for t in built.dense_inputs(batch))
    return built.module.dense, inputs, batch.labels, built.loss


MODELS = {"linear_norm": _linear_norm, "towers_tiny": _towers_tiny}
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
}


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None, "a parameter got no gradient"
    return p.grad


def _rows(t: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    n = t.shape[0] // ranks
    return t[rank * n : (rank + 1) * n]


def _train(model: nn.Module, run: nn.Module, inputs: Any, labels: torch.Tensor, loss_fn: Any,
           opt: torch.optim.Optimizer) -> list[dict[str, list[float]]]:  # fmt: skip
    """STEPS steps; each step's gradients by parameter name (None recorded as missing)."""
    grads = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss_fn(run(*inputs), labels).backward()
        grads.append(
            {n: p.grad.flatten().tolist() for n, p in model.named_parameters() if p.grad is not None}
        )
        opt.step()
    return grads


def _rank(rank: int, port: int, name: str, optimizer: str, gradients: str, out: str) -> None:
    with gloo_rank(rank, port, out) as record:
        torch.set_num_threads(1)
        model, inputs, labels, loss_fn = MODELS[name]()
        mine = tuple(_rows(t, rank, 2) for t in inputs)
        layout = RelayoutParams() if gradients == "auto" else RelayoutParams(gradients=gradients)
        cfg = optimus.OptimusConfig(layout=layout)
        gm = optimus.optimize(model, mine, config=cfg)
        record["stacked"] = sorted(n for n, _ in gm.named_parameters() if n.startswith(PREFIX))
        record["attached"] = sum(
            getattr(n.target, "__name__", "") == "attach_members" for n in gm.graph.nodes
        )
        # the captured module's keys (Dynamo's names), one per parameter, none of the storage
        keys = list(gm.state_dict())
        record["state_dict_keys"] = len(keys) == len(model.state_dict()) and not any(
            PREFIX in k for k in keys
        )
        ddp = nn.parallel.DistributedDataParallel(gm)
        opt = OPTIMIZERS[optimizer](model.parameters())
        record["grads"] = _train(model, ddp, mine, _rows(labels, rank, 2), loss_fn, opt)
        record["params"] = {n: p.detach().flatten().tolist() for n, p in model.named_parameters()}


def _single_process(
    name: str, optimizer: str
) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """The unfused model on the whole batch, eager: each step's gradients and the end parameters.
    DDP averages the ranks' gradients; the losses are means over rows, so the mean of the two
    half-batch gradients is the whole batch's."""
    torch.set_num_threads(1)
    model, inputs, labels, loss_fn = MODELS[name]()
    opt = OPTIMIZERS[optimizer](model.parameters())
    grads = [
        {n: torch.tensor(v) for n, v in g.items()} for g in _train(model, model, inputs, labels, loss_fn, opt)
    ]
    return grads, {n: p.detach().flatten() for n, p in model.named_parameters()}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_ddp_reduces_every_member_of_the_relayout(tmp_path: Path, name: str, optimizer: str) -> None:
    r0, r1 = spawn_two(_rank, tmp_path, name, optimizer, "auto")
    assert "error" not in r0 and "error" not in r1, r0.get("trace") or r1.get("trace")
    assert r0["stacked"] and r0["stacked"] == r1["stacked"]  # the re-layout really ran
    assert r0["attached"] == r1["attached"] == len(r0["stacked"])
    assert r0["state_dict_keys"] and r1["state_dict_keys"]
    want_grads, want_params = _single_process(name, optimizer)
    for step, (g0, g1, want) in enumerate(zip(r0["grads"], r1["grads"], want_grads, strict=True)):
        assert g0 == g1, f"step {step}: the ranks' gradients differ"
        assert set(g0) == set(want), f"step {step}: gradients of {sorted(set(want) ^ set(g0))}"
        for n, w in want.items():
            torch.testing.assert_close(torch.tensor(g0[n]), w, atol=1e-5, rtol=1e-4, msg=f"step {step} {n}")
    assert r0["params"] == r1["params"], "the ranks' parameters differ after the steps"
    for n, w in want_params.items():
        torch.testing.assert_close(torch.tensor(r0["params"][n]), w, atol=1e-5, rtol=1e-4, msg=n)


def test_gradient_hooks_under_ddp_leave_the_members_unreduced(tmp_path: Path) -> None:
    """Why a process group gets the attached members: with the hooks DDP never sees a member's
    gradient arrive, and the next step fails."""
    r0, r1 = spawn_two(_rank, tmp_path, "linear_norm", "sgd_momentum", "hooks")
    for r in (r0, r1):
        assert r["stacked"] and r["attached"] == 0
        assert "error" in r and "finished reduction in the prior iteration" in r["error"]


def _rank_contract(rank: int, port: int, out: str) -> None:
    """no_sync() accumulation, static-graph DDP, state_dict and a checkpoint round trip."""
    with gloo_rank(rank, port, out) as record:
        torch.set_num_threads(1)
        model, (x,), y, loss_fn = _linear_norm()
        xs, ys = _rows(x, rank, 2), _rows(y, rank, 2)
        gm = optimus.optimize(model, (xs,), config=optimus.OptimusConfig(layout=RelayoutParams()))
        ddp = nn.parallel.DistributedDataParallel(gm, static_graph=True)
        # static graph records its schedule in a first, synchronized iteration (PyTorch's own
        # reducer asserts when that iteration starts under no_sync, with an unfused model too)
        loss_fn(ddp(xs), ys).backward()
        ddp.zero_grad(set_to_none=True)
        with ddp.no_sync():  # first half of this rank's rows: local accumulation only
            (loss_fn(ddp(xs[:8]), ys[:8]) / 2).backward()
        (loss_fn(ddp(xs[8:]), ys[8:]) / 2).backward()
        record["grads"] = {n: _grad(p).flatten().tolist() for n, p in model.named_parameters()}
        state = {k: v.clone() for k, v in ddp.module.state_dict().items()}
        record["keys"] = sorted(state)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        ddp.module.load_state_dict(state)
        record["restored"] = all(torch.equal(ddp.module.state_dict()[k], v) for k, v in state.items())
        record["out_after_load"] = ddp(xs).flatten().tolist()
        record["eager_after_load"] = model(xs).flatten().tolist()


def test_no_sync_static_graph_and_checkpoints_keep_working(tmp_path: Path) -> None:
    r0, r1 = spawn_two(_rank_contract, tmp_path)
    assert "error" not in r0 and "error" not in r1, r0.get("trace") or r1.get("trace")
    assert r0["grads"] == r1["grads"]
    model, inputs, labels, loss_fn = _linear_norm()
    loss_fn(model(*inputs), labels).backward()  # whole batch: the mean of the four quarter means
    for n, p in model.named_parameters():
        torch.testing.assert_close(
            torch.tensor(r0["grads"][n]), _grad(p).flatten(), atol=1e-5, rtol=1e-4, msg=n
        )
    assert len(r0["keys"]) == len(model.state_dict()) and not any(PREFIX in k for k in r0["keys"])
    assert r0["restored"] and r1["restored"]
    torch.testing.assert_close(torch.tensor(r0["out_after_load"]), torch.tensor(r0["eager_after_load"]))


class WithUnusedHead(LinearNormTowers):
    """The towers plus a head forward never calls: the case ``find_unused_parameters`` is for."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Linear(4, 4)


def _rank_find_unused(rank: int, port: int, out: str) -> None:
    with gloo_rank(rank, port, out) as record:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = WithUnusedHead()
        _, (x,), y, loss_fn = _linear_norm()
        xs, ys = _rows(x, rank, 2), _rows(y, rank, 2)
        gm = optimus.optimize(model, (xs,), config=optimus.OptimusConfig(layout=RelayoutParams()))
        record["stacked"] = sum(1 for n, _ in gm.named_parameters() if n.startswith(PREFIX))
        ddp = nn.parallel.DistributedDataParallel(gm, find_unused_parameters=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        record["grads"] = _train(model, ddp, (xs,), ys, loss_fn, opt)
        record["params"] = {n: p.detach().flatten().tolist() for n, p in model.named_parameters()}


def test_find_unused_parameters_reduces_the_members_and_skips_what_forward_never_reads(
    tmp_path: Path,
) -> None:
    """DDP with ``find_unused_parameters=True`` walks the autograd graph from the loss: it reaches
    each member through the attached storage's backward (so every member is reduced, as in a
    run without the flag) and marks the head forward never calls as unused, which stays without
    a gradient, as unfused."""
    r0, r1 = spawn_two(_rank_find_unused, tmp_path)
    assert "error" not in r0 and "error" not in r1, r0.get("trace") or r1.get("trace")
    assert r0["stacked"] > 0  # the re-layout ran
    torch.manual_seed(0)
    model = WithUnusedHead()
    _, inputs, labels, loss_fn = _linear_norm()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    want = _train(model, model, inputs, labels, loss_fn, opt)
    for step, (g0, g1, w) in enumerate(zip(r0["grads"], r1["grads"], want, strict=True)):
        assert g0 == g1, f"step {step}: the ranks' gradients differ"
        assert set(g0) == set(w) and not any(n.startswith("unused.") for n in g0), sorted(set(g0) ^ set(w))
        for n, v in w.items():
            torch.testing.assert_close(
                torch.tensor(g0[n]), torch.tensor(v), atol=1e-5, rtol=1e-4, msg=f"{step} {n}"
            )
    assert r0["params"] == r1["params"]
    for n, p in model.named_parameters():
        torch.testing.assert_close(
            torch.tensor(r0["params"][n]), p.detach().flatten(), atol=1e-5, rtol=1e-4, msg=n
        )
