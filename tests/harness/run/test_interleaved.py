"""optimus-bench ab: modes timed side by side in one process, round by round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli
from harness.measure import timing
from harness.modes import builtin, mode_registry
from harness.run import interleaved
from harness.spec import DEFAULT_PROVIDER


class FakeClock:
    """A clock that each fake step advances: mode cost x a load factor that drifts per round."""

    def __init__(self) -> None:
        self.t = 0.0
        self.load = 1.0

    def __call__(self) -> float:
        return self.t


def fake(mode: str, ms: float, clock: FakeClock, calls: list[str]) -> timing.Contender:
    def step() -> None:
        calls.append(mode)
        clock.t += ms * clock.load / 1e3

    return timing.Contender(mode, step, 0.0, None)


def test_paired_rounds_cancel_a_drift_that_unpaired_medians_would_carry() -> None:
    clock, calls = FakeClock(), []
    a, b = fake("compile", 10.0, clock, calls), fake("compile+optimus", 8.0, clock, calls)

    def drift(r: int) -> None:
        clock.load = 1.0 + 0.5 * r  # the machine gets slower every round

    samples = timing.interleave([a, b], rounds=6, steps=2, warmup=1, clock=clock, progress=drift)
    assert calls[:2] == ["compile", "compile+optimus"]  # warm-up, then rounds
    rounds = calls[2:]
    assert rounds[:4] == ["compile"] * 2 + ["compile+optimus"] * 2  # round 0: as given
    assert rounds[4:8] == ["compile+optimus"] * 2 + ["compile"] * 2  # round 1: reversed
    assert len(samples["compile"]) == len(samples["compile+optimus"]) == 6
    rows = interleaved.summarize(samples, "compile")
    assert rows["compile+optimus"]["speedup_vs_base"] == pytest.approx(1.25)
    lo, hi = rows["compile+optimus"]["speedup_ci95"]
    assert lo == pytest.approx(1.25) and hi == pytest.approx(1.25)
    assert rows["compile"]["iqr_ms"] > 0  # the drift is there; the paired ratio does not see it


def test_summarize_names_a_missing_base() -> None:
    with pytest.raises(ValueError, match="'eager' is not among the modes timed"):
        interleaved.summarize({"compile": [1.0]}, "eager")


@pytest.fixture(autouse=True)
def _keep_this_process_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """ab is a command with a process of its own; in pytest keep the caches and threads as they are."""
    monkeypatch.setattr(builtin, "disable_compile_caches", lambda: None)


def test_run_ab_on_a_tiny_model(tmp_path: Path) -> None:
    doc = interleaved.run_ab(
        "towers", "tiny", "infer", ["eager", "eager+optimus"], rounds=3, steps=1, warmup=1, threads=0,
        provider=DEFAULT_PROVIDER, log=lambda m: None,
    )  # fmt: skip
    assert doc["base"] == "eager" and set(doc["modes"]) == {"eager", "eager+optimus"}
    row = doc["modes"]["eager+optimus"]
    assert row["parity_vs_base"]["ok"] is True
    assert len(row["rounds_ms"]) == 3 and row["speedup_vs_base"] > 0
    assert "| eager+optimus |" in interleaved.format_ab(doc)
    assert (
        "One worker process a mode: the interval covers the rounds, not the compiles"
        in interleaved.format_ab(doc)
    )


def test_the_table_says_how_far_each_modes_processes_differ() -> None:
    row = {"median_ms": 2.0, "iqr_ms": 0.1, "first_call_s": 1.0}
    doc = {
        "model": "m", "scale": "small", "phase": "train", "base": "compile",
        "config": {"rounds": 5, "steps": 2, "processes": 2},
        "modes": {
            "compile": {**row, "process_spread": 0.021},
            "compile+optimus": {**row, "process_spread": 0.137, "speedup_vs_base": 1.0, "speedup_ci95": (0.9, 1.1),
                                "parity_vs_base": {"ok": True, "max_abs_err": 0.0}},
        },
    }  # fmt: skip
    text = interleaved.format_ab(doc)
    assert "2 worker process(es) per mode" in text
    assert text.endswith(
        "Processes of a mode apart (slowest over fastest): compile 2.1%, compile+optimus 13.7%."
    )


def test_cli_ab_writes_json_and_checks_its_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ab.json"
    argv = [
        "ab",
        "--model",
        "towers",
        "--modes",
        "eager,eager+optimus",
        "--rounds",
        "2",
        "--steps",
        "1",
        "--threads",
        "0",
    ]
    assert cli.main([*argv, "--phase", "train", "--out", str(out), "--device", "cpu"]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "optimus-bench-ab" and doc["phase"] == "train"
    assert len(doc["env"]["git"]["sha"]) == 40  # which commit was measured
    assert cli.main(["ab", "--model", "towers", "--modes", "eager,warp"]) == 2
    assert "modes: unknown ['warp']" in capsys.readouterr().err
    assert cli.main(["ab", "--model", "towers", "--modes", "eager"]) == 2
    assert "need two or more distinct modes" in capsys.readouterr().err
    assert cli.main(["ab", "--model", "towers", "--modes", "eager,compile", "--rounds", "0"]) == 2


def test_the_peer_options_are_restored_after_its_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.config as inductor_config

    real = mode_registry.prepare

    def prepare(mode, dense, example, beside=None):  # type: ignore[no-untyped-def]
        inductor_config.pre_grad_fusion_options = {"batch_linear": {}}  # what the peer mode does
        return real("eager", dense, example)

    monkeypatch.setattr(mode_registry, "prepare", prepare)
    before = dict(inductor_config.pre_grad_fusion_options)
    interleaved.contender(
        "towers", "tiny", "compile+peer", "infer", device="cpu", seed=0, provider=DEFAULT_PROVIDER
    )
    assert dict(inductor_config.pre_grad_fusion_options) == before
