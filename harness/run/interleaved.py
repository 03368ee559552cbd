"""Side-by-side timing: the modes of one model take turns, round by round (``ab``), and the
builder of one mode's contender that every side-by-side measurement uses.

WHY: ``run`` and ``reproduce`` time each cell in a process of its own, one after another. On a
shared or virtualised machine the load drifts over minutes, and a ratio of two cells timed ten
minutes apart carries that drift: with the same towers inference code, towers medium
compile+optimus read 1.39x of compile in one ``reproduce`` and 1.17x in another (docs/perf.md).
Here every round times each mode for a few steps in turn (the order reversed every other round), so a drift hits
all modes alike, and each round gives a paired ratio against the first mode. The verdict is the
median of those ratios with a bootstrap interval. Each mode runs in worker processes of its own
(``harness.run.paired``, the protocol of ``pair``): one timing core for modes and for commits.
``contender`` is what a worker builds (``pair_worker.py`` asks every checkout for it).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness import stats
from harness.env import collect_env
from harness.measure.timing import Contender
from harness.modes import mode_registry
from harness.run import cell as cell_mod
from harness.spec import PHASES


def check_choice(names: Sequence[str], allowed: Sequence[str], what: str) -> None:
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
        prepared = mode_registry.prepare(mode, module.dense, example, beside=module)
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
    processes: int = 1,
    device: str = "cpu",
    seed: int = 0,
    threads: int = 1,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    provider: str,
    round_warmup_ms: float = 50.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every mode in ``processes`` worker processes of this checkout, the first outputs checked
    against the first mode's, then alternating rounds: the protocol of ``pair``
    (``harness.run.paired.measure_sides``), one side per mode."""
    from harness.run.paired import PairOptions, SideSpec, measure_sides
    from harness.run.paired_modes import this_checkout

    check_choice(mode_names, mode_registry.names(), "modes")
    check_choice([phase], PHASES, "phase")
    if len(mode_names) < 2 or len(set(mode_names)) != len(mode_names):
        raise ValueError(f"modes: need two or more distinct modes, got {list(mode_names)}")
    opt = PairOptions(rounds=rounds, max_rounds=rounds, steps=steps, warmup=warmup, processes=processes,
                      max_processes=processes, compiles=1, device=device, seed=seed, threads=threads,
                      atol=atol, rtol=rtol, provider=provider, round_warmup_ms=round_warmup_ms)  # fmt: skip
    opt.check()
    here = this_checkout()

    def close(a: Any, b: Any) -> tuple[bool, float]:
        ok = getattr(a, "shape", None) == getattr(b, "shape", None) and cell_mod.close(a, b, atol, rtol)
        return ok, cell_mod.max_err(a, b) if ok else float("nan")

    m = measure_sides((model, scale, phase), [SideSpec(mode, here, mode) for mode in mode_names], opt,
                      log=lambda msg: log(msg.replace("[pair]", "[ab]")), close=close)  # fmt: skip
    rows: dict[str, Any] = {}
    for i, (mode, side) in enumerate(zip(mode_names, m["sides"], strict=True)):
        x = np.asarray(side["ms"], dtype=float)
        q1, med, q3 = (float(v) for v in np.percentile(x, [25, 50, 75]))
        row: dict[str, Any] = {"median_ms": med, "iqr_ms": q3 - q1, "rounds_ms": [float(v) for v in x],
                               "first_call_s": side["compile_s"][0], "worker_ms": side["worker_ms"]}  # fmt: skip
        if not i:  # the base's processes (each mode's figure holds the same base spread)
            row["process_spread"] = m["figures"][0]["process_spread"]["base"]
        if i:
            fig, par = m["figures"][i - 1], m["parity"][i - 1]
            lo, hi = fig["ci95"]  # of the mode's time over the base's: a speedup is its inverse
            row["speedup_vs_base"] = 1.0 / fig["ratio"]
            row["speedup_ci95"] = (1.0 / hi, 1.0 / lo)
            row["process_spread"] = fig["process_spread"]["new"]
            row["parity_vs_base"] = {
                "ok": par["ok"],
                "max_abs_err": par["max_abs_err"] if par["ok"] else None,
            }
        rows[mode] = row
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
            "processes": m["processes"],
            "round_warmup_ms": m["round_warmup_ms"],
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
    where = (
        f"{cfg['nproc']} ranks in one torchrun job ({doc.get('plan_summary', 'sharded')}), slowest rank per step"
        if cfg.get("nproc", 1) > 1
        else f"{cfg.get('processes', 1)} worker process(es) per mode"
    )
    lines = [
        f"{doc['model']}/{doc['scale']}/{doc['phase']}, {cfg['rounds']} rounds x {cfg['steps']} steps, "
        f"{where}, interleaved; speedup = {base} ms / mode ms, per round",
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
    if cfg.get("nproc", 1) == 1:
        lines += ["", _process_line(doc)]
    return "\n".join(lines)


def _process_line(doc: dict[str, Any]) -> str:
    """How far each mode's worker processes differed, or why that is unknown.

    WHY printed with every ``ab``: two compiled processes of one graph can differ by several
    percent on a CPU (22.2% on deepctr.DIFM inference here), more than the interval above,
    which covers the rounds of these processes only. A reader of a one-process figure near a line needs
    to know that it holds one compile a mode."""
    if doc["config"].get("processes", 1) < 2:
        return ("One worker process a mode: the interval covers the rounds, not the compiles; "
                "`--processes 2` shows how far two compiled processes of a mode differ.")  # fmt: skip
    spreads = [f"{mode} {r['process_spread']:.1%}" for mode, r in doc["modes"].items()
               if r.get("process_spread") is not None]  # fmt: skip
    return f"Processes of a mode apart (slowest over fastest): {', '.join(spreads) or 'not recorded'}."
