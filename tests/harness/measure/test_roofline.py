"""The roofline floor (harness/measure/roofline.py): FLOPs and bytes of tiny modules against
figures worked out by hand, the pricing rules, the large-GEMM cross-check, and no committed
cell above its floor."""

from __future__ import annotations

import json
import statistics
import time
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


def test_large_gemm_floor_within_10_percent_of_its_time() -> None:
    """A plain GEMM (``nn.Linear``) of the largest measured shape, tens of ms at one thread: its
    floor is its FlopCounterMode FLOPs at the measured rate. On a shared 2-core machine a
    neighbour's load moves a median by more than 10% within seconds, so the rate (``torch.mm``,
    as ``measure_peaks`` times it) and the module are timed in alternating rounds, medians of 9
    each, up to three tries."""
    m, n, k = roofline.GEMM_SHAPES[-1]
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, lin = torch.randn(m, k), nn.Linear(k, n, bias=False)
        w, out = lin.weight.detach().t().contiguous(), torch.empty(m, n)
        counts = roofline.count(lin, (a,), train=False)
        ratios = []
        for _ in range(3):
            mm_s, lin_s = [], []
            with torch.no_grad():
                lin(a), torch.mm(a, w, out=out)
                for _ in range(9):
                    t0 = time.perf_counter()
                    torch.mm(a, w, out=out)
                    t1 = time.perf_counter()
                    lin(a)
                    mm_s.append(t1 - t0)
                    lin_s.append(time.perf_counter() - t1)
            rate = 2.0 * m * n * k / statistics.median(mm_s)
            key = 4 * min(m * k, k * n)
            peaks = {**PEAKS, "gemm": [{"key_bytes": key, "flops_per_s": rate}], "gemm_flops_per_s": rate}
            f = roofline.floor(counts, peaks)
            ratios.append(f["floor_ms"] / (1e3 * statistics.median(lin_s)))
            if abs(ratios[-1] - 1) <= 0.10:
                break
    finally:
        torch.set_num_threads(saved)
    print(f"large GEMM {m}x{n}x{k}: floor / measured {ratios}")
    assert counts["flops"] == 2 * m * n * k
    assert f["bound"] == "compute"
    assert abs(ratios[-1] - 1) <= 0.10, f"floor / measured over the tries: {ratios}"


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
