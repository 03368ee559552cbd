"""Cost models that price for Inductor: ``inductor=True``, ``for_inductor``, and who sets it."""

from __future__ import annotations

import pytest

import optimus
from optimus.backend import OptimusPreGradPass
from optimus.cost.analytic import CPU, for_inductor
from optimus.cost.measured import MeasuredCostModel


def test_for_inductor_copies_the_builtin_models_and_keeps_their_settings() -> None:
    analytic = optimus.AnalyticCostModel(min_group=3, max_group=9)
    priced = for_inductor(analytic)
    assert priced.inductor is True and analytic.inductor is False  # a copy, the original unchanged
    assert (priced.min_group, priced.max_group) == (3, 9)
    measured = MeasuredCostModel(constants={"cpu": CPU})  # given constants: no calibration run
    assert for_inductor(measured).inductor is True
    assert for_inductor(measured).constants == {"cpu": CPU}
    assert for_inductor(priced) is priced


def test_for_inductor_leaves_a_custom_model_alone() -> None:
    class Custom:
        min_group, max_group = 2, 8

        def seconds(self, cost, device):  # type: ignore[no-untyped-def]
            return 0.0

    custom = Custom()
    assert for_inductor(custom) is custom


def test_inductor_flag_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="inductor must be a bool"):
        optimus.AnalyticCostModel(inductor="yes")  # type: ignore[arg-type]


def test_the_pre_grad_pass_and_the_backend_price_for_inductor() -> None:
    assert OptimusPreGradPass().config.cost_model.inductor is True
    # The config's fingerprint (the pass's cache key) says so too, so cached graphs priced for
    # eager are not reused.
    assert "inductor': True" in OptimusPreGradPass().config.fingerprint()
    assert optimus.OptimusConfig().cost_model.inductor is False  # optimize() prices for eager


def test_the_backend_prices_for_inductor_only_when_inductor_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import torch._inductor.compile_fx as compile_fx_mod
    from torch import fx

    import optimus.api

    seen: list[bool] = []
    real = optimus.api.optimize_graph_module

    def spy(gm, cfg, inputs):  # type: ignore[no-untyped-def]
        seen.append(cfg.cost_model.inductor)
        return real(gm, cfg, inputs)

    monkeypatch.setattr(optimus.api, "optimize_graph_module", spy)
    monkeypatch.setattr(compile_fx_mod, "compile_fx", lambda gm, inputs, **kw: gm.forward)
    gm = fx.symbolic_trace(torch.nn.Linear(4, 4))
    x = [torch.randn(2, 4)]
    optimus.backend()(gm, x)  # Inductor (stubbed here) compiles the result
    optimus.backend(inner=lambda g, i: g.forward)(fx.symbolic_trace(torch.nn.Linear(4, 4)), x)
    assert seen == [True, False]
