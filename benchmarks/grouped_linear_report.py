"""The grouped linear, every way torch can run it, side by side: the report a GPU machine writes.

    python -m benchmarks.grouped_linear_report OUT.json                 # CUDA (the GPU machine)
    python -m benchmarks.grouped_linear_report OUT.json --device cpu    # dry run, no GPU

WHY: horizontal fusion on a GPU pays in launches, and which grouped-GEMM form wins decides what
the cost model's CUDA constants and ``group_linear``'s form should be. torch 2.13 offers two
forms of its own beside our Triton kernel: ``torch._foreach_mm`` (mixed shapes; a cuBLASLt
grouped GEMM through nvmath-python on sm90 in bf16, else ``torch._grouped_mm`` for uniform K and
N, else a loop of ``mm``) and ``torch._grouped_mm`` (one kernel for groups that share K and N).
Nobody here had measured them against the kernel.

Two problems per G in ``--groups`` (default 8, 32, 128), M = 256 rows each:

- ``ragged``: K and N drawn per group from 64..512 (powers of two, seeded), what mixed towers
  give ``group_linear``;
- ``equal``: K = N = 256 in every group, where ``torch._grouped_mm`` and a plain ``bmm`` apply.

The variants, each computing ``[x_g @ w_g.T + b_g for g]``:

- ``loop``: G ``F.linear`` calls (what the unfused graph runs);
- ``padded_bmm``: ``optimus::grouped_linear`` with the padded-``bmm`` backend;
- ``triton``: ``optimus::grouped_linear`` with our Triton kernel (CUDA only);
- ``foreach_mm``: ``torch._foreach_mm`` and ``torch._foreach_add`` of the biases, as torch
  routes it on this machine (nvmath when installed), and ``foreach_mm_no_nvmath``: the same with
  torch's nvmath check answering no (run only where nvmath is installed, else it is the same);
- ``grouped_mm`` (equal only): ``torch._grouped_mm`` of the stacked inputs and weights;
- ``bmm`` (equal only): ``torch.baddbmm`` of the stacked inputs and weights.

Weights of the stacked forms are stacked once, outside the timed step, as the re-layout keeps
them (``RelayoutParams``); inputs are stacked inside it, as a fused graph must. Each variant runs
``forward`` (no grad) and ``forward_backward`` (sum of outputs, backward to inputs, weights and
biases), in ``eager`` and, on CUDA, under a captured CUDA graph (``cuda_graph``: launch cost
gone, which is what horizontal fusion otherwise buys). Each row carries the median ms, the
largest difference of its outputs from ``loop``'s, or the one-line reason it did not run; one
variant failing never loses the others. The JSON is written atomically, rows so far included
when ``--limit-s`` ends the run early.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import bench_grouped_linear as bench
from optimus.atomic import write_atomic

WIDTHS = (64, 128, 256, 512)
EQUAL_WIDTH = 256
BATCH = 256
GROUPS = (8, 32, 128)
PHASES = ("forward", "forward_backward")
RAGGED_VARIANTS = ("loop", "padded_bmm", "triton", "foreach_mm", "foreach_mm_no_nvmath")
EQUAL_VARIANTS = (*RAGGED_VARIANTS, "grouped_mm", "bmm")

Problem = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]
Step = Callable[[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]], list[torch.Tensor]]


class Skipped(Exception):
    """A variant that cannot run here (the message says why)."""


def shapes(problem: str, groups: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """(M, K, N) of each group: ``ragged`` draws K and N from WIDTHS, ``equal`` uses EQUAL_WIDTH."""
    if problem == "equal":
        return [(BATCH, EQUAL_WIDTH, EQUAL_WIDTH)] * groups
    return bench.ragged_shapes(groups, seed, BATCH, WIDTHS)


def make(mnk: list[tuple[int, int, int]], device: str, dtype: torch.dtype, grad: bool) -> Problem:
    """The asv benchmark's problem at a tenth of its scale (bf16 sums over K up to 512 stay small)."""
    return bench.make_problem(mnk, device, dtype, grad, scale=0.1)


@contextlib.contextmanager
def _nvmath(allowed: bool) -> Iterator[None]:
    """torch's ``_foreach_mm`` override with its nvmath check answering ``allowed`` (no-op where
    this torch has no such override)."""
    try:
        from torch._native.ops.foreach_mm import impl
    except ImportError:
        yield
        return
    saved = impl._check_nvmath_cublaslt
    if not allowed:
        impl._check_nvmath_cublaslt = lambda: False  # type: ignore[assignment]
    try:
        yield
    finally:
        impl._check_nvmath_cublaslt = saved  # type: ignore[assignment]


def nvmath_installed() -> bool:
    try:
        from torch._native.ops.foreach_mm import impl
    except ImportError:
        return False
    return bool(impl._check_nvmath_cublaslt())


def variant(name: str, device: str, ws: list[torch.Tensor], bs: list[torch.Tensor]) -> Step:
    """The step of variant ``name`` (raises ``Skipped`` where it cannot run here). ``ws``/``bs``:
    the problem's weights and biases, stacked once here for the stacked forms."""
    if name == "loop":
        return lambda xs, ws, bs: [F.linear(x, w, b) for x, w, b in zip(xs, ws, bs, strict=True)]
    if name in ("padded_bmm", "triton"):
        from optimus.kernels.grouped_linear import triton_installed

        if name == "triton" and (device != "cuda" or not triton_installed()):
            raise Skipped("the Triton kernel is timed on CUDA only (on CPU only its interpreter runs)")
        backend = "padded" if name == "padded_bmm" else "triton"
        op = torch.ops.optimus.grouped_linear
        return lambda xs, ws, bs: list(op(xs, ws, bs, "none", backend))
    if name.startswith("foreach_mm"):
        if name == "foreach_mm_no_nvmath" and not nvmath_installed():
            raise Skipped("nvmath-python is not installed: foreach_mm already ran without it")
        allowed = name == "foreach_mm"

        def foreach(
            xs: list[torch.Tensor], ws: list[torch.Tensor], bs: list[torch.Tensor]
        ) -> list[torch.Tensor]:
            with _nvmath(allowed):
                outs = torch._foreach_mm(xs, [w.t() for w in ws])
            return list(torch._foreach_add(outs, bs))

        return foreach
    w3 = torch.stack([w.detach() for w in ws]).requires_grad_(ws[0].requires_grad)
    b3 = torch.stack([b.detach() for b in bs]).unsqueeze(1).requires_grad_(bs[0].requires_grad)
    if name == "grouped_mm":
        return lambda xs, ws, bs: list(
            torch._grouped_mm(torch.stack(xs), w3.transpose(1, 2)).add(b3).unbind(0)
        )
    if name == "bmm":
        return lambda xs, ws, bs: list(torch.baddbmm(b3, torch.stack(xs), w3.transpose(1, 2)).unbind(0))
    raise ValueError(f"unknown variant {name!r}")


def _step(fn: Step, prob: Problem, backward: bool) -> Callable[[], None]:
    xs, ws, bs = prob

    def run() -> None:
        if backward:
            for t in (*xs, *ws, *bs):
                t.grad = None
            outs = fn(xs, ws, bs)
            torch.autograd.backward(torch.stack([o.float().sum() for o in outs]).sum())
        else:
            with torch.no_grad():
                fn(xs, ws, bs)

    return run


def _graphed(run: Callable[[], None], backward: bool) -> Callable[[], None]:
    """``run`` captured once into a CUDA graph; the returned step replays it. Gradients are set
    to None inside ``run``, so the captured backward allocates them from the graph's pool."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def _median_ms(run: Callable[[], None], device: str, iters: int, warmup: int) -> float:
    from harness.measure.timing import time_iterations

    times = time_iterations(run, warmup=warmup, min_iters=iters, max_iters=iters, budget_s=0.0, device=device)
    return sorted(times)[len(times) // 2]


def _max_err(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def report(
    device: str = "cuda",
    groups: tuple[int, ...] = GROUPS,
    dtypes: tuple[str, ...] = ("bfloat16",),
    iters: int = 30,
    warmup: int = 5,
    limit_s: float | None = None,
    out: Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every (dtype, G, problem, phase, variant, mode) row; written to ``out`` after each row
    when given (so a run cut short keeps what it measured)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested, but torch sees no CUDA device; use --device cpu")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    modes = ("eager", "cuda_graph")
    doc: dict[str, Any] = {"kind": "grouped-linear-report", "env": _env(device), "config": {
        "device": device, "groups": list(groups), "dtypes": list(dtypes), "iters": iters, "warmup": warmup,
        "batch": BATCH, "widths": list(WIDTHS), "equal_width": EQUAL_WIDTH,
    }, "shapes": {str(g): shapes("ragged", g) for g in groups}, "rows": [], "complete": False}  # fmt: skip
    started = time.monotonic()

    def emit(row: dict[str, Any]) -> None:
        doc["rows"].append(row)
        if progress:
            progress(row)
        if out is not None:
            write_atomic(out, json.dumps(doc, indent=1))

    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for g in groups:
            for problem, names in (("ragged", RAGGED_VARIANTS), ("equal", EQUAL_VARIANTS)):
                mnk = shapes(problem, g)
                for phase in PHASES:
                    backward = phase == "forward_backward"
                    prob = make(mnk, device, dtype, grad=backward)
                    with torch.no_grad():
                        ref = variant("loop", device, prob[1], prob[2])(*prob)
                    for name in names:
                        for mode in modes:
                            if limit_s is not None and time.monotonic() - started > limit_s:
                                doc["stopped"] = f"--limit-s {limit_s:g} reached"
                                if out is not None:
                                    write_atomic(out, json.dumps(doc, indent=1))
                                return doc
                            row = {"dtype": dtype_name, "groups": g, "problem": problem, "phase": phase,
                                   "variant": name, "mode": mode}  # fmt: skip
                            row.update(_measure(name, mode, device, prob, ref, backward, iters, warmup))
                            emit(row)
    doc["complete"] = True
    if out is not None:
        write_atomic(out, json.dumps(doc, indent=1))
    return doc


def _measure(
    name: str,
    mode: str,
    device: str,
    prob: Problem,
    ref: list[torch.Tensor],
    backward: bool,
    iters: int,
    warmup: int,
) -> dict[str, Any]:
    """One row's figures: median_ms and max_abs_err_vs_loop, or skipped / error with its reason."""
    try:
        if mode == "cuda_graph" and device != "cuda":
            raise Skipped("CUDA graphs need CUDA")
        fn = variant(name, device, prob[1], prob[2])
        with torch.no_grad():
            err = _max_err(fn(*prob), ref)
        run = _step(fn, prob, backward)
        if mode == "cuda_graph":
            run = _graphed(run, backward)
        return {"median_ms": _median_ms(run, device, iters, warmup), "max_abs_err_vs_loop": err}
    except Skipped as exc:
        return {"skipped": str(exc)}
    except Exception as exc:  # one variant's failure is a row, never the end of the report
        return {"error": _first_line(exc)}


def _env(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "device": device, "nvmath": nvmath_installed()}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        env["capability"] = list(torch.cuda.get_device_capability())
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _dtypes(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    bad = [n for n in names if n not in ("float32", "bfloat16", "float16")]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype {bad[0]!r}; allowed: float32, bfloat16, float16")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.grouped_linear_report",
        description="the grouped linear in every form torch offers, side by side (JSON report)",
    )
    parser.add_argument("out", type=Path, help="the report's JSON file (written atomically)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--groups", type=_ints, default=GROUPS, help="G values (default 8,32,128)")
    parser.add_argument("--dtypes", type=_dtypes, default=("bfloat16",), help="default bfloat16")
    parser.add_argument("--iters", type=_ints, default=(30,), help="timed steps per row (default 30)")
    parser.add_argument("--limit-s", type=float, default=None, help="stop starting rows after S seconds")
    args = parser.parse_args(argv)

    def line(row: dict[str, Any]) -> None:
        what = (
            f"{row['median_ms']:.3f} ms (err {row['max_abs_err_vs_loop']:.2g})"
            if "median_ms" in row
            else row.get("skipped") or row.get("error")
        )
        print(f"{row['dtype']} G={row['groups']} {row['problem']} {row['phase']} {row['variant']} {row['mode']}: {what}", flush=True)  # fmt: skip

    try:
        doc = report(args.device, args.groups, args.dtypes, args.iters[0], limit_s=args.limit_s, out=args.out, progress=line)  # fmt: skip
    except ValueError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0 if doc["complete"] else 3


if __name__ == "__main__":
    sys.exit(main())
