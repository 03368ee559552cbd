#!/usr/bin/env python3
"""Eager train-step time of every family at `small`, 2 threads vs 1 thread, side by side.

Why: on a shared 2-core machine, OpenMP oversubscription can dominate eager step times; this
interleaves the families in one process so the thread count is the only thing that differs.

    PYTHONPATH=. python scripts/compare_threads.py
"""

from __future__ import annotations

import statistics
import time

import torch

import models


def main() -> None:
    builds = {f: models.build(f, "small", count_nodes=False) for f in models.FAMILIES}
    opts = {f: torch.optim.SGD(b.module.parameters(), lr=0.01) for f, b in builds.items()}

    def step(family: str, i: int) -> float:
        b = builds[family]
        batch = b.batches[i % len(b.batches)]
        start = time.perf_counter()
        opts[family].zero_grad(set_to_none=True)
        b.loss(b.module(*batch.inputs), batch.labels).backward()
        opts[family].step()
        return time.perf_counter() - start

    for threads in (2, 1):
        torch.set_num_threads(threads)
        samples: dict[str, list[float]] = {f: [] for f in builds}
        for i in range(12):
            for family in builds:
                samples[family].append(step(family, i))
        summary = {
            f: tuple(round(1000 * x, 1) for x in (statistics.median(v[2:]), min(v[2:]), max(v[2:])))
            for f, v in samples.items()
        }
        print(f"threads={threads} ms (median, min, max) after 2 warm-up steps: {summary}")


if __name__ == "__main__":
    main()
