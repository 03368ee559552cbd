"""pytest-benchmark: the headroom micro-benchmark's four variants of one fused tower group (see
scripts/bench_fused_linear.py): separate linears, batch_linear with RuntimeStack, the ideal
pre-stacked baddbmm, batch_linear with RelayoutParams; forward and forward+backward. With
``--benchmark-disable`` (the default in CI) each runs once, as a smoke and parity test.

    pytest tests/benchmarks/test_fused_linear.py --benchmark-enable --benchmark-group-by=param:phase
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_fused_linear as bench

G, B, K, N = 32, 64, 16, 16


@pytest.fixture(scope="module")
def variants() -> dict[str, Any]:
    return bench.build(G, K, N)


@pytest.mark.parametrize("phase", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("variant", bench.VARIANTS)
def test_fused_linear(benchmark: Any, variants: dict[str, Any], variant: str, phase: str) -> None:
    x = torch.randn(G, B, K)
    if variant == "separate" and phase == "fwd":
        assert bench.check_parity(variants, x) < 1e-4  # every variant computes the same values
    mod, params = variants[variant]
    run = bench.timer(mod, params, x, phase)
    benchmark(run, 1)
