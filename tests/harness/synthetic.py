"""Seeded synthetic results documents for tests that must not run a benchmark."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.measure import timing
from harness.store.results import new_results


def latency_samples(
    median_ms: float, n: int, seed: int, noise: float = 0.05, outliers: float = 0.05
) -> list[float]:
    """Realistic latency noise: log-normal spread around the median plus rare slow outliers
    (another process taking the core), as seen on this shared 2-core machine."""
    rng = np.random.default_rng(seed)
    xs = median_ms * rng.lognormal(0.0, noise, size=n)
    hit = rng.random(n) < outliers
    xs[hit] *= 1.0 + rng.exponential(0.5, size=int(hit.sum()))
    return [float(x) for x in xs]


def cell(model: str, mode: str, phase: str, median_ms: float, *, seed: int, status: str = "ok", n: int = 40,
         mem: int = 10_000_000, compile_s: float = 10.0, scale: str = "tiny") -> dict[str, Any]:  # fmt: skip
    c: dict[str, Any] = {
        "model": model,
        "scale": scale,
        "mode": mode,
        "phase": phase,
        "status": status,
        "error": None if status == "ok" else f"synthetic {status}",
        "latency_ms": timing.summarize(latency_samples(median_ms, n, seed)),
        "peak_mem_bytes": mem,
        "compile_s": compile_s,
        "optimus_s": None,
        "nodes_before": None,
        "nodes_after": None,
        "max_abs_err": 0.0,
    }
    return c


def doc(cells: list[dict[str, Any]]) -> dict[str, Any]:
    d = new_results({"git": {"sha": "0" * 40, "dirty": False}, "device": "cpu"}, {"scale": "tiny"})
    d["cells"] = cells
    return d
