"""Test hooks: faults injected into a sharded cell through ``OPTIMUS_BENCH_FAULT``.

Why hooks in the product code: the fault handling (a rank killed, hung or out of memory, a
planner that cannot place the tables) is only trusted if tests can make it happen for real.

    OPTIMUS_BENCH_FAULT=kill:rank1:step3   rank 1 SIGKILLs itself at the start of step 3
    OPTIMUS_BENCH_FAULT=hang:rank1:step3   rank 1 sleeps forever at the start of step 3
    OPTIMUS_BENCH_FAULT=oom:rank1:step2    rank 1 asks the allocator for 2**60 bytes at step 2
    OPTIMUS_BENCH_FAULT=skew:rank1         rank 1's dense weights are nudged after sharding (a rank
                                           that diverged: its parity must fail)
    OPTIMUS_BENCH_FAULT=drift:rank1:step1  rank 1's dense weights drift by DRIFT (1.6e-3) at the start
                                           of step 1, after one optimizer step (a drift the ranks'
                                           parity and a quality cell's loss curve must both catch)
    OPTIMUS_BENCH_FAULT=planner_fail       the planner gets 1 KiB per rank (harness.run.sharded.plan)

Steps count every step of the rank from 0: the first (compile) call is step 0, then the
parity steps, the warm-up and the timed steps. Without ``:stepN`` the fault fires at step 1.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Any

from harness.run.sharded.plan import FAULT_ENV

KINDS = ("kill", "hang", "oom", "skew", "drift")
DRIFT = 1.6e-3  # the drift of the ``drift`` fault: what one training step left on dcn tiny once


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int


def parse(text: str | None = None) -> Fault | None:
    """The rank fault of ``OPTIMUS_BENCH_FAULT`` (None when unset or ``planner_fail``)."""
    raw = (os.environ.get(FAULT_ENV, "") if text is None else text).strip()
    if not raw or raw == "planner_fail":
        return None
    m = re.fullmatch(r"(kill|hang|oom|skew|drift):rank(\d+)(?::step(\d+))?", raw)
    if m is None:
        raise ValueError(
            f"{FAULT_ENV}: {raw!r} is not kill|hang|oom|skew|drift:rankR[:stepN] or planner_fail (harness/run/sharded/faults.py)"
        )
    return Fault(m.group(1), int(m.group(2)), int(m.group(3) or 1))


def fire(fault: Fault | None, rank: int, step: int) -> None:
    """Make ``fault`` happen here when it is this rank's and this step's."""
    if fault is None or fault.rank != rank or fault.step != step:
        return
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "hang":
        while True:
            time.sleep(1.0)
    elif fault.kind == "oom":
        import torch

        torch.empty(2**60, dtype=torch.uint8)  # raises: the allocator cannot get an exabyte


def skew(fault: Fault | None, rank: int, module: Any) -> bool:
    """The ``skew`` fault: add 1e-2 to every dense parameter of this rank (after DDP's
    broadcast, so the peers keep theirs). True when it fired."""
    if fault is None or fault.kind != "skew" or fault.rank != rank:
        return False
    import torch

    with torch.no_grad():
        for p in module.dense.parameters():
            p.add_(1e-2)
    return True


def drift(fault: Fault | None, rank: int, step: int, module: Any) -> bool:
    """The ``drift`` fault: add ``DRIFT`` to every dense parameter of this rank at the start of
    ``step`` (after the optimizer steps before it, so the first step's outputs still match and
    only what training does afterwards can show it). True when it fired."""
    if fault is None or fault.kind != "drift" or fault.rank != rank or fault.step != step:
        return False
    import torch

    with torch.no_grad():
        for p in module.dense.parameters():
            p.add_(DRIFT)
    return True
