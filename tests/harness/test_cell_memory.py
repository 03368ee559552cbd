"""A training cell's CPU peak memory counts each gradient once (session 3 fix)."""

from __future__ import annotations

import torch
from torch import nn

from harness import measure
from harness.cell import step_static_tensors


def test_train_peak_counts_gradients_once() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 256)
    param_bytes = measure.storage_bytes(model.parameters())

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        out.sum().backward()
        opt.step()
        return out

    step()  # the previous step's gradients exist, as after the harness's timing loop
    assert all(p.grad is not None for p in model.parameters())
    static = step_static_tensors(model, opt)
    assert measure.storage_bytes(static) == param_bytes, "gradients are not static: the step remakes them"
    mem = measure.step_peak_memory(step, "cpu", static)
    # The step's own peak holds the gradients backward made; the total counts them once.
    assert param_bytes <= mem["peak_mem_step_bytes"] < param_bytes + 256 * 1024
    assert mem["peak_mem_bytes"] < 2 * param_bytes + 256 * 1024


def test_inference_static_is_parameters_and_buffers() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16))
    static = step_static_tensors(model, None)
    expected = measure.storage_bytes([*model.parameters(), *model.buffers()])
    assert measure.storage_bytes(static) == expected
