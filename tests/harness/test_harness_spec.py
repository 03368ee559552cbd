"""Run configuration: bad input fails with the field name and the allowed values."""

from __future__ import annotations

import pytest

from harness.spec import MODES, RunConfig, parse_list

FAKES = "tests.harness.fakes:build"


def test_parse_list() -> None:
    assert parse_list("compile, eager,compile", "modes", MODES) == ["compile", "eager"]
    with pytest.raises(ValueError, match=r"modes: unknown 'jit'; allowed values: eager, eager\+optimus"):
        parse_list("eager,jit", "modes", MODES)
    with pytest.raises(ValueError, match="modes: empty"):
        parse_list(",", "modes", MODES)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"models": ["nope"]}, r"models: unknown 'nope'; allowed values: mlp, towers"),
        ({"scale": "huge"}, r"scale: unknown 'huge'; allowed values: tiny, small"),
        ({"phases": ["eval"]}, r"phases: unknown 'eval'; allowed values: infer, train"),
        ({"device": "tpu"}, r"device: unknown 'tpu'"),
        ({"min_iters": 0}, "min_iters: must be >= 1"),
        ({"max_iters": 2, "min_iters": 5}, r"max_iters: must be >= min_iters \(5\)"),
        ({"budget_s": -1.0}, "budget_s: must be a finite number >= 0"),
        ({"provider": "nocolon"}, "provider: expected 'package.module:function'"),
        ({"memory_margin": -0.5}, "memory_margin: must be a finite number >= 0"),
        ({"memory_margin": float("nan")}, "memory_margin: must be a finite number >= 0"),
    ],
)
def test_config_errors(kw: dict, message: str) -> None:
    args = {"models": ["mlp"], "provider": FAKES, **kw}
    with pytest.raises(ValueError, match=message):
        RunConfig(**args).validate()


def test_cells_order_keeps_modes_of_one_model_and_phase_together() -> None:
    cfg = RunConfig(
        models=["mlp", "towers"], modes=["eager", "compile"], phases=["infer"], provider=FAKES
    ).validate()
    assert [(c.model, c.mode) for c in cfg.cells()] == [
        ("mlp", "eager"), ("mlp", "compile"), ("towers", "eager"), ("towers", "compile"),
    ]  # fmt: skip
