"""A call that differs from the example inputs (another Python scalar, another batch size,
other strides) gets the model's result, not the captured graph's: the
result re-optimizes for it, keeps that graph (bounded), and says so in the report."""

from __future__ import annotations

import copy

import pytest
import torch
from caller_world_models import CONFIGS, ScaledTowers, backward_grads

import optimus


def _optimized(config: str = "default", *scale: float) -> tuple[ScaledTowers, torch.fx.GraphModule]:
    torch.manual_seed(0)
    model = ScaledTowers()
    gm = optimus.optimize(model, (torch.randn(8, 256), *scale), config=CONFIGS[config])
    assert gm.optimus_report.rules_fired.get("batch_linear", 0) >= 1
    return model, gm


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_another_scalar_is_not_the_captured_one(config: str) -> None:
    model, gm = _optimized(config, 2.0)
    x = torch.randn(8, 256)
    torch.testing.assert_close(gm(x, 2.0), model(x, 2.0))
    torch.testing.assert_close(gm(x, 3.0), model(x, 3.0))
    torch.testing.assert_close(gm(x, scale=5.0), model(x, scale=5.0))
    torch.testing.assert_close(gm(x, 3), model(x, 3))  # an int is not the float 3.0 (promotion)
    assert "scale = float 2.0; got float 3.0" in gm.optimus_report.specializations[0]


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_another_batch_size_gets_the_right_shape_and_gradients(config: str) -> None:
    model, gm = _optimized(config)
    x = torch.randn(5, 256)
    assert gm(x).shape == model(x).shape == (10, 128)
    want = backward_grads(model, model, x)
    got = backward_grads(model, gm, x)
    assert all(g is not None for g in got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert "x = a float32 tensor of shape (8, 256)" in gm.optimus_report.specializations[0]
    assert "got a float32 tensor of shape (5, 256)" in gm.optimus_report.specializations[0]
    gm(torch.randn(5, 256))  # the same signature again: the kept graph, no new capture
    assert len(gm.optimus_specializations) == 1


def test_a_known_variant_is_called_without_the_slow_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Alternating batch sizes (an epoch's last, smaller batch): once its graph exists, a call
    goes straight to it; a train/eval switch is still another graph, never the known one."""
    from optimus.capture import specialized

    model, gm = _optimized("relayout")
    small = torch.randn(5, 256)
    gm(small)  # made here, through the dispatch
    dispatched: list[object] = []
    real = specialized._dispatch
    monkeypatch.setattr(specialized, "_dispatch", lambda *a: dispatched.append(a) or real(*a))
    for x in (small, torch.randn(8, 256), small):
        torch.testing.assert_close(gm(x), model(x))
    assert dispatched == [] and len(gm.optimus_specializations) == 1
    gm.eval()
    torch.testing.assert_close(gm(small), model(small))
    assert len(dispatched) == 1 and len(gm.optimus_specializations) == 2


def test_other_strides_are_another_signature() -> None:
    model, gm = _optimized("default", 2.0)
    x = torch.randn(256, 8).t()
    torch.testing.assert_close(gm(x, 2.0), model(x, 2.0))
    assert "stride (1, 8)" in gm.optimus_report.specializations[0]


def test_the_number_of_graphs_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the bound, calls that match no kept graph run the model eagerly (correct), once warned."""
    model, gm = _optimized("default", 2.0)
    x = torch.randn(8, 256)
    torch.testing.assert_close(gm(x, 3.0), model(x, 3.0))  # second graph: the last one kept
    from optimus.capture import specialized

    monkeypatch.setattr(specialized, "MAX_SPECIALIZATIONS", 2)
    with pytest.warns(UserWarning, match="running the original module eagerly"):
        torch.testing.assert_close(gm(x, 4.0), model(x, 4.0))
    torch.testing.assert_close(gm(x, 5.0), model(x, 5.0))
    assert len(gm.optimus_specializations) == 1


def test_compiled_optimized_module_checks_the_scalar() -> None:
    """torch.compile of the result: the check becomes Dynamo guards (a new scalar recompiles
    and re-optimizes outside the compiled graph)."""
    model, gm = _optimized("default", 2.0)
    compiled = torch.compile(gm, backend="eager", dynamic=False)
    x = torch.randn(8, 256)
    torch.testing.assert_close(compiled(x, 2.0), model(x, 2.0))
    torch.testing.assert_close(compiled(x, 3.0), model(x, 3.0))


@pytest.mark.compile
def test_optimus_backend_guards_scalars_and_shapes() -> None:
    """torch.compile(backend="optimus"): Dynamo's guards on the scalar and the shapes apply."""
    torch.manual_seed(0)
    model = ScaledTowers(n=2, width=4)
    compiled = torch.compile(model, backend="optimus", dynamic=False)
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x, 2.0), model(x, 2.0))
    torch.testing.assert_close(compiled(x, 3.0), model(x, 3.0))
    y = torch.randn(5, 8)
    torch.testing.assert_close(compiled(y, 3.0), model(y, 3.0))


def test_a_mode_switch_under_fullgraph_compile_names_the_cause() -> None:
    """Under ``torch.compile(fullgraph=True)`` a call after ``eval()`` needs a re-capture, which
    cannot be traced: the error is Optimus's one-line reason with the way out, not an internal
    helper's name. Without ``fullgraph`` the re-capture runs as a graph break and gives eager's
    result."""
    model, gm = _optimized("relayout")
    x = torch.randn(8, 256)
    torch._dynamo.reset()  # each optimized module is a type of its own: a fresh recompile budget
    strict = torch.compile(gm, backend="eager", fullgraph=True)
    strict(x)
    gm.eval()
    with pytest.raises(Exception, match=r"re-optimizes outside torch\.compile") as err:
        strict(x)
    assert "optimus.optimize again" in str(err.value) and "_sync_relayout" not in str(err.value)
    torch._dynamo.reset()
    loose = torch.compile(gm, backend="eager")
    torch.testing.assert_close(loose(x), model(x))


def test_many_optimized_modules_compile_in_one_process() -> None:
    """Dynamo counts compiled entries per code object against ``recompile_limit`` (8), and each
    optimized module is a class of its own: each has its own ``__call__`` code, so the ninth and
    later still compile under ``fullgraph=True`` (they failed with one shared ``__call__``)."""
    torch._dynamo.reset()
    limit = torch._dynamo.config.recompile_limit
    for _ in range(limit + 2):
        model, gm = _optimized()
        x = torch.randn(8, 256)
        compiled = torch.compile(gm, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
    for _ in range(limit + 2):  # deep copies are classes of their own too
        twin = copy.deepcopy(gm)
        compiled = torch.compile(twin, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
