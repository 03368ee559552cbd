"""Side by side, one process: the 32-tower model (Linear -> LayerNorm -> tanh over a split input)
under eager, eager+optimus, compile, compile+peer (Inductor's own batch fusions via
``pre_grad_fusion_options``) and compile+optimus. Prints a markdown table of FX node counts and
inference latency (median and IQR in microseconds, interleaved rounds so machine noise hits every
mode alike) and writes it as JSON (atomically) if ``--out`` is given.

    PYTHONPATH=. python scripts/towers_vs_peer.py [--towers 32 --width 16 --batch 64 --rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "optimus"))

from optimus_models import Towers

import optimus
from optimus.backend import LAST_REPORTS

PEER_OPTIONS: dict[str, dict[str, Any]] = {
    "normalization_pass": {},
    "batch_linear": {},
    "batch_layernorm": {},
    "batch_tanh": {},
}


class CountNodes(torch._inductor.custom_graph_pass.CustomGraphPass):
    """A pre-grad custom pass that only records the node count (it runs after the peer's passes)."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def __call__(self, graph: fx.Graph) -> None:
        self.counts.append(len(graph.nodes))

    def uuid(self) -> str:
        return "count-nodes"


def compile_mode(mod: nn.Module, x: torch.Tensor, mode: str) -> tuple[Callable[..., Any], int, float]:
    """(callable, FX nodes Inductor's pre-grad passes hand on, compile seconds)."""
    torch._dynamo.reset()
    counter = CountNodes()
    patches: dict[str, Any] = {"pre_grad_custom_pass": counter, "fx_graph_cache": False}
    if mode == "compile+peer":
        patches["pre_grad_fusion_options"] = PEER_OPTIONS
    with torch._inductor.config.patch(patches):
        fn = torch.compile(mod, backend="optimus" if mode == "compile+optimus" else "inductor")
        start = time.perf_counter()
        with torch.no_grad():
            fn(x)
        seconds = time.perf_counter() - start
    nodes = counter.counts[-1] if counter.counts else -1
    if mode == "compile+optimus":
        nodes = LAST_REPORTS[-1].nodes_after  # the graph Optimus hands to Inductor
    return fn, nodes, seconds


def dynamo_nodes(mod: nn.Module, x: torch.Tensor) -> int:
    gm, _ = torch._dynamo.export(mod, assume_static_by_default=True)(x)
    return len(gm.graph.nodes)


def time_calls(fn: Callable[..., Any], x: torch.Tensor, iters: int) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(iters):
            fn(x)
        return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per mode")
    parser.add_argument("--iters", type=int, default=50, help="calls per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    for name in ("towers", "width", "hidden", "batch", "rounds", "iters", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    mod = Towers(args.towers, args.width, args.hidden).eval()
    x = torch.randn(args.batch, args.towers * args.width)
    with torch.no_grad():
        want = mod(x)

    fns: dict[str, Callable[..., Any]] = {"eager": mod}
    nodes: dict[str, int] = {"eager": dynamo_nodes(mod, x)}
    compile_s: dict[str, float] = {}
    opt = optimus.optimize(mod, (x,))
    fns["eager+optimus"] = opt
    nodes["eager+optimus"] = opt.optimus_report.nodes_after
    for mode in ("compile", "compile+peer", "compile+optimus"):
        fns[mode], nodes[mode], compile_s[mode] = compile_mode(mod, x, mode)
    errors = {}
    with torch.no_grad():
        for mode, fn in fns.items():
            errors[mode] = (fn(x) - want).abs().max().item()
            time_calls(fn, x, 5)  # warm up
    samples: dict[str, list[float]] = {m: [] for m in fns}
    for _ in range(args.rounds):
        for mode, fn in fns.items():
            samples[mode].append(time_calls(fn, x, args.iters) * 1e6)

    def q(values: list[float]) -> tuple[float, float]:
        quart = statistics.quantiles(values, n=4)
        return statistics.median(values), quart[2] - quart[0]

    rows = []
    base = {"eager": q(samples["eager"])[0], "compile": q(samples["compile"])[0]}
    for mode in fns:
        med, iqr = q(samples[mode])
        ref = base["compile" if mode.startswith("compile") else "eager"]
        rows.append(
            {
                "mode": mode,
                "fx_nodes": nodes[mode],
                "median_us": med,
                "iqr_us": iqr,
                "speedup": ref / med,
                "compile_s": compile_s.get(mode),
                "max_abs_err": errors[mode],
            }
        )
    print(
        f"towers={args.towers} width={args.width} hidden={args.hidden} batch={args.batch} "
        f"threads={args.threads} rounds={args.rounds}x{args.iters} torch={torch.__version__}"
    )
    print(f"optimus report (eager+optimus): {opt.optimus_report.rules_fired}")
    print("| mode | FX nodes | latency median (us) | IQR (us) | vs eager/compile | compile s | max abs err |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        cs = f"{r['compile_s']:.1f}" if r["compile_s"] is not None else "-"
        print(
            f"| {r['mode']} | {r['fx_nodes']} | {r['median_us']:.1f} | {r['iqr_us']:.1f} | "
            f"{r['speedup']:.2f}x | {cs} | {r['max_abs_err']:.1e} |"
        )
    if args.out:
        payload = {"args": vars(args), "torch": torch.__version__, "rows": rows, "samples_us": samples}
        directory = os.path.dirname(os.path.abspath(args.out))
        with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as fh:
            json.dump(payload, fh, indent=1)
        os.replace(fh.name, args.out)


if __name__ == "__main__":
    main()
