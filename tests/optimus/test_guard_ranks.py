"""The measured guard under a process group: two gloo ranks on CPU (spawned processes) whose own
clocks disagree keep the same graph, the first rank's verdict, and train together under
DistributedDataParallel afterwards; a re-optimization at one rank's call does not guard (its peers
would not join the collective).

WHY: a rank that kept the re-layout while its peer returned the plain capture would hand DDP
different parameters to reduce (or hang it); the guard takes the first rank's figures.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import fx, nn
from two_ranks import gloo_rank, spawn_two

import optimus
from optimus.params.relayout import PREFIX, RelayoutParams


class LinearTowers(nn.Module):
    """Eight Linear -> tanh towers over the slices of one [B, 8, 16] input, and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = nn.ModuleList(nn.Linear(16, 16) for _ in range(8))
        self.head = nn.Linear(8 * 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(
            torch.cat([torch.tanh(t(p)) for t, p in zip(self.towers, x.unbind(1), strict=True)], 1)
        )


def _rank(rank: int, port: int, out: str) -> None:
    with gloo_rank(rank, port, out) as record:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = LinearTowers()
        x = torch.randn(16, 8, 16)

        def own_clock(gm: fx.GraphModule, step: Callable[[], object], calls: int) -> float:
            """Rank 0 finds the rewrite faster, rank 1 slower."""
            step()
            rewritten = any(n.target is torch.baddbmm for n in gm.graph.nodes)
            return calls * (1.0 if not rewritten else 0.5 if rank == 0 else 2.0)

        cfg = optimus.OptimusConfig(layout=RelayoutParams(), guard="rules", guard_measure=own_clock)
        gm = optimus.optimize(model, (x,), config=cfg)
        report = gm.optimus_report
        record["guard"] = report.guard
        record["speedups"] = [t.speedup for t in report.guard_trials]
        record["stacked"] = sorted(n for n, _ in gm.named_parameters() if n.startswith(PREFIX))
        ddp = nn.parallel.DistributedDataParallel(gm)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            ddp(x).square().mean().backward()
            opt.step()
        record["params"] = [p.detach().flatten().tolist() for p in model.parameters()]
        if rank == 0:  # another batch size on one rank only: re-optimized there, without a collective
            gm(x[:4])
            (again,) = gm.optimus_specializations.values()
            record["again"] = again.optimus_report.guard
        dist.barrier()


def test_ranks_keep_the_first_ranks_verdict(tmp_path: Path) -> None:
    r0, r1 = spawn_two(_rank, tmp_path)
    assert "error" not in r0, r0.get("trace")
    assert "error" not in r1, r1.get("trace")
    assert r0["guard"] == r1["guard"] == "kept"  # rank 1's own clock said slower
    assert r0["speedups"] == r1["speedups"] == [2.0]
    assert r0["stacked"] == r1["stacked"] and r0["stacked"]  # the same re-layout on both
    assert r0["params"] == r1["params"]  # DDP kept them in step
    assert r0["again"] == "not run: re-optimized at one rank's call under a process group"
