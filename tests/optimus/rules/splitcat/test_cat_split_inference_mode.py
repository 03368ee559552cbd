"""cat_split must not hand a view of an inference tensor to code outside ``inference_mode``.

Found by the over-arch fuzz programs (seed 1850): eager's ``cat`` of lookups made under
``torch.inference_mode()``, run outside it, is a normal tensor; ``cat(...)[:, :k]`` read as
``a.narrow(1, 0, k)`` is an inference tensor, and the ``nn.Linear`` that reads it raised
"Inference tensors cannot be saved for backward"."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import optimus


class Lookups(nn.Module):
    def __init__(self, inference: bool) -> None:
        super().__init__()
        self.inference = inference
        self.e0 = nn.Parameter(torch.randn(5, 4))
        self.register_buffer("e1", torch.randn(5, 4))  # frozen: cutting it off cuts no gradient
        self.top = nn.Linear(2, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.inference:
            with torch.inference_mode():
                a, b = F.embedding(ids, self.e0), F.embedding(ids, self.e1)
        else:
            a, b = F.embedding(ids, self.e0), F.embedding(ids, self.e1)
        return self.top(torch.cat([a, b], 1)[:, :2])


def _run(
    model: nn.Module, ids: torch.Tensor, call: nn.Module | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    """Forward and backward through ``call`` (default: ``model``); the gradients land on ``model``'s
    own parameters either way."""
    out = (call or model)(ids)
    out.sum().backward()
    grads = {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def test_a_slice_of_a_cat_of_inference_values_keeps_its_copy() -> None:
    torch.manual_seed(0)
    model, ids = Lookups(inference=True), torch.tensor([0, 3, 4])
    want_out, want_grads = _run(model, ids)
    gm = optimus.optimize(model, (ids,))
    got_out, got_grads = _run(model, ids, gm)  # raised before: an inference tensor saved for backward
    torch.testing.assert_close(got_out, want_out)
    assert got_grads.keys() == want_grads.keys()
    for name, g in want_grads.items():
        assert (g is None) == (got_grads[name] is None), name
        if g is not None:
            torch.testing.assert_close(got_grads[name], g)
    assert "cat_split" not in gm.optimus_report.rules_fired
    assert any("inference-mode value outside inference mode" in r for r in gm.optimus_report.declined_reasons)


def test_the_same_slice_without_inference_mode_is_still_rewritten() -> None:
    torch.manual_seed(0)
    model, ids = Lookups(inference=False), torch.tensor([0, 3, 4])
    want_out, _ = _run(model, ids)
    gm = optimus.optimize(model, (ids,))
    got_out, _ = _run(model, ids, gm)
    torch.testing.assert_close(got_out, want_out)
    assert "cat_split" in gm.optimus_report.rules_fired
