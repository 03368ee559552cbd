"""MeasuredCostModel: the cache round-trips and is keyed; the driver consults it, declining batch
fusion where launches are free and accepting it where they are expensive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import fx, nn

import optimus
from models.synthetic_towers import Towers
from optimus.cost.analytic import DeviceConstants
from optimus.cost.measured import (
    ENV_DIR,
    MeasuredCostModel,
    cache_key,
    cache_path,
    calibrate,
    constants_for,
    load,
    save,
)
from optimus.semantics.meta import record

CPU = torch.device("cpu")


def group(g: int = 8) -> Towers:
    """G Linear(4, 4) over the G slices of a [G, B, 4] input, concatenated: the shared synthetic
    towers model (models/synthetic_towers.py) in that configuration."""
    return Towers(g, 4, 4, slices="index", body=("linear",))


def test_calibration_is_cached_keyed_and_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    first = constants_for(CPU)
    assert first.launch_s > 0 and first.bytes_per_s > 0 and first.flops_per_s > 0
    files = list(tmp_path.glob("cost-cpu-*.json"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))
    payload = json.loads(files[0].read_text())
    assert payload["key"] == cache_key(CPU) and payload["key"]["torch"] == torch.__version__
    # the second call reads the file (a doctored value proves it is not re-measured)
    payload["constants"]["launch_s"] = 123.0
    files[0].write_text(json.dumps(payload))
    assert constants_for(CPU).launch_s == 123.0
    # another thread count is another key, another file
    threads = torch.get_num_threads()
    other = {**cache_key(CPU), "threads": threads + 1}
    assert cache_path(other, tmp_path) != files[0]
    assert load(files[0], other) is None  # a file made for another key is not used


def test_bad_cache_files_are_recalibrated(tmp_path: Path) -> None:
    key = cache_key(CPU)
    path = cache_path(key, tmp_path)
    path.write_text("{not json")
    assert load(path, key) is None
    save(path, key, DeviceConstants(-1.0, 1.0, 1.0), {})
    assert load(path, key) is None  # nonsense constants rejected
    fresh = constants_for(CPU, tmp_path)
    assert load(path, key) == fresh


def test_calibrate_returns_probes() -> None:
    constants, probes = calibrate(CPU)
    assert probes["copy_s"] > 0 and probes["mm_s"] > 0
    assert constants.bytes_per_s > 0 and constants.flops_per_s > 0


def _optimize(cost_model: MeasuredCostModel) -> tuple[fx.GraphModule, torch.Tensor, nn.Module]:
    torch.manual_seed(0)
    model, x = group(), torch.randn(8, 2, 4, requires_grad=True)
    gm = fx.symbolic_trace(model)
    record(gm, (x,))
    optimus.optimize_graph_module(gm, optimus.OptimusConfig(rules=("batch_linear",), cost_model=cost_model))
    return gm, x, model


def test_driver_declines_batching_when_launches_are_free() -> None:
    free = DeviceConstants(launch_s=0.0, bytes_per_s=1e10, flops_per_s=1e11)
    gm, x, model = _optimize(MeasuredCostModel(constants={"cpu": free}))
    assert not any(n.target is torch.baddbmm for n in gm.graph.nodes)
    torch.testing.assert_close(gm(x), model(x))


def test_driver_accepts_batching_when_launches_are_expensive() -> None:
    dear = DeviceConstants(launch_s=1e-4, bytes_per_s=1e10, flops_per_s=1e11)
    gm, x, model = _optimize(MeasuredCostModel(constants={"cpu": dear}))
    assert sum(n.target is torch.baddbmm for n in gm.graph.nodes) == 1
    out, want = gm(x), model(x)
    torch.testing.assert_close(out, want)
    (g_out,) = torch.autograd.grad(out.sum(), x)
    (g_want,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(g_out, g_want)


def test_config_by_name_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    cfg = optimus.OptimusConfig(cost_model="measured")
    assert isinstance(cfg.cost_model, MeasuredCostModel) and "cpu" in cfg.cost_model.constants
    assert cfg.fingerprint() == optimus.OptimusConfig(cost_model="measured").fingerprint()
    with pytest.raises(ValueError, match="cost_model must be"):
        optimus.OptimusConfig(cost_model="fast")
    with pytest.raises(ValueError, match="min_group"):
        MeasuredCostModel(min_group=1, constants={"cpu": DeviceConstants(1.0, 1.0, 1.0)})
