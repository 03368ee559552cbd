"""On the per-call Dynamo path the report says what ran after optimize() returned: how many graphs
Dynamo recompiled (and optimus optimized), and whether Dynamo's recompile limit was reached (then
new inputs run eagerly, unoptimized)."""

from __future__ import annotations

import torch
from torch import nn

import optimus


class Logs(nn.Module):
    """Python side effects in forward: export refuses it, so it takes the per-call Dynamo path."""

    def __init__(self) -> None:
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(1)
        return torch.cat([torch.relu(lin(x)) for lin in self.lins], 1)


def test_recompiles_are_counted_and_the_limit_is_reported() -> None:
    torch.manual_seed(0)
    torch._dynamo.reset()
    mod = Logs()
    with torch._dynamo.config.patch(recompile_limit=3):
        gm = optimus.optimize(mod, (torch.randn(2, 4),))
        report = gm.optimus_report
        assert report.capture == "dynamo-subgraphs"
        assert (report.recompiles, report.recompile_limit_hit) == (0, False)
        for batch in (3, 4):
            x = torch.randn(batch, 4)
            torch.testing.assert_close(gm(x), mod(x))
        assert (report.recompiles, report.recompile_limit_hit) == (2, False)
        for batch in (5, 6, 7):  # past the limit: Dynamo runs these eagerly
            x = torch.randn(batch, 4)
            torch.testing.assert_close(gm(x), mod(x))
    assert report.recompiles == 2  # nothing more was compiled ...
    assert report.recompile_limit_hit  # ... and the report says so
    assert any("recompile limit (3) was reached" in n for n in report.notes), report.notes
    torch._dynamo.reset()
