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


def test_a_watch_of_a_dropped_report_does_not_hide_the_next_one() -> None:
    """The watch of a report nobody holds any more used to remove itself from the logger while
    the logger iterated over its filters, which skipped the filter after it: in a process that
    had optimized and dropped another model first, the limit went unreported (found as a test
    that failed only after 114 other tests in one process)."""
    import gc
    import logging

    from optimus.capture import dynamo_watch
    from optimus.report import OptimusReport

    logger = logging.getLogger(dynamo_watch.DYNAMO_LOGGER)
    before = list(logger.filters)
    try:
        dropped, kept = OptimusReport(), OptimusReport()
        dynamo_watch.watch(dropped, Logs.forward)
        dynamo_watch.watch(kept, Logs.forward)
        del dropped
        gc.collect()
        info = dynamo_watch.code_info(Logs.forward.__code__)
        logger.warning("torch._dynamo hit config.%s (%s)\n   function: %s", "recompile_limit", 3, info)
        assert kept.recompile_limit_hit
        assert any("recompile limit (3)" in n for n in kept.notes), kept.notes
        dynamo_watch.watch(OptimusReport(), Logs.forward)  # a new watch drops the dead one
        assert not [
            f for f in logger.filters if isinstance(f, dynamo_watch.LimitWatch) and f.report() is None
        ][1:]
    finally:
        logger.filters[:] = before
