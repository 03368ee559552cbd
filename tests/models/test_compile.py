"""torch.compile (Inductor, fullgraph) of the dense arch matches eager: forward and gradients.

All four tiny dense archs are compiled as one function: one forward and one backward Inductor
compile instead of eight, so the test stays within the CI budget on a 2-core machine.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import models


class AllDense(nn.Module):
    """The four families' dense archs side by side; returns every family's logits."""

    def __init__(self, dense: list[nn.Module]) -> None:
        super().__init__()
        self.archs = nn.ModuleList(dense)

    def forward(self, inputs: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
        return [arch(d, p) for arch, (d, p) in zip(self.archs, inputs, strict=True)]


def _check(train: bool) -> None:
    builds = [models.build(f, "tiny", count_nodes=False) for f in models.FAMILIES]
    eager = AllDense([copy.deepcopy(b.module.dense) for b in builds])
    compiled_mod = copy.deepcopy(eager)
    torch._dynamo.reset()
    compiled = torch.compile(compiled_mod, fullgraph=True)
    base = [b.dense_inputs(b.batches[0]) for b in builds]
    results = []
    for fn, mod in ((eager, eager), (compiled, compiled_mod)):
        inputs = [(d, p.clone().requires_grad_(train)) for d, p in base]
        with torch.set_grad_enabled(train):
            outs = fn(inputs)
        grads: list[Tensor | None] = []
        if train:
            loss = sum(b.loss(o, b.batches[0].labels) for b, o in zip(builds, outs, strict=True))
            loss.backward()  # type: ignore[union-attr]
            grads = [p.grad for _, p in inputs] + [p.grad for p in mod.parameters()]
        results.append(([o.detach() for o in outs], grads))
    (eager_outs, eager_grads), (comp_outs, comp_grads) = results
    for family, c, e in zip(models.FAMILIES, comp_outs, eager_outs, strict=True):
        assert c.shape == e.shape, family
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-5, msg=lambda m, f=family: f"{f}: {m}")
    assert len(comp_grads) == len(eager_grads)
    for c, e in zip(comp_grads, eager_grads, strict=True):
        assert c is not None and e is not None
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


# compile_threads=1: no worker pool, which is faster for tiny graphs on 2 shared cores.
@pytest.mark.compile
@torch._inductor.config.patch(compile_threads=1)
def test_inductor_dense_forward_matches_eager() -> None:
    _check(train=False)


# Forward + backward compiles take minutes cold on the 2-core CI machine: run with OPTIMUS_SLOW=1.
@pytest.mark.compile
@pytest.mark.slow
@torch._inductor.config.patch(compile_threads=1)
def test_inductor_dense_forward_and_gradients_match_eager() -> None:
    _check(train=True)
