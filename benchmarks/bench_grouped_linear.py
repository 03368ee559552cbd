"""The grouped-linear op against G separate linears, on a ragged shape set.

Timed by asv itself (``time_``): one forward, and one forward+backward, of G linears whose
(K, N) differ, run as G ``F.linear`` calls (``separate``: what the unfused graph does) or as one
``torch.ops.optimus.grouped_linear`` with a backend: ``loop`` and ``padded`` (CPU
implementations), ``triton`` (the grouped kernel, CUDA only: on CPU it would only run in
Triton's interpreter, which times numpy, so it is not offered there). Pairs that cannot run on
the device raise NotImplementedError, which asv reports as skipped.

Shapes: batch M = 256 rows (the medium presets' batch), K_g and N_g drawn uniformly from the
embedding dims of ``models/widths.py`` (8..128, powers of two), seeded; G = 8 and 32.

On a GPU machine, ``python -m benchmarks.bench_grouped_linear --gpu-report OUT.json`` times the
same shape sets (and larger G) with CUDA events: separate linears, the Triton grouped kernel,
the padded bmm, and ``torch.compile`` (Inductor) of the separate linears, forward and
forward+backward, fp32 and bf16. See docs/optimus.md, "group_linear and the grouped kernel".
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

EMBEDDING_DIMS = (8, 16, 32, 64, 128)  # models.widths.EMBEDDING_DIMS (models needs torchrec)
BATCH = 256
VARIANTS = ("separate", "loop", "padded", "triton")


def ragged_shapes(groups: int, seed: int = 0, batch: int = BATCH) -> list[tuple[int, int, int]]:
    """(M, K, N) of ``groups`` linears: K and N drawn from EMBEDDING_DIMS, seeded."""
    rng = random.Random(f"{seed}/bench")
    return [(batch, rng.choice(EMBEDDING_DIMS), rng.choice(EMBEDDING_DIMS)) for _ in range(groups)]


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def make_problem(
    shapes: list[tuple[int, int, int]], device: str, dtype: torch.dtype = torch.float32, grad: bool = False
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype).requires_grad_(grad)

    return [t(m, k) for m, k, _ in shapes], [t(n, k) for _, k, n in shapes], [t(n) for _, _, n in shapes]


def runner(variant: str, device: str) -> Callable[[list, list, list], list[torch.Tensor]]:
    """The forward of one variant; NotImplementedError where it cannot run."""
    if variant == "separate":
        return lambda xs, ws, bs: [F.linear(x, w, b) for x, w, b in zip(xs, ws, bs, strict=True)]
    from optimus.kernels.grouped_linear import triton_installed

    if variant == "triton" and (device != "cuda" or not triton_installed()):
        raise NotImplementedError("the Triton grouped kernel is timed on CUDA only")
    op = torch.ops.optimus.grouped_linear
    return lambda xs, ws, bs: op(xs, ws, bs, "none", variant)


class GroupedLinear:
    """G ragged linears: separate F.linear calls vs one grouped op per backend."""

    params = (devices(), [8, 32], list(VARIANTS))
    param_names = ("device", "groups", "variant")
    number = 5
    repeat = (3, 10, 20.0)
    timeout = 300.0

    def setup(self, device: str, groups: int, variant: str) -> None:
        self.run = runner(variant, device)
        self.device = device
        self.xs, self.ws, self.bs = make_problem(ragged_shapes(groups), device)
        self.gx, self.gw, self.gb = make_problem(ragged_shapes(groups), device, grad=True)
        self.run(self.xs, self.ws, self.bs)  # warm up (Triton compiles on first call)

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def time_forward(self, device: str, groups: int, variant: str) -> None:
        with torch.no_grad():
            self.run(self.xs, self.ws, self.bs)
        self._sync()

    def time_forward_backward(self, device: str, groups: int, variant: str) -> None:
        outs = self.run(self.gx, self.gw, self.gb)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        self._sync()


# -- the GPU report (run by hand on a GPU machine; nothing here runs in CI) -----------------------


def _cuda_ms(fn: Callable[[], Any], iters: int = 50, warmup: int = 5) -> float:
    """Median of ``iters`` CUDA-event timings of ``fn`` in milliseconds (the harness's sampler:
    ``warmup`` untimed calls, then exactly ``iters`` samples, each bracketed by CUDA events)."""
    from harness.measure.timing import time_iterations

    times = time_iterations(fn, warmup=warmup, min_iters=iters, max_iters=iters, budget_s=0.0, device="cuda")
    return sorted(times)[len(times) // 2]


def _time_step(fn: Callable, xs: list, ws: list, bs: list, backward: bool) -> float:
    """CUDA median ms of one forward (no_grad) or forward+backward of ``fn``."""

    def step() -> None:
        outs = fn(xs, ws, bs)
        if backward:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    with torch.enable_grad() if backward else torch.no_grad():
        return _cuda_ms(step)


def gpu_report(
    groups_list: tuple[int, ...] = (8, 32, 128), dtypes: tuple[str, ...] = ("float32", "bfloat16")
) -> dict[str, Any]:
    """Separate linears vs the Triton grouped kernel vs the padded bmm vs Inductor, on CUDA."""
    if not torch.cuda.is_available():
        raise SystemExit("gpu-report: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    rows: list[dict[str, Any]] = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for groups in groups_list:
            shapes = ragged_shapes(groups)
            for phase in ("forward", "forward_backward"):
                xs, ws, bs = make_problem(shapes, "cuda", dtype, grad=phase != "forward")
                variants: dict[str, Callable] = {
                    v: runner(v, "cuda") for v in ("separate", "padded", "triton")
                }
                started = time.perf_counter()
                compiled = torch.compile(variants["separate"])
                compiled(xs, ws, bs)
                variants["inductor"] = compiled
                compile_s = time.perf_counter() - started
                ref = [o.float() for o in variants["separate"](xs, ws, bs)]
                for name, fn in variants.items():
                    err = max(
                        float((a.float() - r).abs().max()) for a, r in zip(fn(xs, ws, bs), ref, strict=True)
                    )

                    ms = _time_step(fn, xs, ws, bs, backward=phase != "forward")
                    rows.append(
                        {
                            "dtype": dtype_name,
                            "groups": groups,
                            "phase": phase,
                            "variant": name,
                            "median_ms": ms,
                            "max_abs_err_vs_separate": err,
                            "compile_s": compile_s if name == "inductor" else None,
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return {"env": env, "shapes": {g: ragged_shapes(g) for g in groups_list}, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="grouped-linear GPU report (CUDA only)")
    parser.add_argument("--gpu-report", metavar="OUT.json", required=True)
    args = parser.parse_args(argv)
    report = gpu_report()
    with open(args.gpu_report, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
