"""A training cell's CPU peak memory counts each gradient once (not also in the static part)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.measure import memory
from harness.run.cell import step_static_tensors


def test_train_peak_counts_gradients_once() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 256)
    param_bytes = memory.storage_bytes(model.parameters())

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        out.sum().backward()
        opt.step()
        return out

    step()  # the previous step's gradients exist, as after the harness's timing loop
    assert all(p.grad is not None for p in model.parameters())
    static = step_static_tensors(model, opt)
    assert memory.storage_bytes(static) == param_bytes, "gradients are not static: the step remakes them"
    mem = memory.step_peak_memory(step, "cpu", static)
    # The step's own peak holds the gradients backward made; the total counts them once.
    assert param_bytes <= mem["peak_mem_step_bytes"] < param_bytes + 256 * 1024
    assert mem["peak_mem_bytes"] < 2 * param_bytes + 256 * 1024


def test_inference_static_is_parameters_and_buffers() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16))
    static = step_static_tensors(model, None)
    expected = memory.storage_bytes([*model.parameters(), *model.buffers()])
    assert memory.storage_bytes(static) == expected


def test_peak_place_names_the_op_the_peak_falls_in() -> None:
    x, w = torch.randn(64, 256), torch.randn(256, 1024)

    def step() -> torch.Tensor:
        return (x @ w).relu().sum()  # the peak: the mm's output and relu's output live at once

    peak, where = memory.cpu_step_peak(step)
    assert peak >= 2 * 64 * 1024 * 4
    assert where is not None and "relu" in where, where
    assert memory.step_peak_memory(step, "cpu", [x, w])["peak_mem_at"] == where


def test_peak_place_shortens_backward_and_compiled_names() -> None:
    place = memory.peak_place
    names = [
        "autograd::engine::evaluate_function: EmbeddingBagBackward0",
        "EmbeddingBagBackward0",
        "aten::sort",
    ]
    assert place(names) == "EmbeddingBagBackward0 > aten::sort"
    assert place(["## Call CompiledFxGraph fabc ##"]) == "compiled graph"
    assert place(["Torch-Compiled Region: 0/0", "aten::mm"]) == "compiled graph > aten::mm"
    assert place(["aten::mm"]) == "aten::mm"
    assert place([]) is None


def test_compare_never_judges_memory_measured_two_ways() -> None:
    from harness.gate import compare
    from tests.harness import synthetic

    old = synthetic.cell("towers", "compile", "train", 10.0, seed=1, mem=97_000_000)
    new = synthetic.cell("towers", "compile", "train", 10.0, seed=2, mem=66_000_000)
    old["peak_mem_method"] = "static tensors + torch.profiler allocator peak"
    new["peak_mem_method"] = memory.CPU_MEMORY_METHOD
    rows = compare.compare_docs(synthetic.doc([old]), synthetic.doc([new]))
    (mem,) = [r for r in rows if r.metric == "peak_mem_bytes"]
    assert mem.verdict == "not comparable" and mem.change is None
    assert "not comparable" in compare.format_rows(rows)
    new["peak_mem_method"] = old["peak_mem_method"]  # same method: judged as before
    (mem,) = [
        r
        for r in compare.compare_docs(synthetic.doc([old]), synthetic.doc([new]))
        if r.metric == "peak_mem_bytes"
    ]
    assert mem.verdict == "improvement"


def test_static_counts_the_gradient_buffers_a_relaid_out_model_keeps() -> None:
    import optimus
    from optimus.params.relayout import RelayoutParams, retained_gradient_buffers

    class Towers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linears = nn.ModuleList([nn.Linear(8, 8) for _ in range(6)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([lin(x[i]) for i, lin in enumerate(self.linears)], 1)

    torch.manual_seed(0)
    x = torch.randn(6, 4, 8)
    gm = optimus.optimize(Towers(), (x,), config=optimus.OptimusConfig(layout=RelayoutParams()))
    opt = torch.optim.SGD(gm.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        gm(x).sum().backward()
        opt.step()
    static = step_static_tensors(gm, opt)
    kept = retained_gradient_buffers(gm)
    assert kept, "small fused groups keep their gradient buffer between steps"
    params = memory.storage_bytes(gm.parameters())
    assert memory.storage_bytes(static) == params + memory.storage_bytes(kept)


def test_the_highest_of_several_steps_is_the_rank_s_memory_and_the_lowest_is_kept_beside_it() -> None:
    """Steps whose peaks differ (a rank's, where communication buffers overlap the backward
    differently each step): the figure is the highest step's, and the lowest step's bytes say
    how far apart they were."""
    sizes = iter([1, 4, 2, 3, 1])  # MiB of float32 each step holds at its peak
    static = [torch.zeros(1024)]

    def step() -> int:
        buf = torch.ones(next(sizes) * 256 * 1024)  # 1 MiB per unit
        return int(buf[0])

    mem = memory.highest_step_peak_memory(step, "cpu", static, 5)
    mib = 1024 * 1024
    assert mem["peak_mem_steps"] == 5
    assert 4 * mib <= mem["peak_mem_step_bytes"] < 4 * mib + 64 * 1024
    assert 1 * mib <= mem["peak_mem_step_min_bytes"] < 1 * mib + 64 * 1024
    assert mem["peak_mem_bytes"] == mem["peak_mem_static_bytes"] + mem["peak_mem_step_bytes"]
    assert mem["peak_mem_static_bytes"] == 4096
    with pytest.raises(StopIteration):  # exactly five steps ran
        step()
