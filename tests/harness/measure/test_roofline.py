"""The roofline floor (harness/measure/roofline.py): FLOPs and bytes of tiny modules against
figures worked out by hand, the pricing rules, the large-GEMM pricing and its asv cross-check, and no committed
cell above its floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from harness.measure import roofline

REPO = Path(__file__).resolve().parents[3]
F32 = 4


def test_linear_infer_by_hand() -> None:
    # [16, 64] @ [64, 32] + bias: 2*16*64*32 FLOPs; weight+bias, input, output read/written once.
    c = roofline.count(nn.Linear(64, 32), (torch.randn(16, 64),), train=False)
    assert c["flops"] == 2 * 16 * 64 * 32
    assert c["param_bytes"] == (64 * 32 + 32) * F32
    assert c["input_bytes"] == 16 * 64 * F32
    assert c["output_bytes"] == 16 * 32 * F32
    assert c["saved_bytes"] == c["grad_bytes"] == 0
    assert c["bytes"] == ((64 * 32 + 32) + 16 * 64 + 16 * 32) * F32
    assert c["flop_calls"] == [(2 * 16 * 64 * 32, 16 * 64 * F32)]  # the smaller operand: the input


def test_linear_train_by_hand() -> None:
    # Forward, the weight's gradient and the input's gradient: three GEMMs of the same size.
    # addmm saves its input and the weight: both already counted, so nothing new is saved.
    c = roofline.count(nn.Linear(64, 32), (torch.randn(16, 64),), train=True, input_grads=[True])
    assert c["flops"] == 3 * 2 * 16 * 64 * 32
    assert c["saved_bytes"] == 0
    assert c["grad_bytes"] == ((64 * 32 + 32) + 16 * 64) * F32  # parameter grads + the input's
    assert c["bytes"] == ((64 * 32 + 32) * 2 + 16 * 64 * 2 + 16 * 32) * F32


def test_saved_activations_counted_once() -> None:
    # Linear -> ReLU -> Linear, input without grad: the ReLU's output [16, 32] is saved (by the
    # ReLU and by the second linear: one storage, counted once); no input gradient, so backward
    # has the first layer's weight GEMM only: 2 (forward) + 2 + 1 GEMMs.
    m = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
    c = roofline.count(m, (torch.randn(16, 64),), train=True, input_grads=[False])
    assert c["saved_bytes"] == 16 * 32 * F32
    fwd = 2 * 16 * 64 * 32 + 2 * 16 * 32 * 8
    bwd = 2 * 16 * 32 * 8 * 2 + 2 * 16 * 64 * 32  # second: weight and input grads; first: weight
    assert c["flops"] == fwd + bwd
    params = (64 * 32 + 32 + 32 * 8 + 8) * F32
    assert c["grad_bytes"] == params
    assert c["bytes"] == params * 2 + 16 * 64 * F32 + 16 * 8 * F32 + 16 * 32 * F32


def test_shared_parameter_counted_once() -> None:
    lin = nn.Linear(8, 8, bias=False)
    m = nn.Sequential(lin, lin)  # one storage, read twice: counted once
    c = roofline.count(m, (torch.randn(4, 8),), train=False)
    assert c["param_bytes"] == 8 * 8 * F32
    assert c["flops"] == 2 * (2 * 4 * 8 * 8)


PEAKS = {
    "gemm": [
        {"m": 1, "n": 1, "k": 1, "key_bytes": 1000, "flops_per_s": 100e9},
        {"m": 1, "n": 1, "k": 1, "key_bytes": 10_000, "flops_per_s": 50e9},
    ],
    "gemm_flops_per_s": 100e9,
    "bandwidth_bytes_per_s": 5e9,
    "last_level_cache_bytes": 1_000_000,
    "cache_bandwidth_bytes_per_s": 50e9,
}


def test_pricing_rules() -> None:
    assert roofline.gemm_rate_for(10, PEAKS) == 100e9  # below every shape: the best rate
    assert roofline.gemm_rate_for(5000, PEAKS) == 100e9  # nearest shape below
    assert roofline.gemm_rate_for(10**9, PEAKS) == 50e9
    assert roofline.bandwidth_for(1000, PEAKS) == (50e9, "cache")
    assert roofline.bandwidth_for(2_000_000, PEAKS) == (5e9, "memory")
    # compute: 1e9 FLOPs at 100 GFLOP/s + 1e9 at 50 = 30 ms; memory: 2 MB at 5 GB/s = 0.4 ms.
    f = roofline.floor(
        {"flops": 2 * 10**9, "bytes": 2_000_000, "flop_calls": [(10**9, 10), (10**9, 10**6)]}, PEAKS
    )
    assert f["compute_ms"] == pytest.approx(30.0)
    assert f["memory_ms"] == pytest.approx(0.4)
    assert (f["floor_ms"], f["bound"]) == (pytest.approx(30.0), "compute")
    # the max, not the sum; FLOPs without a recorded call go at the best rate
    g = roofline.floor({"flops": 10**9, "bytes": 10**9, "flop_calls": []}, PEAKS)
    assert (g["floor_ms"], g["bound"]) == (pytest.approx(200.0), "memory")
    cell = {"latency_ms": {"median": 60.0}}
    roofline.fill_cell(
        cell, {"flops": 2 * 10**9, "bytes": 0, "flop_calls": [(10**9, 10), (10**9, 10**6)]}, PEAKS
    )
    assert cell["of_floor"] == pytest.approx(0.5)


def test_large_gemm_floor_is_its_flops_at_the_measured_rate() -> None:
    """The largest measured GEMM shape as ``nn.Linear``: counted at 2mnk FLOPs, compute-bound,
    and priced at exactly FLOPs / rate. How close that floor comes to the module's measured time
    depends on the machine and is tracked by asv (``benchmarks/bench_roofline.py``), not
    asserted here."""
    m, n, k = roofline.GEMM_SHAPES[-1]
    lin = nn.Linear(k, n, bias=False)
    counts = roofline.count(lin, (torch.randn(m, k),), train=False)
    rate = 100e9
    peaks = {**PEAKS, "gemm": [{"key_bytes": 4 * min(m * k, k * n), "flops_per_s": rate}]}
    f = roofline.floor(counts, peaks)
    assert counts["flops"] == 2 * m * n * k
    assert f["bound"] == "compute"
    assert f["floor_ms"] == pytest.approx(1e3 * 2 * m * n * k / rate)


def test_gemm_cross_check_benchmark_reads_a_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    """The asv cross-check returns floor / measured; with the module timed as twice the rate's
    call it must read about 0.5, so the figure follows the timing and not a constant."""
    from benchmarks import bench_roofline

    ticks = iter(range(10**6))
    clock = {"t": 0.0}

    def fake_counter() -> float:
        # t0, t1 (mm took 1 s), end (linear took 2 s): 0, 1, 3, 3, 4, 6, ...
        i = next(ticks) % 3
        clock["t"] += (0.0, 1.0, 2.0)[i]
        return clock["t"]

    monkeypatch.setattr(bench_roofline.time, "perf_counter", fake_counter)
    monkeypatch.setattr(roofline, "copy_bandwidth", lambda nbytes, device="cpu", repeats=3: 1e12)
    assert bench_roofline.floor_over_measured() == pytest.approx(0.5)


def _results_files() -> list[Path]:
    return sorted(p for p in (REPO / "results").rglob("*.json") if p.is_file())


def test_no_committed_cell_reads_above_its_floor() -> None:
    """A cell faster than its floor is a bug in the floor (counting or peaks), never clipped."""
    checked, above = 0, []
    for path in _results_files():
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
            continue
        for c in doc["cells"]:
            if isinstance(c, dict) and c.get("of_floor") is not None:
                checked += 1
                assert c["of_floor"] == pytest.approx(c["floor_ms"] / c["latency_ms"]["median"])
                if c["of_floor"] > 1.0:
                    above.append(f"{path.name}: {c['model']}/{c['mode']}/{c['phase']} {c['of_floor']:.3f}")
    assert checked, "no committed results file has floors"
    assert above == []
