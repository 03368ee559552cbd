"""Side by side, in one process: what the split/cat rule family adds on top of the other rules.

1. The 32-tower acceptance model (tests/optimus/optimus_models.py, width 16, batch 256): rules
   fired, node counts, and eager forward latency (median of 300 calls, 3 repeats, one thread) of
   the module, of optimize() without the split/cat family, and of optimize() with all rules.
2. The optimizer's own time on the synthetic 1k/10k/20k-node graphs of
   tests/benchmarks/test_optimizer_speed.py (median of 3), with and without the family.

    PYTHONPATH=. python scripts/split_cat_effect.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "optimus"), str(ROOT / "tests" / "benchmarks")]

import optimus  # noqa: E402
from optimus.capture import copy_graph_module  # noqa: E402
from optimus.rules import REGISTRY  # noqa: E402

FAMILY = {
    "normalize_split_cat",
    "split_cat",
    "cat_split",
    "merge_splits",
    "flatten_cats",
    "noop_split_cat",
    "stack_unbind",
    "unbind_cat",
    "stack_pieces",
}
WITHOUT = tuple(r for r in REGISTRY if r not in FAMILY)


def latency_us(fn: Any, x: torch.Tensor) -> float:
    with torch.no_grad():
        for _ in range(20):
            fn(x)
        samples = []
        for _ in range(300):
            start = time.perf_counter()
            fn(x)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def towers() -> None:
    from optimus_models import Towers

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, x = Towers(32, 16, 16), torch.randn(256, 32 * 16)
    variants: dict[str, Any] = {
        "eager": model,
        "optimus without split/cat": optimus.optimize(model, (x,), rules=list(WITHOUT)),
        "optimus all rules": optimus.optimize(model, (x,)),
    }
    for name, gm in list(variants.items())[1:]:
        rep = gm.optimus_report
        torch.testing.assert_close(gm(x), model(x))
        print(f"{name}: {rep.rules_fired} nodes {rep.nodes_before} -> {rep.nodes_after}")
    for _ in range(3):
        print("latency us:", {k: round(latency_us(f, x)) for k, f in variants.items()})


def optimizer_time() -> None:
    from test_optimizer_speed import build

    for nodes in (1000, 10000, 20000):
        gm, _ = build(nodes)
        for name, rules in (("all rules", None), ("without split/cat", WITHOUT)):
            cfg = optimus.OptimusConfig(rules=rules)
            times = []
            for _ in range(3):
                g = copy_graph_module(gm)
                start = time.perf_counter()
                rep = optimus.optimize_graph_module(g, cfg)
                times.append(time.perf_counter() - start)
            print(
                f"{nodes} nodes, {name}: median {statistics.median(times):.3f}s "
                f"(min {min(times):.3f}, max {max(times):.3f}), nodes after {rep.nodes_after}, "
                f"rounds {rep.iterations}"
            )


if __name__ == "__main__":
    towers()
    optimizer_time()
