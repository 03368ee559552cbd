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
