"""The harness's Optimus modes run under the memory ceiling, counting the model's memory beside
the dense arch (its embedding tables), with no gradient buffers kept between steps.

WHY: the cell's peak-memory figure is the whole model's (parameters, buffers and the step's
peak); a ceiling that saw only the dense arch would be stricter than the figure it protects and
decline fusions the figure allows, and one that never reached ``optimus.optimize`` would leave the
figure unprotected. These tests read the config the optimizer was called with.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import optimus
from harness.modes import builtin, mode_registry
from models.synthetic_towers import Towers
from optimus.memory.live import MEMORY_CEILING


class _Model(nn.Module):
    """A dense arch beside an embedding table, as the harness's models are."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = Towers(n=4, width=8)
        self.table = nn.EmbeddingBag(100, 8)


def _called_with(monkeypatch: pytest.MonkeyPatch, mode: str, beside: Any) -> optimus.OptimusConfig:
    seen: list[optimus.OptimusConfig] = []
    real = optimus.optimize

    def spy(module: Any, inputs: Any, config: optimus.OptimusConfig, **kw: Any) -> Any:
        seen.append(config)
        return real(module, inputs, config=config, **kw)

    monkeypatch.setattr(optimus, "optimize", spy)
    torch.manual_seed(0)
    model = _Model().eval()
    x = torch.randn(16, 4 * 8)
    with torch.no_grad():
        mode_registry.prepare(mode, model.dense, (x,), beside=model if beside else None)
    (config,) = seen
    return config


def test_bytes_outside_are_the_model_s_tensors_the_dense_arch_does_not_hold() -> None:
    model = _Model()
    assert builtin.bytes_outside(model, model.dense) == 100 * 8 * 4
    assert builtin.bytes_outside(None, model.dense) == 0
    assert builtin.bytes_outside(model.dense, model.dense) == 0


@pytest.mark.parametrize("mode", ["eager+optimus", "compile+optimus"])
def test_optimus_modes_run_under_the_ceiling_with_the_table_counted(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    config = _called_with(monkeypatch, mode, beside=True)
    assert config.memory_ceiling == MEMORY_CEILING == 0.02
    assert config.memory_outside_bytes == 100 * 8 * 4
    assert config.layout.reuse_limit == 0  # type: ignore[attr-defined]
    assert builtin.settings().outside_bytes == 0  # not beyond the prepare


def test_without_the_model_nothing_outside_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _called_with(monkeypatch, "eager+optimus", beside=False).memory_outside_bytes == 0
