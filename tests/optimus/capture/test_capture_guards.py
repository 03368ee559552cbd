"""Capture skips Dynamo's static shape guards: the graph is the same, the patch never leaks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx.experimental import symbolic_shapes

from models.synthetic_towers import Towers
from optimus.capture import export as capture


def _export_plain(module: torch.nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    gm, _ = torch._dynamo.export(module, aten_graph=False, assume_static_by_default=True)(x)
    return gm


def test_capture_graph_equals_plain_export() -> None:
    torch.manual_seed(0)
    model = Towers(n=4, width=8, hidden=8)
    x = torch.randn(6, 4 * 8)
    plain = _export_plain(model, x)
    fast = capture.export(model, (x,))
    assert fast.code == plain.code
    torch.testing.assert_close(fast(x), plain(x), rtol=0, atol=0)


def test_static_guards_are_skipped_during_capture_only(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    original = symbolic_shapes.ShapeEnv.produce_guards_verbose

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("ignore_static"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(symbolic_shapes.ShapeEnv, "produce_guards_verbose", spy)
    model = Towers(n=2, width=4, hidden=4)
    x = torch.randn(3, 8)
    capture.export(model, (x,))
    assert seen and all(v is True for v in seen), seen
    assert symbolic_shapes.ShapeEnv.produce_guards_verbose is spy  # restored after the block

    seen.clear()
    _export_plain(model, x)  # outside the block export keeps its static guards
    assert seen and all(v is False for v in seen), seen


def test_patch_is_restored_when_the_block_raises() -> None:
    before = symbolic_shapes.ShapeEnv.produce_guards_verbose
    with pytest.raises(RuntimeError, match="boom"), capture.static_shape_guards_skipped():
        assert symbolic_shapes.ShapeEnv.produce_guards_verbose is not before
        raise RuntimeError("boom")
    assert symbolic_shapes.ShapeEnv.produce_guards_verbose is before
