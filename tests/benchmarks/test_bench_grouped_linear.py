"""The grouped-linear asv benchmark: its shapes follow models/widths.py, every CPU variant runs,
and the ones that cannot run on a device say so (asv then skips them)."""

from __future__ import annotations

import pytest

from benchmarks import bench_grouped_linear as bench
from models import widths


def test_shapes_are_seeded_ragged_and_use_the_models_dims() -> None:
    assert bench.EMBEDDING_DIMS == widths.EMBEDDING_DIMS
    shapes = bench.ragged_shapes(32)
    assert shapes == bench.ragged_shapes(32)
    assert len({(k, n) for _, k, n in shapes}) > 8
    assert all(
        m == bench.BATCH and k in bench.EMBEDDING_DIMS and n in bench.EMBEDDING_DIMS for m, k, n in shapes
    )


@pytest.mark.parametrize("variant", ["separate", "loop", "padded"])
def test_cpu_variants_run_forward_and_backward(variant: str) -> None:
    b = bench.GroupedLinear()
    b.setup("cpu", 8, variant)
    b.time_forward("cpu", 8, variant)
    b.time_forward_backward("cpu", 8, variant)
    assert all(w.grad is not None for w in b.gw)


def test_triton_is_not_timed_on_cpu() -> None:
    with pytest.raises(NotImplementedError, match="CUDA only"):
        bench.GroupedLinear().setup("cpu", 8, "triton")


def test_gpu_report_times_with_the_harness_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_cuda_ms`` is the harness's ``time_iterations`` on CUDA (exactly ``iters`` samples after
    ``warmup``), then the median; checked here without a GPU by standing in for the sampler."""
    from harness.measure import timing

    seen: dict[str, object] = {}

    def sampler(step: object, **kw: object) -> list[float]:
        seen.update(kw)
        return [5.0, 1.0, 3.0, 2.0, 4.0]

    monkeypatch.setattr(timing, "time_iterations", sampler)
    assert bench._cuda_ms(lambda: None, iters=5, warmup=2) == 3.0
    assert seen == {"warmup": 2, "min_iters": 5, "max_iters": 5, "budget_s": 0.0, "device": "cuda"}
