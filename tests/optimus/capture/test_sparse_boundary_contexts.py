"""The contexts around a lookup that the sparse boundary runs outside the graph are kept for it:
a model that looks up its tables under ``no_grad`` (frozen embeddings), ``inference_mode`` or
``autocast`` gets the same values, gradients and optimizer steps as eager, with the boundary
still used. A context the boundary cannot reproduce makes it decline (the ordinary capture runs)
and the report says why."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import optimus
from optimus.config import OptimusConfig

torchrec = pytest.importorskip("torchrec")
from torchrec import KeyedJaggedTensor  # noqa: E402

from tests.optimus.capture.test_sparse_boundary import FEATURES, Towers, kjt  # noqa: E402


def _no_saved_hooks() -> Any:
    return torch.autograd.graph.disable_saved_tensors_hooks("the lookup saves no hooks")


class Wrapped(Towers):
    """Towers whose lookup runs inside ``context()`` (and whose pooled values leave it as float32
    tensors that autograd may save)."""

    def __init__(self, context: Callable[[], Any]) -> None:
        super().__init__()
        self.context = context

    def forward(self, x: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        with self.context():
            kt = self.sparse.ebc(features)
            values = kt.values()
        pooled = values.float().clone().split([4] * FEATURES, 1)
        h = [torch.relu(t(p)) for t, p in zip(self.towers, pooled, strict=True)]
        return self.top(torch.cat([x, *h], 1))


class NoGradInAutocast(Towers):
    """Nested blocks, and a no_grad block closed before the lookup (dropped, not replayed)."""

    def forward(self, x: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        with torch.no_grad():
            x = x * 2
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            values = self.sparse.ebc(features).values()
        pooled = values.float().split([4] * FEATURES, 1)
        h = [torch.relu(t(p)) for t, p in zip(self.towers, pooled, strict=True)]
        return self.top(torch.cat([x, *h], 1))


class NoGradElsewhere(Towers):
    """A no_grad block that does not hold the lookup: nothing changes for the boundary."""

    def forward(self, x: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        with torch.no_grad():
            scale = x.abs().mean()
        return super().forward(x * scale, features)


CONTEXTS: dict[str, Callable[[], Any]] = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "set_grad_enabled_false": lambda: torch.set_grad_enabled(False),
}


def _optimize(mod: nn.Module, *inputs: Any) -> torch.fx.GraphModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optimus.optimize(mod, inputs, config=OptimusConfig())


def _train(module: Any, params: list[nn.Parameter], steps: int, opt: str) -> list[torch.Tensor]:
    optim: torch.optim.Optimizer = (
        torch.optim.SGD(params, lr=0.05, momentum=0.9)
        if opt == "sgd"
        else torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)
    )
    outs = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 + step)
        x = torch.randn(4, 3, generator=gen)
        out = module(x, kjt(10 + step))
        out.square().sum().backward()
        optim.step()
        optim.zero_grad(set_to_none=False)
        outs.append(out.detach())
    return outs


def _assert_same_training(ref: nn.Module, mod: nn.Module, gm: Any, opt: str) -> None:
    want = _train(ref, list(ref.parameters()), 3, opt)
    got = _train(gm, list(mod.parameters()), 3, opt)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w)
    for (name, p), q in zip(ref.named_parameters(), mod.parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=name)
        assert (q.grad is None) == (p.grad is None), name


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("name", [*sorted(CONTEXTS), "no_grad_in_autocast"])
def test_the_lookups_context_is_kept_outside_the_graph(name: str, opt: str) -> None:
    torch.manual_seed(0)
    mod = NoGradInAutocast() if name == "no_grad_in_autocast" else Wrapped(CONTEXTS[name])
    ref = copy.deepcopy(mod)
    tables = [t.detach().clone() for t in mod.sparse.ebc.parameters()]
    gm = _optimize(mod, torch.randn(4, 3), kjt(0))
    report = gm.optimus_report
    assert "run eagerly outside it" in report.capture_reason, (report.capture_reason, report.notes)
    x, f = torch.randn(4, 3), kjt(1)
    want, got = ref(x, f), gm(x, f)
    torch.testing.assert_close(got, want)
    assert got.dtype == want.dtype and got.requires_grad == want.requires_grad
    _assert_same_training(ref, mod, gm, opt)
    if name != "autocast":  # the frozen tables never move
        for t, p in zip(tables, mod.sparse.ebc.parameters(), strict=True):
            assert torch.equal(t, p)


def test_the_contexts_open_at_the_lookup_are_replayed_in_order() -> None:
    """Only the blocks still open at the lookup are replayed, outermost first."""
    torch.manual_seed(5)
    gm = _optimize(NoGradInAutocast(), torch.randn(4, 3), kjt(0))
    context = gm.lookup_context
    assert [kind for kind, _ in context.steps] == ["autocast", "grad"]
    assert context.steps[0][1][:2] == ("cpu", torch.bfloat16) and context.steps[1][1] == (False,)
    with context.entered():
        assert torch.is_autocast_enabled("cpu") and not torch.is_grad_enabled()
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    assert not hasattr(_optimize(Towers(), torch.randn(4, 3), kjt(0)), "lookup_context")


def test_the_pooled_dtype_under_autocast_is_eagers() -> None:
    torch.manual_seed(1)
    mod = Wrapped(CONTEXTS["autocast"])

    class Raw(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = mod.sparse.ebc

        def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                values = self.ebc(features).values()
            return values * 1

    raw = Raw()
    gm = _optimize(raw, kjt(0))
    assert "run eagerly outside it" in gm.optimus_report.capture_reason
    f = kjt(2)
    want, got = raw(f), gm(f)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


def test_a_context_that_cannot_be_reproduced_declines_the_boundary() -> None:
    torch.manual_seed(2)
    mod = Wrapped(_no_saved_hooks)
    ref = copy.deepcopy(mod)
    gm = _optimize(mod, torch.randn(4, 3), kjt(0))
    report = gm.optimus_report
    assert "run eagerly outside it" not in report.capture_reason
    assert any("sparse boundary not used" in n for n in report.notes), report.notes
    x, f = torch.randn(4, 3), kjt(1)
    torch.testing.assert_close(gm(x, f), ref(x, f))


def test_a_context_elsewhere_leaves_the_boundary_as_it_was() -> None:
    torch.manual_seed(3)
    mod = NoGradElsewhere()
    ref = copy.deepcopy(mod)
    gm = _optimize(mod, torch.randn(4, 3), kjt(0))
    assert "run eagerly outside it" in gm.optimus_report.capture_reason
    assert gm.optimus_report.rules_fired.get("batch_linear") == 1
    _assert_same_training(ref, mod, gm, "adamw")


def test_the_caller_in_no_grad_still_gets_no_graph() -> None:
    torch.manual_seed(4)
    mod = Wrapped(CONTEXTS["autocast"])
    ref = copy.deepcopy(mod)
    gm = _optimize(mod, torch.randn(4, 3), kjt(0))
    x, f = torch.randn(4, 3), kjt(5)
    with torch.no_grad():
        want, got = ref(x, f), gm(x, f)
    assert not got.requires_grad
    torch.testing.assert_close(got, want)
