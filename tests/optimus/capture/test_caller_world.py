"""optimize() leaves the caller's world as it found it: the example inputs,
every parameter and buffer (BatchNorm statistics, num_batches_tracked) and the RNG state are
bitwise unchanged, on every capture path and with verify=True."""

from __future__ import annotations

import pytest
import torch
from caller_world_models import CONFIGS, MutatingTowers, assert_same_state, seeded, state_of
from torch import nn

import optimus


def _world(model: nn.Module, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    return state_of(model), x.clone(), torch.get_rng_state()


def _assert_unchanged(before, model: nn.Module, x: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    state, x0, rng = before
    assert_same_state(state, state_of(model))
    assert torch.equal(x, x0), "the example input was mutated"
    assert torch.equal(torch.get_rng_state(), rng), "the global RNG advanced"


@pytest.mark.parametrize("verify", [False, True], ids=["plain", "verify"])
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_export_path_keeps_inputs_buffers_and_rng(config: str, verify: bool) -> None:
    torch.manual_seed(0)
    # (verify runs the graph on inputs that require grad: an in-place update of one cannot run)
    model, x = MutatingTowers(inplace=not verify), torch.randn(8, 256)
    ref = MutatingTowers(inplace=not verify)
    ref.load_state_dict(model.state_dict())
    before = _world(model, x)
    gm = optimus.optimize(model, (x,), config=CONFIGS[config], verify=verify)
    assert gm.optimus_report.capture == "export"
    _assert_unchanged(before, model, x)
    # and the optimized module still does what the model does, state updates included
    xa, xb = x.clone(), x.clone()
    torch.testing.assert_close(seeded(gm, xa), seeded(ref, xb))
    assert torch.equal(xa, xb)  # the in-place update reaches the caller's tensor, as in eager
    for (name, a), b in zip(model.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_graph_break_path_keeps_inputs_buffers_and_rng() -> None:
    """The Dynamo-subgraph fallback compiles by running the model: on copies, state restored."""

    class Broken(MutatingTowers):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = super().forward(x)
            torch._dynamo.graph_break()
            return y * 2

    torch.manual_seed(0)
    model, x = Broken(), torch.randn(8, 256)
    before = _world(model, x)
    gm = optimus.optimize(model, (x,))
    _assert_unchanged(before, model, x)
    assert gm.optimus_report.capture == "dynamo-subgraphs"
    assert "Unsupported" in gm.optimus_report.capture_reason  # the report says why export failed


def test_example_input_strides_are_kept_and_checked() -> None:
    """The model sees a copy with the example's strides: a transposed example gives a graph
    for transposed inputs, and calling it with that input needs no re-capture."""
    torch.manual_seed(0)
    model = MutatingTowers()
    x = torch.randn(256, 8).t()  # non-contiguous
    before = _world(model, x)
    gm = optimus.optimize(model, (x,))
    _assert_unchanged(before, model, x)
    ref = MutatingTowers()
    ref.load_state_dict(model.state_dict())
    torch.testing.assert_close(seeded(gm, x.clone()), seeded(ref, x.clone()))
    assert gm.optimus_report.specializations == []


def test_bad_inputs_still_raise_and_leave_state() -> None:
    torch.manual_seed(0)
    model = MutatingTowers()
    x = torch.randn(8, 255)  # binds, but does not fit the split
    before = _world(model, x)
    with pytest.raises(ValueError, match="do not match MutatingTowers: running it raised"):
        optimus.optimize(model, (x,))
    _assert_unchanged(before, model, x)
