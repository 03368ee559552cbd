"""The measured guard on models where the analytic cost model's favourite rewrite loses on this
CPU, and on one where it wins: plain capture, the unguarded rewrite and the guarded one, side by
side in one process.

WHY a diagnostic and not a unit test: whether a rewrite is slower is a timing, which no unit test
may assert (tests/optimus/test_guard.py checks the guard's decisions with fake clocks). This
measures the acceptance figure: a guarded ``optimize`` ends no slower than plain capture, and its
report names what it rejected.

How: for each case and phase, three copies of the model are optimized (``rules=()``: the plain
capture; the re-layout without the guard; the re-layout with ``guard="rules"``), then timed in
interleaved rounds (the three arms in a rotating order each round, a block of at least
``--block-ms`` each, 1 thread). Per round, the ratios plain / arm are the speedups; the table
gives their medians with 95% bootstrap intervals (``harness.stats.bootstrap_median``). Training
steps set gradients to None, run the forward and the backward of the outputs' sum.

    python -m harness.diagnose.guard_check [--rounds 15] [--block-ms 20] [--cases NAME,...]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import optimus
from harness.stats import bootstrap_median
from models.synthetic_towers import Towers

# name -> (model, example inputs): the first two are written so that the analytic model's
# favourite rewrite (batch_linear over the pieces of one wide input: a stack copies the whole
# input before one batched GEMM of the same work) is slower here; the last one is the launch-bound
# case the rules are for, where the guard must keep the rewrite.
CASES: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "wide-towers-8x256-b1024": lambda: (Towers(8, 256), (torch.randn(1024, 8 * 256),)),
    "wide-towers-4x512-b512": lambda: (Towers(4, 512), (torch.randn(512, 4 * 512),)),
    "narrow-towers-16x16-b32": lambda: (Towers(16, 16), (torch.randn(32, 16 * 16),)),
}
PHASES = ("infer", "train")


def _step(module: Any, inputs: tuple[torch.Tensor, ...], train: bool) -> Callable[[], object]:
    params = [p for p in module.parameters() if p.requires_grad]

    def infer() -> object:
        with torch.no_grad():
            return module(*inputs)

    def step() -> object:
        for p in params:
            p.grad = None
        out = module(*inputs)
        out.sum().backward()
        return out

    return step if train else infer


def _block(step: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    return time.perf_counter() - t0


def check(name: str, phase: str, rounds: int, block_s: float) -> dict[str, Any]:
    """One case in one phase: the figures of one row (see the module docstring)."""
    torch.manual_seed(0)
    model, inputs = CASES[name]()
    train = phase == "train"
    model.train(train)
    relayout = optimus.OptimusConfig(layout=optimus.RelayoutParams())
    arms: dict[str, Any] = {
        "plain": optimus.optimize(copy.deepcopy(model), inputs, rules=()),
        "unguarded": optimus.optimize(copy.deepcopy(model), inputs, config=relayout),
        "guarded": optimus.optimize(copy.deepcopy(model), inputs, config=relayout.with_(guard="rules")),
    }
    steps = {arm: _step(gm, inputs, train) for arm, gm in arms.items()}
    for step in steps.values():
        step()
        step()
    calls = max(1, round(block_s / max(min(_block(s, 1) for s in steps.values()), 1e-9)))
    ratios: dict[str, list[float]] = {"unguarded": [], "guarded": []}
    order = list(steps)
    for r in range(rounds):
        rotated = order[r % 3 :] + order[: r % 3]
        seconds = {arm: _block(steps[arm], calls) for arm in rotated}
        for arm in ratios:
            ratios[arm].append(seconds["plain"] / seconds[arm])
    report = arms["guarded"].optimus_report
    row: dict[str, Any] = {
        "case": name,
        "phase": phase,
        "fired": dict(arms["unguarded"].optimus_report.rules_fired),
        "guard": report.guard,
        "rejected": dict(report.guard_rejected),
        "guard_s": report.guard_seconds,
        # a rejection returns the plain capture itself: the same generated code
        "same_as_plain": arms["guarded"].code == arms["plain"].code,
        "rounds": rounds,
        "calls": calls,
    }
    for arm, values in ratios.items():
        low, high = bootstrap_median(values)
        row[arm] = (statistics.median(values), low, high)
    return row


def _fmt(figure: tuple[float, float, float]) -> str:
    return f"{figure[0]:.3f}x ({figure[1]:.3f}-{figure[2]:.3f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.diagnose.guard_check", description=__doc__.splitlines()[0]
    )
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default: 15)")
    p.add_argument(
        "--block-ms", type=float, default=20.0, help="least length of one timed block, ms (default: 20)"
    )
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {'; '.join(CASES)}")
    p.add_argument("--phases", default=",".join(PHASES), help="infer,train (default: both)")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES] + [ph for ph in args.phases.split(",") if ph not in PHASES]
    if unknown or args.rounds < 3:
        p.error(f"unknown case or phase {unknown}, or --rounds below 3")
    torch.set_num_threads(1)
    print(
        "| model | phase | rules fired (unguarded) | unguarded vs plain | guard | guarded vs plain "
        "| guarded code = plain's | rejected |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in cases:
        for phase in args.phases.split(","):
            row = check(name, phase, args.rounds, args.block_ms / 1000)
            fired = ", ".join(f"{k} {v}" for k, v in sorted(row["fired"].items())) or "none"
            rejected = ", ".join(f"{k} {v}" for k, v in sorted(row["rejected"].items())) or "-"
            print(
                f"| {name} | {phase} | {fired} | {_fmt(row['unguarded'])} | {row['guard']} "
                f"({row['guard_s']:.2f} s) | {_fmt(row['guarded'])} | {row['same_as_plain']} | {rejected} |",
                flush=True,
            )
    print(
        f"\nmedians of per-round paired ratios over {args.rounds} interleaved rounds, 95% bootstrap intervals; 1 thread"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
