"""Is the one-time re-layout worth it on a whole model? Side by side, one process, interleaved rounds:
the 32-tower model (tests/optimus/optimus_models.Towers) eager, ``optimus.optimize`` with the default
RuntimeStack layout, and with RelayoutParams; inference (no_grad forward) and a training step
(zero_grad(set_to_none) + forward + backward + SGD step). Prints medians and IQR in microseconds and
ratios to eager; checks the three agree (outputs, and parameters after the training steps).

    PYTHONPATH=. python scripts/relayout_vs_runtime.py [--towers 32 --width 16 --batch 64]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "optimus"))

from optimus_models import Towers

import optimus
from optimus.layout_relayout import RelayoutParams


def step_fn(model: nn.Module, params: nn.Module, x: torch.Tensor, train: bool) -> Callable[[int], float]:
    opt = torch.optim.SGD(params.parameters(), lr=1e-3)

    def run(iters: int) -> float:
        start = time.perf_counter()
        if not train:
            with torch.no_grad():
                for _ in range(iters):
                    model(x)
        else:
            for _ in range(iters):
                opt.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                opt.step()
        return (time.perf_counter() - start) / iters

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    for name in ("towers", "width", "batch", "rounds", "iters", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = Towers(args.towers, args.width, args.width)
    x = torch.randn(args.batch, args.towers * args.width)
    eager = copy.deepcopy(base)
    rt_src, rl_src = copy.deepcopy(base), copy.deepcopy(base)
    runtime = optimus.optimize(rt_src, (x,))
    relayout = optimus.optimize(rl_src, (x,), config=optimus.OptimusConfig(layout=RelayoutParams()))
    models = {"eager": (eager, eager), "runtime": (runtime, rt_src), "relayout": (relayout, rl_src)}
    load = os.getloadavg()[0]
    print(
        f"towers={args.towers} width={args.width} batch={args.batch} threads={args.threads} "
        f"rounds={args.rounds}x{args.iters} torch={torch.__version__} loadavg(start)={load:.2f}"
    )
    print(
        f"rules fired: runtime {runtime.optimus_report.rules_fired} relayout {relayout.optimus_report.rules_fired}"
    )
    print("| phase | variant | median us | IQR us | vs eager |")
    print("| --- | --- | --- | --- | --- |")
    for phase in ("infer", "train"):
        fns = {k: step_fn(m, p, x, phase == "train") for k, (m, p) in models.items()}
        for fn in fns.values():
            fn(2)
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, fn in fns.items():
                samples[k].append(fn(args.iters) * 1e6)
        ref = statistics.median(samples["eager"])
        for k, s in samples.items():
            quart = statistics.quantiles(s, n=4)
            med = statistics.median(s)
            print(f"| {phase} | {k} | {med:.1f} | {quart[2] - quart[0]:.1f} | {ref / med:.2f}x |")
    # every variant took the same training steps from the same start: same parameters and outputs
    with torch.no_grad():
        want = eager(x)
        for k, (m, p) in models.items():
            err = (m(x) - want).abs().max().item()
            perr = max(
                (a - b).abs().max().item() for a, b in zip(p.parameters(), eager.parameters(), strict=True)
            )
            print(f"{k}: max abs err output {err:.1e}, parameters after training {perr:.1e}")
            if err > 1e-3 or perr > 1e-3:
                raise SystemExit(f"{k} diverged from eager")
    print(f"loadavg(end)={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
