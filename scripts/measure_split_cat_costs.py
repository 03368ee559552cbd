"""Measure what the split/cat cost constants stand for (optimus/rules/_split_cat_cost.py).

Prints medians (microseconds, 2000 calls each, 3 repeats) of torch.cat over 2..32 pieces of a
64x64 float tensor and of one ``narrow`` view, on this machine's CPU, eager mode, one thread:

    PYTHONPATH=. python scripts/measure_split_cat_costs.py

The cost model's unit is one kernel launch (~8 us on CPU, optimus/cost.py); a view costs about
0.2 of it and each further cat input about 0.04.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_us(fn: Callable[[], object], n: int = 2000) -> float:
    for _ in range(50):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    x = torch.randn(64, 64)
    for k in (2, 4, 8, 16, 32):
        parts = list(torch.split(x, 64 // k, 1))
        cats = [round(median_us(lambda p=parts: torch.cat(p, 1)), 2) for _ in range(3)]
        print(f"cat of {k:2d} pieces: {cats} us")
    print(f"narrow: {[round(median_us(lambda: x.narrow(1, 0, 32)), 2) for _ in range(3)]} us")


if __name__ == "__main__":
    main()
