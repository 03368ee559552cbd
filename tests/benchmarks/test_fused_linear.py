"""pytest-benchmark: the headroom micro-benchmark's four variants of one fused tower group (see
harness/diagnose/headroom.py, ``optimus-bench headroom``): separate linears, batch_linear with RuntimeStack, the ideal
pre-stacked baddbmm, batch_linear with RelayoutParams; forward and forward+backward. With
``--benchmark-disable`` (the default in CI) each runs once, as a smoke and parity test.

    pytest tests/benchmarks/test_fused_linear.py --benchmark-enable --benchmark-group-by=param:phase
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness.diagnose import headroom as bench

G, B, K, N = 32, 64, 16, 16


@pytest.fixture(scope="module")
def variants() -> dict[str, Any]:
    return bench.build(G, K, N, B)


@pytest.mark.parametrize("phase", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("variant", bench.VARIANTS)
def test_fused_linear(benchmark: Any, variants: dict[str, Any], variant: str, phase: str) -> None:
    x = torch.randn(G, B, K)
    if variant == "separate" and phase == "fwd":
        assert bench.check_parity(variants, x) < 1e-4  # every variant computes the same values
    mod, params = variants[variant]
    benchmark(bench.step_fn(mod, params, x, phase))


def test_optimized_variants_run_the_graph_captured_for_the_timed_batch(variants: dict[str, Any]) -> None:
    # Captured at another batch, every timed call took the re-specialized slow path (a second
    # graph behind a per-call dispatch): the benchmark then priced that path, not the fused op.
    x = torch.randn(G, B, K)
    for name in ("runtime", "relayout"):
        mod, _ = variants[name]
        with torch.no_grad():
            mod(x)
        assert mod.optimus_specializations == {}, name


def test_headroom_command_refuses_a_bad_group_list(capsys: Any) -> None:
    from harness import cli, exit_codes

    assert cli.main(["headroom", "--groups", "32,x"]) == exit_codes.BAD_INPUT
    assert "--groups must be comma-separated ints" in capsys.readouterr().err


def test_headroom_command_writes_its_rows(tmp_path: Any) -> None:
    import json

    from harness import cli

    out = tmp_path / "h.json"
    assert cli.main(["headroom", "--groups", "8", "--batch", "4",
                     "--rounds", "2", "--iters", "1", "--out", str(out)]) == 0  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert {r["variant"] for r in rows} == set(bench.VARIANTS)
    assert all(r["median_us"] > 0 for r in rows)
