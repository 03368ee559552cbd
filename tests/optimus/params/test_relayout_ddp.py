"""The re-layout under DistributedDataParallel: why it is documented as unsupported, and that
the default layout is right there.

Two gloo ranks on CPU (spawned processes), each with half of a batch. DDP all-reduces what its
hooks on each parameter's gradient accumulator see: with ``RuntimeStack`` those are the user's
parameters, so every rank ends with the full-batch gradient; with ``RelayoutParams`` the members
are not in the autograd graph, their gradients stay rank-local (the failure seen on dcn in the
sharded harness), and optimus warns once.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import optimus
from optimus.engine.param_layout import RuntimeStack
from optimus.params.relayout import RelayoutParams


class Towers(nn.Module):
    """Eight per-feature towers over the slices of one [B, 8, 32] input (big enough that the
    default cost model fuses them with either layout)."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = nn.ModuleList(nn.Linear(32, 32) for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([t(p) for t, p in zip(self.towers, x.unbind(1), strict=True)], 1)


def _batch() -> torch.Tensor:
    return torch.randn(64, 8, 32, generator=torch.Generator().manual_seed(1))


def _rank(rank: int, port: int, layout: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Towers()
    mine = (_batch()[rank * 32 : (rank + 1) * 32],)
    chosen = RelayoutParams() if layout == "relayout" else RuntimeStack()
    cfg = optimus.OptimusConfig(rules=["batch_linear"], layout=chosen)
    gm = optimus.optimize(model, mine, config=cfg)
    fired = gm.optimus_report.rules_fired.get("batch_linear", 0)
    ddp = nn.parallel.DistributedDataParallel(gm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ddp(*mine).sum().backward()
    grads = {n: p.grad.tolist() for n, p in model.named_parameters() if p.grad is not None}
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"fired": fired, "grads": grads, "warnings": [str(w.message) for w in caught]})
    )
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(tmp_path: Path, layout: str) -> tuple[dict, dict]:
    mp.spawn(_rank, args=(_free_port(), layout, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    return r0, r1


def _full_batch_grads() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = Towers()
    # DDP averages over ranks: each rank's loss is a half-batch sum, so the mean of the two
    # half-batch gradients is half the full-batch gradient
    (model(_batch()).sum() / 2).backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("layout", ["runtime", "relayout"])
def test_ddp_reduces_the_default_layout_and_not_the_relayout(tmp_path: Path, layout: str) -> None:
    r0, r1 = _run(tmp_path, layout)
    assert r0["fired"] == r1["fired"] == 1  # the eight linears were fused on both ranks
    want = _full_batch_grads()
    reduced = all(
        torch.allclose(torch.tensor(r["grads"][n]), want[n], atol=1e-6) for r in (r0, r1) for n in want
    )
    warned = [w for w in r0["warnings"] if "does not all-reduce re-laid-out" in w]
    if layout == "runtime":
        assert reduced and warned == []
    else:
        assert not reduced  # rank-local gradients: why DDP training must not use the re-layout
        assert r0["grads"] != r1["grads"]
        assert len(warned) == 1
