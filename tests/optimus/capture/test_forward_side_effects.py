"""Python side effects in ``forward``: an exported graph would drop them, so
optimize() detects them at capture and takes the Dynamo path, which replays them at every call;
no FakeTensor is ever left in the model, and its attributes are as they were after optimize()."""

from __future__ import annotations

import pytest
import torch
from caller_world_models import CONFIGS, RecordingTowers, seeded
from torch import nn

import optimus


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_attribute_and_list_side_effects_run_per_call(config: str) -> None:
    torch.manual_seed(0)
    model, ref, x = RecordingTowers(), RecordingTowers(), torch.randn(8, 256)
    ref.load_state_dict(model.state_dict())
    gm = optimus.optimize(model, (x,), config=CONFIGS[config])
    assert isinstance(model.last, str)  # the attribute forward assigns is as it was: no FakeTensor
    assert len(model.calls) <= 1  # compiling ran forward at most once (on copies of the inputs)
    done = len(model.calls)
    for i in range(1, 3):
        torch.testing.assert_close(seeded(gm, x), seeded(ref, x))
        assert len(model.calls) == done + i  # every call appends, as in eager
        assert type(model.last) is torch.Tensor
        torch.testing.assert_close(model.last, ref.last)
    rep = gm.optimus_report  # the report says which path ran and why
    assert rep.capture == "dynamo-subgraphs"
    assert "side effects" in rep.capture_reason and "L['self'].calls" in rep.capture_reason


def test_side_effect_on_a_global_list() -> None:
    log: list[int] = []

    class Logging(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            log.append(x.shape[0])
            return self.lin(x)

    torch.manual_seed(0)
    model, x = Logging(), torch.randn(3, 4)
    gm = optimus.optimize(model, (x,))
    before = len(log)
    gm(x)
    gm(x)
    assert log[before:] == [3, 3]
    assert gm.optimus_report.capture == "dynamo-subgraphs"


def test_a_pure_forward_stays_on_the_export_path() -> None:
    """Side-effect detection has no false positive on a plain model (reads of attributes)."""
    torch.manual_seed(0)
    model = RecordingTowers()
    gm = optimus.optimize(nn.Sequential(model.linears[0], nn.ReLU()), (torch.randn(3, 16),))
    assert gm.optimus_report.capture == "export"
    assert gm.optimus_report.capture_reason.startswith("torch._dynamo.export captured")


@pytest.mark.compile
def test_optimus_backend_replays_side_effects() -> None:
    """torch.compile(backend="optimus"): Dynamo replays the side effects at every call."""
    torch.manual_seed(0)
    model, x = RecordingTowers(), torch.randn(8, 256)
    model.eval()  # no dropout: Inductor's draws differ from eager's
    compiled = torch.compile(model, backend="optimus", dynamic=False)
    for i in range(1, 3):
        out = compiled(x)
        assert len(model.calls) == i
        assert type(model.last) is torch.Tensor
        torch.testing.assert_close(model.last, out)
