"""Does the re-layout help under Inductor? Side by side, one process, interleaved rounds, on the
32-tower model: ``compile`` (Inductor on the model), ``compile+optimus`` (the ``"optimus"`` backend:
runtime-stacked weights, the re-layout declines there) and ``compile(optimize(relayout))``
(Optimus with RelayoutParams first, then Inductor on the returned GraphModule), and the same with
the default RuntimeStack layout (isolates the re-layout from "optimize, then compile"). Inference and a
training step (zero_grad, forward, backward, SGD). FX graph cache off; compile seconds reported.

    PYTHONPATH=. python scripts/compile_relayout.py [--towers 32 --width 16 --batch 64]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "optimus"))

from optimus_models import Towers

import optimus
from optimus.layout_relayout import RelayoutParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--family", default=None, help="a models.FAMILIES name: use its dense arch")
    parser.add_argument("--scale", default="small", help="with --family: the models scale preset")
    args = parser.parse_args()
    for name in ("towers", "width", "batch", "rounds", "iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    torch.set_num_threads(1)
    torch._inductor.config.fx_graph_cache = False
    torch.manual_seed(0)
    if args.family is None:
        base: nn.Module = Towers(args.towers, args.width, args.width)
        xs: tuple[torch.Tensor, ...] = (torch.randn(args.batch, args.towers * args.width),)
        what = f"towers={args.towers} width={args.width} batch={args.batch}"
    else:
        import models

        built = models.build(args.family, scale=args.scale, device="cpu", seed=0)
        base = built.module.dense
        with torch.no_grad():
            xs = tuple(t.detach() for t in built.dense_inputs(built.batches[0]))
        what = f"{args.family} {args.scale} dense arch, inputs {[tuple(t.shape) for t in xs]}"
    print(f"{what} loadavg={os.getloadavg()[0]:.2f}")
    print("| phase | mode | median us | IQR us | vs compile | compile s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for phase in ("infer", "train"):
        train = phase == "train"
        variants: dict[str, tuple[Callable[..., Any], nn.Module]] = {}
        compile_s: dict[str, float] = {}
        for mode in (
            "compile",
            "compile+optimus",
            "compile(optimize(runtime))",
            "compile(optimize(relayout))",
        ):
            torch._dynamo.reset()
            src = copy.deepcopy(base)
            if mode == "compile":
                fn: Callable[..., Any] = torch.compile(src)
            elif mode == "compile+optimus":
                fn = torch.compile(src, backend="optimus")
            elif mode == "compile(optimize(runtime))":
                fn = torch.compile(optimus.optimize(src, xs))
            else:
                cfg = optimus.OptimusConfig(layout=RelayoutParams())
                fn = torch.compile(optimus.optimize(src, xs, config=cfg))
            start = time.perf_counter()
            with torch.set_grad_enabled(train):
                out = fn(*xs)
                if train:
                    out.square().mean().backward()
            compile_s[mode] = time.perf_counter() - start
            variants[mode] = (fn, src)
        runs = {}
        for mode, (fn, src) in variants.items():
            opt = torch.optim.SGD(src.parameters(), lr=1e-3)

            def run(
                iters: int, fn: Callable[..., Any] = fn, opt: torch.optim.Optimizer = opt, train: bool = train
            ) -> float:
                start = time.perf_counter()
                for _ in range(iters):
                    if train:
                        opt.zero_grad(set_to_none=True)
                        fn(*xs).square().mean().backward()
                        opt.step()
                    else:
                        with torch.no_grad():
                            fn(*xs)
                return (time.perf_counter() - start) / iters

            run(2)
            runs[mode] = run
        samples: dict[str, list[float]] = {m: [] for m in runs}
        for _ in range(args.rounds):
            for mode, run in runs.items():
                samples[mode].append(run(args.iters) * 1e6)
        ref = statistics.median(samples["compile"])
        for mode, s in samples.items():
            q = statistics.quantiles(s, n=4)
            med = statistics.median(s)
            print(
                f"| {phase} | {mode} | {med:.1f} | {q[2] - q[0]:.1f} | {ref / med:.2f}x | {compile_s[mode]:.1f} |"
            )
        with torch.no_grad():
            want = variants["compile"][1](*xs)
            for mode, (fn, _src) in variants.items():
                err = (fn(*xs) - want).abs().max().item()
                if err > 1e-3:
                    raise SystemExit(f"{phase} {mode}: output differs by {err}")
    print(f"loadavg(end)={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
