"""eager+optimus runs Optimus's measured guard by default, ``run --optimus-guard`` reaches it,
and the cell records its verdict.

WHY: a harness default that did not reach ``optimus.optimize`` would report rewrites the guard
never judged; these tests read the optimizer's own report. The verdict itself depends on
timing, so they check that a verdict was reached and recorded, not which one (the verdicts are
tested with fake clocks in tests/optimus/test_guard.py).
"""

from __future__ import annotations

import pytest
import torch

import optimus.config
from harness import spec
from harness.modes import builtin, mode_registry
from harness.spec import RunConfig
from models.synthetic_towers import Towers

VERDICTS = ("kept", "rejected", "not run: nothing was rewritten")


def _prepare(mode: str) -> builtin.Prepared:
    torch.manual_seed(0)
    return mode_registry.prepare(mode, Towers(n=8, width=16).eval(), (torch.randn(64, 8 * 16),))


def test_eager_optimus_guards_by_default_and_records_the_verdict() -> None:
    with builtin.optimus_guard(None):  # the harness default (the test conftest pins it off)
        prepared = _prepare("eager+optimus")
    (report,) = prepared.reports
    assert report.guard in VERDICTS or report.guard.startswith("kept without ")
    assert prepared.info["optimus_guard"] == report.guard
    if report.guard_trials:
        whole = report.guard_trials[0]
        assert prepared.info["guard_speedup"] == whole.speedup
        assert prepared.info["guard_interval"] == [whole.low, whole.high]
        assert whole.low <= whole.speedup <= whole.high
    assert prepared.info["guard_s"] == report.guard_seconds > 0
    assert report.seconds >= report.guard_seconds


def test_the_guard_setting_reaches_optimize_and_ends_with_its_block() -> None:
    with builtin.optimus_guard("off"):
        prepared = _prepare("eager+optimus")
    assert prepared.reports[0].guard == "off" and "optimus_guard" not in prepared.info
    assert builtin.settings().guard == "off"  # this test file's own pin (conftest) is back
    with builtin.optimus_guard(None):  # each mode's default
        assert builtin.guard_for(compiled=False) == "rules"
        assert builtin.guard_for(compiled=True) == "off"
    with builtin.optimus_guard("graph"):  # given: both modes
        assert builtin.guard_for(compiled=False) == builtin.guard_for(compiled=True) == "graph"


@pytest.mark.compile
def test_compile_optimus_guards_what_inductor_makes_only_when_asked() -> None:
    with builtin.optimus_guard(None):
        assert _prepare("compile+optimus").reports[0].guard == "off"
    with builtin.optimus_guard("graph"):
        prepared = _prepare("compile+optimus")
    (report,) = prepared.reports
    assert report.guard in VERDICTS
    assert prepared.info["optimus_guard"] == report.guard
    x = torch.randn(64, 8 * 16)
    with torch.no_grad():
        torch.testing.assert_close(prepared.module(x), _prepare("eager").module(x), rtol=1e-4, atol=1e-5)


def test_bad_guard_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="optimus_guard"):
        RunConfig(["towers"], "tiny", ["eager+optimus"], ["infer"], optimus_guard="on").validate()
    with pytest.raises(ValueError, match="optimus guard"), builtin.optimus_guard("sometimes"):
        pass


def test_the_harness_knows_optimus_guard_modes() -> None:
    assert spec.OPTIMUS_GUARDS == optimus.config.GUARD_MODES


def test_ab_workers_read_the_guard_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ab --optimus-guard`` reaches its worker processes (of any checkout) through GUARD_ENV."""
    import argparse

    from harness.cli import ab

    p = argparse.ArgumentParser()
    ab.add_arguments(p)
    assert p.parse_args(["--model", "towers", "--optimus-guard", "graph"]).optimus_guard == "graph"
    monkeypatch.setenv(builtin.GUARD_ENV, "graph")
    with builtin.optimus_guard(None):
        assert builtin.guard_for(compiled=True) == builtin.guard_for(compiled=False) == "graph"
        monkeypatch.setenv(builtin.GUARD_ENV, "sometimes")
        with pytest.raises(ValueError, match=builtin.GUARD_ENV):
            builtin.guard_for(compiled=False)
    with builtin.optimus_guard("off"):  # run's own setting wins
        assert builtin.guard_for(compiled=False) == "off"
