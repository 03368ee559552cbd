# mypy: disable-error-code="operator,misc,union-attr,index"
# (nn.ModuleList items and .grad are typed loosely by torch; the checks here are runtime ones.)
"""Headroom micro-benchmark: one fused tower group (G x Linear(K -> N) over [B, K]), four ways,
timed side by side in ONE process with interleaved rounds (machine noise hits every variant alike):

  (a) separate   G F.linear calls (the unfused model)
  (b) runtime    our batched op as ``batch_linear`` emits it with the default RuntimeStack layout
                 (stack of transposed weights + stacked bias + baddbmm, every call)
  (c) ideal      one baddbmm on pre-stacked contiguous [G, B, K] x [G, K, N] weights
  (d) relayout   our batched op with the one-time parameter re-layout (RelayoutParams)

(b) and (d) are the GraphModules ``optimus.optimize`` returns (rules: batch_linear only), so the
benchmark measures exactly what the optimizer emits. Phases: ``fwd`` (no_grad) and ``fwd+bwd``
(grads set to None, forward, backward with ones). Prints medians and IQR (microseconds per call),
ratios to (a) and b/c, d/c as "speed vs ideal" (ideal_time / time; the issue's target is >= 0.80).

    optimus-bench headroom [--groups 32,64 --batch 64 --k 16 --n 16] [--out FILE.json]

(Until this commit it was ``scripts/bench_fused_linear.py``, the same code and options.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import optimus
from harness.measure import timing
from models.synthetic_towers import Towers
from optimus.params.relayout import RelayoutParams

VARIANTS = ("separate", "runtime", "ideal", "relayout")


def tower_group(g: int, k: int, n: int) -> Towers:
    """G independent linears over the G slices of a [G, B, K] input (``x.unbind(0)``), outputs as
    a tuple: the shared synthetic towers model (models/synthetic_towers.py) in that configuration."""
    return Towers(g, k, n, slices="unbind", body=("linear",), join="tuple")


class Ideal(nn.Module):
    """The ideal kernel: weights already stacked, contiguous, in the layout baddbmm wants."""

    def __init__(self, src: Towers) -> None:
        super().__init__()
        with torch.no_grad():
            self.w = nn.Parameter(torch.stack([lin.weight.t() for lin in src.linears]).contiguous())
            self.b = nn.Parameter(torch.stack([lin.bias for lin in src.linears]).unsqueeze(1).contiguous())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.baddbmm(self.b, x, self.w).unbind(0)


def build(
    g: int, k: int, n: int, batch: int = 2, seed: int = 0
) -> dict[str, tuple[nn.Module, list[nn.Parameter]]]:
    """The four variants, each with the parameters whose grads it produces (same values).

    ``batch``: the batch the optimized variants are captured for; measure with the same one.
    Why: ``optimize`` specializes its graph to the captured shapes, and a call with another
    batch takes the re-specialized slow path (optimus/capture/specialized.py), which is not what this
    benchmark prices (until 2026-12-05 it captured at batch 2 and timed batch 64)."""
    torch.manual_seed(seed)
    base = tower_group(g, k, n)
    x = torch.randn(g, batch, k)
    out: dict[str, tuple[nn.Module, list[nn.Parameter]]] = {"separate": (base, list(base.parameters()))}
    runtime_src = tower_group(g, k, n)
    runtime_src.load_state_dict(base.state_dict())
    runtime = optimus.optimize(runtime_src, (x,), rules=["batch_linear", "dce"])
    out["runtime"] = (runtime, list(runtime_src.parameters()))
    ideal = Ideal(base)
    out["ideal"] = (ideal, list(ideal.parameters()))
    relayout_src = tower_group(g, k, n)
    relayout_src.load_state_dict(base.state_dict())
    cfg = optimus.OptimusConfig(rules=("batch_linear", "dce"), layout=RelayoutParams())
    relayout = optimus.optimize(relayout_src, (x,), config=cfg)
    out["relayout"] = (relayout, list(relayout_src.parameters()))
    for name in ("runtime", "relayout"):
        fired = out[name][0].optimus_report.rules_fired  # type: ignore[union-attr]
        if fired.get("batch_linear", 0) < 1:
            raise RuntimeError(f"{name}: batch_linear did not fire ({fired}); nothing to measure")
    return out


def check_parity(variants: dict[str, tuple[nn.Module, list[nn.Parameter]]], x: torch.Tensor) -> float:
    """Max abs difference of outputs and weight/bias gradients against (a); raises if > 1e-4."""
    worst = 0.0
    results = {}
    for name, (mod, params) in variants.items():
        for p in params:
            p.grad = None
        outs = mod(x)
        torch.autograd.backward(list(outs), [torch.ones_like(o) for o in outs])
        grads = [p.grad for p in params]
        if name == "ideal":  # [G,K,N] and [G,1,N] -> per-linear weight [N,K] and bias [N]
            grads = [t for i in range(len(outs)) for t in (grads[1][i, 0], grads[0][i].t())]
        else:  # parameters() order per linear: weight, bias -> bias, weight
            grads = [t for i in range(0, len(grads), 2) for t in (grads[i + 1], grads[i])]
        results[name] = (torch.stack([o.detach() for o in outs]), grads)
    ref_out, ref_grads = results["separate"]
    for name, (o, grads) in results.items():
        worst = max(worst, (o - ref_out).abs().max().item())
        for g_ref, g in zip(ref_grads, grads, strict=True):
            worst = max(worst, (g - g_ref).abs().max().item())
        if worst > 1e-4:
            raise RuntimeError(f"{name}: differs from separate linears by {worst}")
    return worst


def step_fn(mod: nn.Module, params: list[nn.Parameter], x: torch.Tensor, phase: str) -> Callable[[], Any]:
    """One call of a variant: a no_grad forward, or grads set to None + forward + backward with ones."""
    ones: list[torch.Tensor] | None = None

    def step() -> Any:
        nonlocal ones
        if phase == "fwd":
            with torch.no_grad():
                return mod(x)
        for p in params:
            p.grad = None
        outs = mod(x)
        if ones is None:
            ones = [torch.ones_like(o) for o in outs]
        torch.autograd.backward(list(outs), ones)
        return outs

    return step


def q(values: list[float]) -> tuple[float, float]:
    quart = statistics.quantiles(values, n=4)
    return statistics.median(values), quart[2] - quart[0]


def measure(g: int, batch: int, k: int, n: int, rounds: int, iters: int) -> list[dict[str, Any]]:
    variants = build(g, k, n, batch)
    x = torch.randn(g, batch, k)
    err = check_parity(variants, x)
    rows = []
    for phase in ("fwd", "fwd+bwd"):
        contenders = [
            timing.Contender(name, step_fn(mod, params, x, phase), 0.0, None)
            for name, (mod, params) in variants.items()
        ]
        # The harness's one interleaved timing loop: ms per call per round, order alternating.
        rounds_ms = timing.interleave(contenders, rounds=rounds, steps=iters, warmup=3)
        samples = {name: [ms * 1e3 for ms in v] for name, v in rounds_ms.items()}
        med = {name: q(s) for name, s in samples.items()}
        for name in VARIANTS:
            m, iqr = med[name]
            rows.append(
                {
                    "groups": g,
                    "batch": batch,
                    "k": k,
                    "n": n,
                    "phase": phase,
                    "variant": name,
                    "median_us": m,
                    "iqr_us": iqr,
                    "speedup_vs_separate": med["separate"][0] / m,
                    "speed_vs_ideal": med["ideal"][0] / m,
                    "max_abs_err": err,
                    "samples_us": samples[name],
                }
            )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--groups", default="32,64", help="comma-separated G values (default: 32,64)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="also write rows and samples here as JSON (atomically)")


def main_from_args(args: argparse.Namespace) -> int:
    """Validate, measure, print the table; a bad option value is a ValueError (exit BAD_INPUT)."""
    from harness.store.results import write_atomic

    try:
        groups = [int(v) for v in args.groups.split(",")]
    except ValueError:
        raise ValueError(f"--groups must be comma-separated ints, got {args.groups!r}") from None
    for name in ("batch", "k", "n", "rounds", "iters", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1")
    if args.rounds < 2 or any(v < 2 for v in groups):
        raise ValueError("--rounds and every --groups value must be >= 2")
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    rows = [r for g in groups for r in measure(g, args.batch, args.k, args.n, args.rounds, args.iters)]
    print(
        f"batch={args.batch} k={args.k} n={args.n} threads={args.threads} rounds={args.rounds}x{args.iters} "
        f"torch={torch.__version__} loadavg(start)={load[0]:.2f} loadavg(end)={os.getloadavg()[0]:.2f}"
    )
    print("| G | phase | variant | median us | IQR us | vs separate (a) | speed vs ideal (c) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['groups']} | {r['phase']} | {r['variant']} | {r['median_us']:.1f} | {r['iqr_us']:.1f} | "
            f"{r['speedup_vs_separate']:.2f}x | {r['speed_vs_ideal']:.2f} |"
        )
    if args.out:
        payload = {"args": vars(args), "torch": torch.__version__, "loadavg": load, "rows": rows}
        write_atomic(args.out, json.dumps(payload, indent=1))
    return 0
