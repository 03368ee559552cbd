"""``model.eval()`` / ``gm.eval()`` after optimize() takes effect: dropout
stops, BatchNorm uses and keeps its running statistics; ``train()`` switches back. The result
re-optimizes the model for the new mode at the first call in it and keeps one graph per mode."""

from __future__ import annotations

import pytest
import torch
from caller_world_models import CONFIGS, ModeTowers, state_of
from torch import nn

import optimus


def _pair(config: str) -> tuple[nn.Module, nn.Module, torch.Tensor, torch.fx.GraphModule]:
    torch.manual_seed(0)
    model, ref, x = ModeTowers(), ModeTowers(), torch.randn(8, 256)
    gm = optimus.optimize(model, (x,), config=CONFIGS[config])
    ref.load_state_dict(model.state_dict())  # (state kept by optimize is tested elsewhere)
    assert gm.optimus_report.rules_fired.get("batch_linear", 0) >= 1
    return model, ref, x, gm


def _same_step(gm: nn.Module, model: nn.Module, ref: nn.Module, x: torch.Tensor) -> None:
    """One call of ``gm`` (state on ``model``) equals one eager call of ``ref``, outputs and buffers."""
    torch.manual_seed(1)
    got = gm(x)
    torch.manual_seed(1)
    want = ref(x)
    torch.testing.assert_close(got, want)
    for (name, a), b in zip(model.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize("switch", ["model", "gm"])
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_eval_then_train_after_optimize(config: str, switch: str) -> None:
    model, ref, x, gm = _pair(config)
    _same_step(gm, model, ref, x)  # train mode, as captured
    (model if switch == "model" else gm).eval()
    ref.eval()
    assert not model.training and not model.drop.training  # gm.eval() reaches the model
    frozen = state_of(model)
    _same_step(gm, model, ref, x)  # dropout off, running statistics used and unchanged
    _same_step(gm, model, ref, x)
    assert all(torch.equal(v, state_of(model)[k]) for k, v in frozen.items())
    (model if switch == "model" else gm).train()
    ref.train()
    _same_step(gm, model, ref, x)
    assert len(gm.optimus_specializations) == 1  # one graph per mode, the eval one made once
    (reason,) = gm.optimus_report.specializations  # the report says why it re-optimized
    assert reason.startswith("train/eval mode changed (ModeTowers.training=False")


def test_one_submodule_switched_alone() -> None:
    """Only the dropout goes to eval: the mode check sees mode-sensitive submodules too."""
    model, ref, x, gm = _pair("default")
    model.drop.eval()
    ref.drop.eval()
    _same_step(gm, model, ref, x)


def test_mode_read_in_user_code() -> None:
    """A module whose own forward reads ``self.training`` (no Dropout/BatchNorm in it)."""

    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * (2.0 if self.training else 3.0)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = Gate()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.gate(x))

    torch.manual_seed(0)
    model, x = Outer(), torch.randn(3, 4)
    gm = optimus.optimize(model, (x,))
    model.gate.eval()  # only the submodule that reads it
    torch.testing.assert_close(gm(x), model(x))


def test_compiled_optimized_module_sees_the_switch() -> None:
    """torch.compile of the result (the harness's compile+optimus): Dynamo traces the mode check
    into guards, so eval() recompiles instead of reusing the training graph."""
    model, ref, x, gm = _pair("default")
    compiled = torch.compile(gm, backend="eager", dynamic=False)
    _same_step(compiled, model, ref, x)
    model.eval()
    ref.eval()
    _same_step(compiled, model, ref, x)


@pytest.mark.compile
def test_optimus_backend_sees_the_switch() -> None:
    """torch.compile(backend="optimus"): Dynamo's own guards on ``training`` recompile."""
    torch.manual_seed(0)
    model, ref, x = ModeTowers(), ModeTowers(), torch.randn(8, 256)
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="optimus", dynamic=False)
    compiled(x)  # the training graph (Inductor's dropout draws differ from eager's: not compared)
    ref(x)
    model.eval()
    ref.eval()
    for _ in range(2):
        torch.testing.assert_close(compiled(x), ref(x))
    for a, b in zip(model.buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b)


def test_graph_break_path_follows_the_mode() -> None:
    """The Dynamo-subgraph path: ``gm.eval()`` reaches the model, and Dynamo's guards on
    ``training`` recompile (a guard against regressions; this path already followed the mode)."""

    class Broken(ModeTowers):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = super().forward(x)
            torch._dynamo.graph_break()
            return y * 2

    torch.manual_seed(0)
    model, ref, x = Broken(), Broken(), torch.randn(8, 256)
    gm = optimus.optimize(model, (x,))
    ref.load_state_dict(model.state_dict())
    assert gm.optimus_report.capture == "dynamo-subgraphs"
    _same_step(gm, model, ref, x)
    gm.eval()
    ref.eval()
    assert not model.training
    _same_step(gm, model, ref, x)


def test_a_deep_copy_keeps_checking_the_mode() -> None:
    """``copy.deepcopy(gm)`` comes with its own copy of the original module: ``eval()`` on the
    copy switches the copy only, and the copy follows it."""
    import copy

    model, ref, x, gm = _pair("default")
    twin = copy.deepcopy(gm)
    twin.eval()
    ref.eval()
    assert model.training  # the original is untouched
    torch.testing.assert_close(twin(x), ref(x))
