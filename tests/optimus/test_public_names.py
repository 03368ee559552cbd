"""What a user writes imports from the package's top, and the old flat paths still work, warning.

WHY: the package's layers may move between releases; a user's code and our docs name only
``optimus.X``. The paths the docs named before the package was layered keep working for one
release, each with a ``DeprecationWarning`` that says what to import instead.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import optimus

PUBLIC = {
    "optimize": "optimus.api",
    "optimize_graph_module": "optimus.api",
    "backend": "optimus.backend",
    "OptimusPreGradPass": "optimus.backend",
    "OptimusConfig": "optimus.config",
    "RelayoutParams": "optimus.params.relayout",
    "retained_gradient_buffers": "optimus.params.relayout",
    "RuntimeStack": "optimus.engine.param_layout",
    "ParamLayout": "optimus.engine.param_layout",
    "AnalyticCostModel": "optimus.cost.analytic",
    "CostModel": "optimus.cost.analytic",
    "DeviceConstants": "optimus.cost.analytic",
    "MeasuredCostModel": "optimus.cost.measured",
    "OptimusReport": "optimus.report",
    "RoundRecord": "optimus.report",
    "StopReason": "optimus.report",
    "StopKind": "optimus.report",
    "dry_run": "optimus.dry_run",
    "DryRun": "optimus.dry_run",
    "PlannedRewrite": "optimus.dry_run",
    "Member": "optimus.dry_run",
    "TensorInfo": "optimus.dry_run",
    "capture_graph": "optimus.dry_run",
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_name_at_the_top(name: str) -> None:
    assert name in optimus.__all__
    assert getattr(optimus, name) is getattr(importlib.import_module(PUBLIC[name]), name)


def test_device_constants_rules_and_instances_at_the_top() -> None:
    from optimus.cost import analytic

    assert optimus.CPU is analytic.CPU and optimus.CUDA is analytic.CUDA
    assert tuple(optimus.rules.REGISTRY) == optimus.RULES
    assert "batch_linear" in optimus.rules.REGISTRY
    assert isinstance(optimus.pre_grad_pass, optimus.OptimusPreGradPass)
    assert set(optimus.__all__) <= set(dir(optimus))


# (old import, name, the replacement the warning must name)
DEPRECATED = [
    ("optimus.layout_relayout", "RelayoutParams", "optimus.RelayoutParams"),
    ("optimus.layout_relayout", "retained_gradient_buffers", "optimus.retained_gradient_buffers"),
    ("optimus.layout", "RuntimeStack", "optimus.RuntimeStack"),
    ("optimus.cost_measured", "MeasuredCostModel", "optimus.MeasuredCostModel"),
    ("optimus.stop_reason", "StopReason", "optimus.StopReason"),
    ("optimus.cost", "CUDA", "optimus.CUDA"),
    ("optimus.cost", "AnalyticCostModel", "optimus.AnalyticCostModel"),
    ("optimus.cost", "for_inductor", "optimus.cost.analytic.for_inductor"),
    ("optimus.memory", "estimate", "optimus.memory.live.estimate"),
    ("optimus.capture", "static_shape_guards_skipped", "optimus.capture.export.static_shape_guards_skipped"),
    ("optimus.specialized", "MAX_SPECIALIZATIONS", "optimus.capture.specialized.MAX_SPECIALIZATIONS"),
    ("optimus.builder", "Builder", "optimus.engine.builder.Builder"),
    ("optimus.meta", "in_autocast", "optimus.semantics.meta.in_autocast"),
    ("optimus.checkpoint_rng", "checkpointed", "optimus.capture.checkpoint_rng.checkpointed"),
    ("optimus.relayout_contract", "sync", "optimus.params.contract.sync"),
    ("optimus.rules.base", "HorizontalRule", "optimus.engine.rule.HorizontalRule"),
    ("optimus.rules.base", "Cost", "optimus.engine.rule.Cost"),
]


@pytest.mark.parametrize(("old", "name", "new"), DEPRECATED)
def test_old_path_works_and_warns(old: str, name: str, new: str) -> None:
    if old in optimus._moved.MODULES:  # a forwarding module warns when it is first imported
        sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
        value = getattr(module, name)
    new_module, new_name = new.rsplit(".", 1)
    assert value is getattr(importlib.import_module(new_module), new_name)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(f"import {new} instead" in m for m in messages), messages


def test_unknown_names_of_old_paths_still_raise() -> None:
    with pytest.raises(AttributeError):
        optimus.cost.no_such_name  # noqa: B018
    module = importlib.import_module("optimus.layout_relayout")
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018
