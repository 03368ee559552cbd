"""The harness's CUDA paths: device selection, CUDA-event timing, ``max_memory_allocated`` peaks.

Two kinds of test. Those marked ``needs_cuda`` run on a host where torch sees a GPU (the lent
GPU machine: ``python3 -m pytest tests/harness/run/test_cuda_paths.py``) and are skipped elsewhere.
The rest run everywhere: the device-selection logic with ``torch.cuda.is_available`` patched,
and the CUDA branches of ``harness.measure.timing`` against stand-in events and memory counters, so a
CPU-only CI still fails if those branches stop reading the events or the peak counter.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import cli, env, exit_codes
from harness.measure import memory, timing
from harness.spec import RunConfig, resolve_device

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# -- device selection (everywhere) ------------------------------------------------------------


@pytest.mark.parametrize("available", [False, True])
def test_auto_picks_cuda_only_when_torch_sees_it(monkeypatch: pytest.MonkeyPatch, available: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    assert resolve_device("auto") == ("cuda" if available else "cpu")
    assert resolve_device("cpu") == "cpu"  # asked for: never switched to the GPU
    if available:
        assert resolve_device("cuda") == "cuda"


def test_cuda_without_a_device_is_one_line_naming_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as err:
        resolve_device("cuda")
    text = str(err.value)
    assert "\n" not in text and "'cuda' requested" in text and "--device cpu" in text
    with pytest.raises(ValueError, match="device: unknown 'gpu'; allowed values: cpu, cuda, auto"):
        resolve_device("gpu")


def test_run_with_cuda_but_none_exits_bad_input_before_any_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r.json"
    argv = ["run", "--provider", "models.dense_only:build", "--models", "towers", "--device", "cuda",
            "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == exit_codes.BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("optimus-bench run: error: device: 'cuda' requested")
    assert not out.exists()


def test_run_config_accepts_only_known_devices() -> None:
    with pytest.raises(ValueError, match="device: unknown 'auto'"):  # resolved by the CLI, never stored
        RunConfig(models=["towers"], device="auto", provider="models.dense_only:build").validate()


def test_git_sha_comes_from_the_environment_outside_git(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "_git", lambda *a: None)  # a tree copied without .git
    monkeypatch.delenv(env.GIT_SHA_ENV, raising=False)
    assert env.git_info() == {"sha": None, "dirty": None, "branch": None}
    monkeypatch.setenv(env.GIT_SHA_ENV, " 0123abc ")
    assert env.git_info() == {"sha": "0123abc", "dirty": None, "branch": None}


# -- the CUDA branches of harness.measure.timing against stand-ins (everywhere) --------------------


class FakeEvent:
    """A ``torch.cuda.Event`` stand-in: ``elapsed_time`` is a fixed 7.5 ms per pair, so a sample
    equal to it can only have come from the events (the wall clock would give microseconds)."""

    made: list[FakeEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.recorded = self.synced = False
        FakeEvent.made.append(self)

    def record(self) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        self.synced = True

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.recorded and end.recorded and end.synced  # read only once the end event is done
        return 7.5


def test_cuda_timing_reads_the_events_and_synchronizes(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeEvent.made = []
    syncs: list[float] = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(time.perf_counter()))
    steps: list[int] = []
    samples = timing.time_iterations(
        lambda: steps.append(1), warmup=2, min_iters=4, max_iters=4, budget_s=0.0, device="cuda"
    )
    assert samples == [7.5] * 4
    assert len(steps) == 6 and len(FakeEvent.made) == 8  # one begin/end pair per timed step
    assert len(syncs) == 1  # after the warm-up, so queued warm-up work is not timed
    assert timing.time_iterations(lambda: None, min_iters=2, max_iters=2, device="cpu") != [7.5] * 2


def test_cuda_peak_resets_then_reads_max_memory_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    state = {"allocated": 1000, "peak": 5000}

    def reset() -> None:
        calls.append("reset")
        state["peak"] = state["allocated"]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: state["peak"])

    def step() -> None:
        calls.append("step")
        state["peak"] = state["allocated"] + 300

    got = memory.step_peak_memory(step, "cuda", static_tensors=[torch.zeros(10)])
    assert calls == ["sync", "reset", "step", "sync"]
    assert got["peak_mem_bytes"] == 1300 and got["peak_mem_static_bytes"] == 1000
    assert got["peak_mem_step_bytes"] == 300 and got["peak_mem_method"] == "cuda.max_memory_allocated"
    assert got["peak_mem_at"] is None


# -- on a real GPU (skipped without one) --------------------------------------------------------


@needs_cuda
def test_real_events_time_gpu_work_not_the_launch() -> None:
    cycles = 10_000_000  # ~5 ms of GPU spin at ~2 GHz; the launch itself returns in microseconds
    busy = timing.time_iterations(
        lambda: torch.cuda._sleep(cycles), warmup=1, min_iters=5, max_iters=5, device="cuda"
    )
    idle = timing.time_iterations(lambda: None, warmup=1, min_iters=5, max_iters=5, device="cuda")
    assert min(busy) > 1.0 and min(busy) > 20 * max(max(idle), 1e-3)


@needs_cuda
def test_real_peak_sees_a_step_allocation() -> None:
    keep = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")  # live before the step: static
    nbytes = 64 << 20

    def step() -> Any:
        return torch.ones(nbytes, dtype=torch.uint8, device="cuda").sum()

    got = memory.step_peak_memory(step, "cuda", static_tensors=[keep])
    assert got["peak_mem_static_bytes"] >= keep.numel()
    assert got["peak_mem_step_bytes"] >= nbytes
    assert got["peak_mem_bytes"] == got["peak_mem_static_bytes"] + got["peak_mem_step_bytes"]
    del keep


@needs_cuda
def test_real_device_selection_and_env() -> None:
    assert resolve_device("auto") == "cuda" and resolve_device("cuda") == "cuda"
    e = env.collect_env("cuda")
    assert e["device"] == "cuda" and e["gpu"] == torch.cuda.get_device_name(0) and e["cuda"]


@needs_cuda
def test_a_harness_cell_on_cuda(tmp_path: Path) -> None:
    from harness.run.runner import run_suite
    from harness.store import results

    cfg = RunConfig(models=["towers"], scale="tiny", modes=["eager", "eager+optimus"], phases=["train"],
                    device="cuda", warmup=1, min_iters=3, max_iters=5, budget_s=0.05, timeout_s=300,
                    provider="models.dense_only:build").validate()  # fmt: skip
    run_suite(cfg, tmp_path / "r.json", progress=False)
    doc = results.load(tmp_path / "r.json")
    assert doc["env"]["gpu"] and len(doc["cells"]) == 2
    for c in doc["cells"]:
        assert c["status"] == "ok", c["error"]
        assert c["peak_mem_method"] == "cuda.max_memory_allocated" and c["peak_mem_bytes"] > 0
        assert c["latency_ms"]["n"] >= 3
