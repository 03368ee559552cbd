"""Side-by-side timing in one process: the modes of one model take turns, round by round.

WHY: ``run`` and ``reproduce`` time each cell in a process of its own, one after another. On a
shared or virtualised machine the load drifts over minutes, and a ratio of two cells timed ten
minutes apart carries that drift: with the same towers inference code, towers medium
compile+optimus read 1.39x of compile in one ``reproduce`` and 1.17x in another (docs/perf.md).
Here every round times each mode for a few steps in turn (the order reversed every other round), so a drift hits
all modes alike, and each round gives a paired ratio against the first mode. The verdict is the
median of those ratios with a bootstrap interval.

What it is not: peak memory is not measured, and compile time here is the first call in a
process where other modes already compiled (recorded, but not comparable to a ``run`` cell's).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness import stats
from harness.env import collect_env
from harness.measure.timing import Contender, interleave
from harness.modes import builtin, mode_registry
from harness.run import cell as cell_mod
from harness.spec import PHASES


def _check(names: Sequence[str], allowed: Sequence[str], what: str) -> None:
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"{what}: unknown {bad}; allowed values: {', '.join(allowed)}")


def contender(
    model: str, scale: str, mode: str, phase: str, *, device: str, seed: int, provider: str
) -> Contender:
    """Build ``model`` afresh (same seed: same weights and batches for every mode), prepare
    ``mode`` and make its first call (compiling, for compiled modes)."""
    import torch
    import torch._inductor.config as inductor_config

    b = cell_mod.build_model(provider, model, scale, device, seed)
    module, batches = b.module, list(b.batches)
    if not batches:
        raise RuntimeError(f"{model}/{scale}: the model provided no batches")
    train = phase == "train"
    module.train(train)
    example = cell_mod.example_inputs(b, batches)
    saved_peer = copy.deepcopy(inductor_config.pre_grad_fusion_options)
    try:  # the peer's options are process-global: on only while its graph compiles
        prepared = mode_registry.prepare(mode, module.dense, example)
        module.dense = prepared.module
        optimizer = torch.optim.SGD(module.parameters(), lr=0.01) if train else None
        step = cell_mod.step_fn(module, batches, optimizer, cell_mod.forward_fn(b, train))
        sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        t0 = time.perf_counter()
        out = step()
        sync()
        first = time.perf_counter() - t0 + prepared.prepare_s
    finally:
        inductor_config.pre_grad_fusion_options = saved_peer
    return Contender(mode, step, first, out.detach(), module, optimizer)


def summarize(samples: dict[str, list[float]], base: str) -> dict[str, Any]:
    """Per mode: median ms (IQR); against ``base``: the median of per-round speedups
    (base ms / mode ms of the same round) and its bootstrap 95% interval."""
    if base not in samples:
        raise ValueError(f"base: {base!r} is not among the modes timed ({', '.join(samples)})")
    rows: dict[str, Any] = {}
    b = np.asarray(samples[base], dtype=float)
    for mode, ms in samples.items():
        x = np.asarray(ms, dtype=float)
        q1, med, q3 = (float(v) for v in np.percentile(x, [25, 50, 75]))
        row: dict[str, Any] = {"median_ms": med, "iqr_ms": q3 - q1, "rounds_ms": [float(v) for v in x]}
        if mode != base:
            speedups = b / x
            row["speedup_vs_base"] = float(np.median(speedups))
            row["speedup_ci95"] = stats.bootstrap_median(speedups)
        rows[mode] = row
    return rows


def run_ab(
    model: str,
    scale: str,
    phase: str,
    mode_names: Sequence[str],
    *,
    rounds: int = 15,
    steps: int = 5,
    warmup: int = 3,
    device: str = "cpu",
    seed: int = 0,
    threads: int = 1,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    provider: str,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Prepare every mode, check each first output against the first mode's, then interleave."""
    _check(mode_names, mode_registry.names(), "modes")
    _check([phase], PHASES, "phase")
    if len(mode_names) < 2 or len(set(mode_names)) != len(mode_names):
        raise ValueError(f"modes: need two or more distinct modes, got {list(mode_names)}")
    for name, v in (("rounds", rounds), ("steps", steps)):
        if v < 1:
            raise ValueError(f"{name}: must be >= 1, got {v}")
    if warmup < 0:
        raise ValueError(f"warmup: must be >= 0, got {warmup}")
    builtin.disable_compile_caches()
    import torch

    if threads:
        torch.set_num_threads(threads)
    contenders = []
    for mode in mode_names:
        log(f"[ab] {model}/{scale}/{phase}: preparing {mode} ...")
        contenders.append(contender(model, scale, mode, phase, device=device, seed=seed, provider=provider))
        log(f"[ab]   first call {contenders[-1].first_call_s:.1f} s")
    ref = contenders[0].first_out
    parity = {}
    for c in contenders[1:]:
        ok = c.first_out.shape == ref.shape and cell_mod.close(ref, c.first_out, atol, rtol)
        parity[c.mode] = {"ok": bool(ok), "max_abs_err": cell_mod.max_err(ref, c.first_out) if ok else None}
    sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    samples = interleave(
        contenders, rounds, steps, warmup, sync, progress=lambda r: log(f"[ab]   round {r}/{rounds}")
    )
    rows = summarize(samples, mode_names[0])
    for c in contenders:
        rows[c.mode]["first_call_s"] = c.first_call_s
        if c.mode in parity:
            rows[c.mode]["parity_vs_base"] = parity[c.mode]
    return {
        "kind": "optimus-bench-ab",
        "env": collect_env(device),
        "model": model,
        "scale": scale,
        "phase": phase,
        "base": mode_names[0],
        "config": {
            "rounds": rounds,
            "steps": steps,
            "warmup": warmup,
            "device": device,
            "seed": seed,
            "threads": threads,
            "atol": atol,
            "rtol": rtol,
        },
        "modes": rows,
    }


def format_ab(doc: dict[str, Any]) -> str:
    """Markdown table of an ``ab`` result."""
    base = doc["base"]
    cfg = doc["config"]
    lines = [
        f"{doc['model']}/{doc['scale']}/{doc['phase']}, {cfg['rounds']} rounds x {cfg['steps']} steps, "
        f"interleaved in one process; speedup = {base} ms / mode ms, per round",
        "",
        f"| mode | median ms (IQR) | speedup vs {base} (95% CI) | first call s | parity vs {base} |",
        "| --- | --- | --- | --- | --- |",
    ]
    for mode, r in doc["modes"].items():
        if mode == base:
            speed, par = "1 (base)", "-"
        else:
            lo, hi = r["speedup_ci95"]
            speed = f"{r['speedup_vs_base']:.3f}x ({lo:.3f}-{hi:.3f})"
            p = r["parity_vs_base"]
            par = f"ok (max err {p['max_abs_err']:.2g})" if p["ok"] else "**MISMATCH**"
        lines.append(
            f"| {mode} | {r['median_ms']:.3f} ({r['iqr_ms']:.3f}) | {speed} | {r['first_call_s']:.1f} | {par} |"
        )
    return "\n".join(lines)
