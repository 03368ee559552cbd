"""What optimus did reaches the cell record through the prepared module (``Prepared.reports``),
and a torch.compile backend object carries its own reports: no module global is read."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optimus
from harness.modes import builtin, mode_registry
from harness.run.runner import run_one
from harness.spec import CellKey, RunConfig


class ThreeTowers(nn.Module):
    """Three trainable towers: the fewest the re-layout takes (``MIN_TRAINABLE_MEMBERS``), so a
    rule fires and there is a report worth carrying."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x), self.c(x)], 1)


def test_eager_optimus_prepared_carries_its_report() -> None:
    torch.manual_seed(0)
    prepared = mode_registry.prepare("eager+optimus", ThreeTowers(), (torch.randn(4, 8),))
    assert len(prepared.reports) == 1
    merged = builtin.merge_reports(prepared.reports)
    assert merged["rules_fired"] == prepared.reports[0].rules_fired and merged["rules_fired"]
    assert merged["optimus_graphs"] == 1 and merged["stop_reason"] == "saturated"


def test_backend_object_carries_the_reports_of_its_own_compile() -> None:
    torch.manual_seed(0)
    model, x = ThreeTowers(), torch.randn(4, 8)
    mine = optimus.backend(inner=lambda gm, example: gm.forward)  # Dynamo only, no Inductor
    other = optimus.backend(inner=lambda gm, example: gm.forward)
    assert mine.reports == []  # nothing until torch.compile compiles, at the first call
    torch.compile(model, backend=mine, fullgraph=True, dynamic=False)(x)
    assert len(mine.reports) == 1
    assert mine.reports[0].capture == "backend" and mine.reports[0].nodes_before > 0
    assert other.reports == []


@pytest.mark.compile
def test_compile_optimus_cell_records_nodes_and_rules(tmp_path: object) -> None:
    """A real compile+optimus cell at tiny size, in its own process as the harness runs it."""
    cfg = RunConfig(["towers"], "tiny", ["compile+optimus"], ["infer"], warmup=1, min_iters=2, max_iters=3,
                    budget_s=0.05).validate()  # fmt: skip
    cell = run_one(CellKey("towers", "tiny", "compile+optimus", "infer"), cfg.as_dict(), cfg.timeout_s)
    assert cell["status"] == "ok", cell.get("error")
    assert cell["nodes_before"] > 0 and cell["nodes_after"] > 0
    assert cell["rules_fired"] and all(n > 0 for n in cell["rules_fired"].values())
    assert cell["optimus_graphs"] == 1  # set only by merge_reports(prepared.reports)
    assert cell["stop_reason"] == "saturated"


def test_compile_optimus_records_chunked_groups_in_inference() -> None:
    """compile+optimus prepares with an Inductor-priced model: an eval-mode module's fused chains
    are run in chunks (optimus.memory.chunked), and the cell says how many groups were."""

    class Tower(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.n1, self.l2, self.n2 = (
                nn.Linear(4, 16),
                nn.LayerNorm(16),
                nn.Linear(16, 16),
                nn.LayerNorm(16),
            )
            self.gate = nn.Linear(4, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = F.silu(self.n2(self.l2(F.silu(self.n1(self.l1(x))))))
            return h * torch.sigmoid(self.gate(x))

    class Towers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.towers = nn.ModuleList(Tower() for _ in range(24))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([t(p) for t, p in zip(self.towers, torch.split(x, 4, dim=1), strict=True)], 1)

    torch.manual_seed(0)
    module = Towers().eval()
    x = torch.randn(256, 96)  # a member's tower and gate, [256, 32] floats: 32 KiB; 256 KiB chunks
    with torch.no_grad():
        expected = module(x)
    # beside tables of 64 MiB, as a cell's dense arch is: chunked, the fused chain's stacked
    # intermediates (about 0.5 MB) fit the memory ceiling; alone, the 48 KiB toy could not
    # afford them and the ceiling gates the fusion (tests/optimus/memory/test_memory_ceiling.py)
    with builtin.outside_bytes(64 << 20):
        gm, _seconds, fields = builtin._optimize_relayout(module, (x,), inductor=True)
    assert fields["chunked_groups"] == 1
    assert builtin.merge_reports([gm.optimus_report])["chunked_groups"] == 1
    with torch.no_grad():
        torch.testing.assert_close(gm(x), expected)
