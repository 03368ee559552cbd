#!/usr/bin/env python3
"""Measure each model family: parameters, dense-arch nodes, eager train step, dense compile time.

Why a script and subprocesses: every (family, scale) runs in its own process with a timeout, so
Inductor state, caches and memory never leak between measurements and a hang on a large graph is
recorded as a timeout instead of stopping the run. Compile caches are off
(TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 in the child's environment, fx_graph_cache=False), so the
compile time is a cold compile. Results are written atomically as JSON.

    PYTHONPATH=. python scripts/measure_models.py --scales small large --out results/models/measure.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def measure_one(family: str, scale: str, steps: int, threads: int, compile_dense: bool) -> dict[str, Any]:
    """Runs in the child process: build, eager train steps, cold compile of the dense arch."""
    import torch

    import models

    if threads > 0:
        torch.set_num_threads(threads)

    torch._inductor.config.fx_graph_cache = False
    start = time.perf_counter()
    b = models.build(family, scale, device="cpu", seed=0)
    build_s = time.perf_counter() - start
    module = b.module
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    step_s = []
    for i in range(steps + 2):  # 2 warm-up steps
        batch = b.batches[i % len(b.batches)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = b.loss(module(*batch.inputs), batch.labels)
        loss.backward()
        opt.step()
        if i >= 2:
            step_s.append(time.perf_counter() - t0)
    q = statistics.quantiles(step_s, n=4) if len(step_s) >= 2 else [step_s[0]] * 3

    result: dict[str, Any] = {
        "family": family,
        "scale": scale,
        "status": "ok",
        "params": b.meta["params"],
        "dense_params": b.meta["dense_params"],
        "dense_nodes": b.meta["dense_nodes"],
        "build_s": build_s,
        "train_step_ms": {
            "median": 1000 * statistics.median(step_s),
            "q1": 1000 * q[0],
            "q3": 1000 * q[2],
            "samples": [1000 * s for s in step_s],
        },
        "threads": torch.get_num_threads(),
    }
    if not compile_dense:
        return result
    module.eval()
    inputs = [b.dense_inputs(batch) for batch in b.batches]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # the build's node-count capture is not a compile
    compiled = torch.compile(module.dense, fullgraph=True)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = compiled(*inputs[0])
        compile_s = time.perf_counter() - t0
        max_err = max(
            float((compiled(*x) - module.dense(*x)).abs().max()) for x in inputs
        )  # every batch: different KJT lengths, same dense shapes, no recompile
    result["dense_compile_s"] = compile_s
    result["compiled_graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    result["compile_max_abs_err"] = max_err
    result["out_shape"] = list(out.shape)
    return result


def run_child(family: str, scale: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    cmd = [sys.executable, __file__, "--one", family, scale, "--steps", str(args.steps)]
    cmd += ["--threads", str(args.threads)] + (["--no-compile"] if args.no_compile else [])
    timeout = args.timeout
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"family": family, "scale": scale, "status": "timeout", "error": f"over {timeout} s"}
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"family": family, "scale": scale, "status": "failed", "error": proc.stderr[-2000:]}
    result = json.loads(lines[-1])
    result["child_wall_s"] = wall
    return result


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def render(data: dict[str, Any]) -> str:
    """Markdown table of a measure.json (what docs/models.md shows)."""
    lines = [
        "| family | scale | params | dense nodes | eager train step ms, median [q1, q3] (n) "
        "| dense compile s (cold, inference) | status |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in data["cells"]:
        if c["status"] != "ok":
            lines.append(
                f"| {c['family']} | {c['scale']} | - | - | - | - | {c['status']}: {c.get('error', '')[:60]} |"
            )
            continue
        t = c["train_step_ms"]
        compile_s = f"{c['dense_compile_s']:.1f}" if "dense_compile_s" in c else "not run"
        lines.append(
            f"| {c['family']} | {c['scale']} | {c['params']:,} | {c['dense_nodes']:,} "
            f"| {t['median']:.1f} [{t['q1']:.1f}, {t['q3']:.1f}] ({len(t['samples'])}, {c['threads']} thr) "
            f"| {compile_s} | ok |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["dlrm", "dcn", "towers", "mmoe"])
    parser.add_argument("--scales", nargs="+", default=["small", "large"])
    parser.add_argument("--steps", type=int, default=7, help="timed eager train steps (after 2 warm-up)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per (family, scale)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "models" / "measure.json")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--no-compile", action="store_true", help="skip the dense compile")
    parser.add_argument("--render", type=Path, help="print a measure.json as a markdown table")
    parser.add_argument("--one", nargs=2, metavar=("FAMILY", "SCALE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    if args.one:
        print(
            json.dumps(measure_one(args.one[0], args.one[1], args.steps, args.threads, not args.no_compile))
        )
        return 0
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    cells = []
    for scale in args.scales:
        for family in args.families:
            cell = run_child(family, scale, args)
            cell["loadavg_after"] = os.getloadavg()
            cells.append(cell)
            print(json.dumps({k: v for k, v in cell.items() if k != "train_step_ms"}), flush=True)
            write_atomic(args.out, {"env": env, "cells": cells})
    env["loadavg_end"] = os.getloadavg()
    write_atomic(args.out, {"env": env, "cells": cells})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
