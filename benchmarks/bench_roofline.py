"""The roofline floor's cross-check: a plain GEMM against the floor the harness prices it at.

Why a tracked figure and not a unit test: the floor of a compute-bound cell is its counted
FLOPs at the GEMM rate ``harness.measure.roofline.measure_peaks`` measures (``torch.mm``,
float32, one thread). On a plain ``nn.Linear`` of the largest measured shape the floor should
read close to 1.0 of the module's time; a drift of this figure is a change of counting (the
FLOP counter, the pricing) or of the runtime's linear path, which asv's change points show
against the commit. Its level depends on the machine (the module allocates its output and
calls ``addmm`` with a transposed weight, ``torch.mm`` writes into a buffer), so it is tracked,
not asserted: on the 2-core development machine it read 0.97-1.03, on the CI runner 0.86-0.89.

The rate and the module are timed in alternating rounds, medians of 9 each, so a neighbour's
load moves both alike.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

ROUNDS = 9


def floor_over_measured() -> float:
    """floor_ms / measured ms of ``nn.Linear`` at ``roofline.GEMM_SHAPES[-1]``, one thread."""
    import torch
    from torch import nn

    from harness.measure import roofline

    m, n, k = roofline.GEMM_SHAPES[-1]
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        a, lin = torch.randn(m, k), nn.Linear(k, n, bias=False)
        w, out = lin.weight.detach().t().contiguous(), torch.empty(m, n)
        counts = roofline.count(lin, (a,), train=False)
        mm_s, lin_s = [], []
        with torch.no_grad():
            lin(a), torch.mm(a, w, out=out)
            for _ in range(ROUNDS):
                t0 = time.perf_counter()
                torch.mm(a, w, out=out)
                t1 = time.perf_counter()
                lin(a)
                mm_s.append(t1 - t0)
                lin_s.append(time.perf_counter() - t1)
    finally:
        torch.set_num_threads(saved)
    rate = 2.0 * m * n * k / statistics.median(mm_s)
    peaks: dict[str, Any] = {
        "gemm": [{"key_bytes": 4 * min(m * k, k * n), "flops_per_s": rate}],
        "gemm_flops_per_s": rate,
        "bandwidth_bytes_per_s": roofline.copy_bandwidth(roofline.COPY_MIN_BYTES),
    }
    return float(roofline.floor(counts, peaks)["floor_ms"] / (1e3 * statistics.median(lin_s)))


class GemmFloor:
    timeout = 300.0

    def track_floor_over_measured(self) -> float:
        return floor_over_measured()

    track_floor_over_measured.unit = "floor/measured"  # type: ignore[attr-defined]


if __name__ == "__main__":
    print(f"large GEMM floor / measured: {floor_over_measured():.3f}")
