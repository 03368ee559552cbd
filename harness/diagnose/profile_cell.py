"""Where a cell's step time goes: a torch.profiler breakdown of one model under several modes.

    python -m harness.diagnose.profile_cell --model dcn --scale tiny --device cuda \\
        --modes compile,compile+optimus --out-dir DIR [--provider P] [--phase infer|train]
        [--cost-model analytic|measured] [--steps N] [--top K] [--threads T]

WHY: a speedup figure says *that* a cell missed its target, not *why*. This breaks the
time of a missed cell down: runs the same preparation as a harness cell
(``harness.modes.builtin``; the caches off), warms it up, then records ``--steps`` steps under
torch.profiler and sums each operator's *self* time: device time on CUDA (kernels), CPU time on
CPU. Ops are put into a few kinds (matmul, copy/stack/cat, fused pointwise, normalization, other)
so two modes can be compared side by side, and the top ``--top`` ops are listed by name.

On CPU, Inductor's generated C++ kernels are profiled one by one
(``torch._inductor.config.cpp.enable_kernel_profile``): without it every kernel of a compiled
graph is one opaque ``## Call CompiledFxGraph ##`` row (dlrm large training: 24.6 of 122 ms a
step), so a breakdown could not tell a fused cat from a layer norm. It adds a
``RECORD_FUNCTION`` to each kernel, nearly free while no profiler records (the wall times are
taken from the same build). Kernels are put into kinds by the ops Inductor names them after.

On CPU each mode also gets the buffers live at its step's memory peak, grouped by where they were
allocated (``harness.diagnose.peak_live``): what the compiled forward saved against what the backward
made, for a cell whose peak rose.

Output: ``profile.json`` (plain JSON, written atomically) and ``profile.md``. It is a diagnosis
tool, not a timing: the profiler's own overhead inflates small ops, so speedups come from
``run``/``ab``, and this says where the time goes.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness import exit_codes
from harness.diagnose.peak_live import live_at_peak, markdown_rows
from harness.modes import builtin, mode_registry
from harness.run import cell
from optimus.atomic import write_atomic

# (kind, substrings of a lower-cased op or kernel name); the first match wins
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matmul", ("gemm", "mm", "matmul", "linear", "addmm", "bmm", "cutlass", "sm90", "grouped_linear")),
    (
        "copy/stack/cat",
        ("copy", "cat", "stack", "clone", "contiguous", "memcpy", "memset", "index", "gather"),
    ),
    ("normalization", ("norm",)),
    ("fused pointwise", ("triton_", "cpp_fused", "poi", "red_fused", "per_fused", "fused")),
)
MATMUL_EXACT = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::linear", "aten::matmul")


def kind_of(name: str) -> str:
    """The kind of one profiler row (by its name)."""
    low = name.lower()
    if name in MATMUL_EXACT:
        return "matmul"
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def breakdown(rows: list[dict[str, Any]], steps: int, top: int) -> dict[str, Any]:
    """Per-step totals by kind and the ``top`` ops, from rows ``{name, self_us, count}``."""
    total = sum(r["self_us"] for r in rows)
    kinds: dict[str, float] = {}
    for r in rows:
        kinds[kind_of(r["name"])] = kinds.get(kind_of(r["name"]), 0.0) + r["self_us"]
    ranked = sorted(rows, key=lambda r: r["self_us"], reverse=True)[:top]
    return {
        "self_us_per_step": total / steps,
        "kinds_us_per_step": {k: v / steps for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "ops_per_step": sum(r["count"] for r in rows) / steps,
        "top": [
            {
                "name": r["name"],
                "kind": kind_of(r["name"]),
                "us_per_step": r["self_us"] / steps,
                "calls_per_step": r["count"] / steps,
            }
            for r in ranked
        ],
    }


def _rows(prof: Any, on_device: bool) -> list[dict[str, Any]]:
    rows = []
    for e in prof.key_averages():
        us = float(getattr(e, "self_device_time_total", 0.0) if on_device else e.self_cpu_time_total)
        if us > 0:
            rows.append({"name": e.key, "self_us": us, "count": int(e.count)})
    return rows


def profile_mode(b: Any, mode: str, train: bool, device: str, steps: int, top: int) -> dict[str, Any]:
    """Prepare ``mode`` on a copy of the model's dense arch, warm it, profile ``steps`` steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    module = copy.deepcopy(b.module)
    module.train(train)
    batches = list(b.batches)
    example = cell.example_inputs(b, batches)
    prepared = mode_registry.prepare(mode, module.dense, example, beside=module)
    module.dense = prepared.module
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01) if train else None
    step = cell.step_fn(module, batches, optimizer, cell.forward_fn(b, train))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    step()
    sync()
    first_s = time.perf_counter() - t0
    for _ in range(5):
        step()
    sync()
    wall_ms = []
    for _ in range(max(steps, 10)):
        t = time.perf_counter()
        step()
        sync()
        wall_ms.append((time.perf_counter() - t) * 1e3)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    out: dict[str, Any] = {
        "mode": mode,
        "first_call_s": first_s,
        "step_ms_median": statistics.median(wall_ms),
        "step_ms_iqr": _iqr(wall_ms),
        "profiled": "device self time (kernels)" if device == "cuda" else "CPU self time (ops)",
    }
    out.update(breakdown(_rows(prof, device == "cuda"), steps, top))
    # what holds the step's peak (harness.diagnose.peak_live); a CUDA cell's figure is max_memory_allocated
    if device == "cpu":
        if optimizer is not None:  # the step starts without gradients, as a cell's memory step does
            optimizer.zero_grad(set_to_none=True)
        try:
            out["peak_live"] = live_at_peak(step).as_dict()
        except RuntimeError as e:  # a missing table, not a failed mode
            out["peak_live_error"] = str(e)
    reports = prepared.reports
    if reports:
        out.update(builtin.merge_reports(reports))
    return out


def _iqr(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def markdown(result: dict[str, Any]) -> str:
    """The result as a side-by-side table of kinds, then each mode's top ops."""
    ms = result["modes"]
    lines = [
        f"# Profile: {result['model']} {result['scale']} {result['phase']} on {result['device']}",
        "",
        f"{result['steps']} profiled steps per mode, {result.get('threads', '?')} thread(s);"
        f" {ms[0]['profiled'] if ms else ''}, per step;"
        f" cost model {result['cost_model']}. Wall step times are medians without the profiler.",
        "",
        "| | " + " | ".join(m["mode"] for m in ms) + " |",
        "| --- | " + " | ".join("---" for _ in ms) + " |",
        "| wall step ms (IQR) | "
        + " | ".join(f"{m['step_ms_median']:.3f} ({m['step_ms_iqr']:.3f})" for m in ms)
        + " |",
        "| profiled self us | " + " | ".join(f"{m['self_us_per_step']:.1f}" for m in ms) + " |",
        "| ops or kernels | " + " | ".join(f"{m['ops_per_step']:.0f}" for m in ms) + " |",
    ]
    kinds = sorted({k for m in ms for k in m["kinds_us_per_step"]})
    for k in kinds:
        lines.append(
            f"| {k} us | " + " | ".join(f"{m['kinds_us_per_step'].get(k, 0.0):.1f}" for m in ms) + " |"
        )
    for m in ms:
        fired = ", ".join(f"{k} x{v}" for k, v in sorted((m.get("rules_fired") or {}).items()))
        lines += ["", f"## {m['mode']}", ""]
        if fired:
            lines += [f"rules fired: {fired}", ""]
        lines += ["| op | kind | us/step | calls/step |", "| --- | --- | --- | --- |"]
        for t in m["top"]:
            name = t["name"].replace("|", "/")[:90]
            lines.append(f"| `{name}` | {t['kind']} | {t['us_per_step']:.1f} | {t['calls_per_step']:.1f} |")
        if m.get("peak_live"):
            lines += ["", *markdown_rows(m["peak_live"])]
        elif m.get("peak_live_error"):
            lines += ["", f"live at the step's peak: unavailable ({m['peak_live_error']})"]
    return "\n".join(lines) + "\n"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--provider", default="models:build")
    ap.add_argument("--model", required=True)
    ap.add_argument("--scale", default="tiny")
    ap.add_argument("--phase", default="infer", choices=("infer", "train"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--modes", default="compile,compile+optimus")
    ap.add_argument("--cost-model", default="analytic", choices=("analytic", "measured"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1, as the committed runs)"
    )
    ap.add_argument("--out-dir", required=True)


def main_from_args(a: argparse.Namespace) -> int:
    if a.steps < 1 or a.top < 1 or a.threads < 1:
        print("profile_cell: error: --steps, --top and --threads must be >= 1", file=sys.stderr)
        return exit_codes.BAD_INPUT

    names = [m for m in a.modes.split(",") if m]
    unknown = [m for m in names if m not in {x.name for x in mode_registry.modes()}]
    if not names or unknown:
        print(f"profile_cell: error: unknown mode(s) {unknown or a.modes!r}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("profile_cell: error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return exit_codes.BAD_INPUT
    builtin.disable_compile_caches()
    import torch._inductor.config as inductor_config

    # each C++ kernel a row (docstring); patched, not set, so a caller's process keeps its config
    kernel_rows = inductor_config.patch({"cpp.enable_kernel_profile": a.device == "cpu"})
    torch.set_num_threads(a.threads)
    b = cell.build_model(a.provider, a.model, a.scale, a.device, a.seed)
    result: dict[str, Any] = {
        "model": a.model,
        "scale": a.scale,
        "phase": a.phase,
        "device": a.device,
        "provider": a.provider,
        "cost_model": a.cost_model,
        "steps": a.steps,
        "threads": a.threads,
        "torch": torch.__version__,
        "modes": [],
    }
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for mode in names:
        print(f"profile_cell: {a.model} {a.scale} {a.phase} {mode} ...", file=sys.stderr, flush=True)
        try:
            with builtin.cost_model(a.cost_model), kernel_rows:
                result["modes"].append(profile_mode(b, mode, a.phase == "train", a.device, a.steps, a.top))
        except Exception as e:  # one mode's failure keeps the others
            failed += 1
            print(f"profile_cell: {mode} failed: {type(e).__name__}: {e}", file=sys.stderr)
            result.setdefault("errors", {})[mode] = f"{type(e).__name__}: {e}"
    write_atomic(out / "profile.json", json.dumps(result, indent=1, default=str))
    write_atomic(out / "profile.md", markdown(result))
    print(f"profile_cell: wrote {out / 'profile.md'}", file=sys.stderr)
    return exit_codes.INCOMPLETE if failed else exit_codes.OK


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.diagnose.profile_cell", description=__doc__.split("\n\n")[0]
    )
    add_arguments(ap)
    return main_from_args(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
