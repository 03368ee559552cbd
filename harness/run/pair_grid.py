"""A grid of paired cells (models x modes x phases) between two checkouts, as a results file.

Why a results file like ``run``'s: ``compare``, ``report`` and the history read it without a
second format. Each cell is the new side's figures (latency from the paired rounds, peak memory,
compile time) plus what only a pair knows: ``base_sha``, ``new_sha``, ``paired_ratio`` (new time
over base time, above 1 is slower) with ``paired_ci95``, and under ``paired`` the rounds, the raw
per-round samples of both sides, the spread between processes, and the verdict.

A worker that crashes or hangs ends its cell as ``failed``, with the side named; the other cells
go on (a crash in one cell never loses the others). The file is rewritten atomically after every
cell.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from harness.env import collect_env
from harness.measure import timing
from harness.run import cell as cell_mod
from harness.run.checkouts import Checkout
from harness.run.paired import PairOptions, SideSpec, WorkerError, run_pair
from harness.store import results

VERDICTS = ("slower", "not slower", "undecided", "unstable")


def verdict(pair: dict[str, Any], threshold: float) -> str:
    """``slower``: the whole 95% interval of the ratio lies above 1 + threshold; ``not slower``:
    all of it below; ``undecided``: it straddles the threshold (measure more rounds);
    ``unstable``: a side's processes disagree beyond the process-spread limit (not judged)."""
    if not pair["stable"]:
        return "unstable"
    lo, hi = pair["ci95"]
    if lo > 1 + threshold:
        return "slower"
    if hi < 1 + threshold:
        return "not slower"
    return "undecided"


def as_cell(key: tuple[str, str, str, str], pair: dict[str, Any], threshold: float) -> dict[str, Any]:
    """The results-file cell of a finished pair (the new side's figures, and the pair's)."""
    model, scale, mode, phase = key
    new, base = pair["new"], pair["base"]
    parity = pair.get("parity") or {"ok": True, "max_abs_err": None}
    cell: dict[str, Any] = {
        "model": model, "scale": scale, "mode": mode, "phase": phase,
        "status": "ok" if parity["ok"] else "mismatch",
        "error": None if parity["ok"] else f"first output differs from base {base['sha'][:12]}'s beyond the tolerance",
        "latency_ms": timing.summarize(new["ms"]),
        "peak_mem_bytes": new["peak_mem_bytes"],
        "compile_s": float(np.median(new["compile_s"])),
        "optimus_s": None, "nodes_before": None, "nodes_after": None,
        "max_abs_err": parity["max_abs_err"],
        "base_sha": base["sha"], "new_sha": new["sha"],
        "paired_ratio": pair["ratio"], "paired_ci95": pair["ci95"],
    }  # fmt: skip
    rest = {k: v for k, v in pair.items() if k not in ("ratio", "ci95")}
    rest["verdict"] = verdict(pair, threshold)
    rest["threshold"] = threshold
    b_mem, n_mem = base["peak_mem_bytes"], new["peak_mem_bytes"]
    same_method = all(base[k] == new[k] for k in ("peak_mem_method", "peak_mem_static_counted"))
    rest["peak_mem_ratio"] = n_mem / b_mem if b_mem and n_mem and same_method else None
    rest["compile_ratio"] = float(np.median(new["compile_s"]) / np.median(base["compile_s"]))
    cell["paired"] = rest
    return cell


def failed_cell(key: tuple[str, str, str, str], error: str, base: str, new: str) -> dict[str, Any]:
    model, scale, mode, phase = key
    return {
        "model": model, "scale": scale, "mode": mode, "phase": phase, "status": "failed",
        "error": error, "latency_ms": None, "peak_mem_bytes": None, "compile_s": None,
        "optimus_s": None, "nodes_before": None, "nodes_after": None, "max_abs_err": None,
        "base_sha": base, "new_sha": new, "paired_ratio": None, "paired_ci95": None,
    }  # fmt: skip


def run_grid(
    base: Checkout,
    new: Checkout,
    cells: Sequence[tuple[str, str, str, str]],
    opt: PairOptions,
    *,
    threshold: float,
    out: str | None,
    base_env: dict[str, str] | None = None,
    new_env: dict[str, str] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Pair every cell (model, scale, mode, phase) of ``base`` against ``new``."""
    config = {"kind": "pair", "base_sha": base.sha, "new_sha": new.sha, "threshold": threshold, **asdict(opt)}
    doc = results.new_results(collect_env(opt.device), config)
    doc["env"]["git"] = {**(doc["env"].get("git") or {}), "commit": new.sha, "base_commit": base.sha}

    def close(a: Any, b: Any) -> tuple[bool, float]:
        ok = cell_mod.close(a, b, opt.atol, opt.rtol)
        return ok, cell_mod.max_err(a, b)

    t0 = time.perf_counter()
    for i, key in enumerate(cells, 1):
        model, scale, mode, phase = key
        log(f"[pair] cell {i}/{len(cells)}: {model}/{scale}/{mode}/{phase}")
        sides = (
            SideSpec("base", base, mode, dict(base_env or {})),
            SideSpec("new", new, mode, dict(new_env or {})),
        )
        try:
            pair = run_pair(
                (model, scale, phase), sides, opt, log=log, close=close, max_rounds=opt.max_rounds,
                undecided=lambda fig: verdict({**fig, "stable": True}, threshold) == "undecided",
            )  # fmt: skip
            cell = as_cell(key, pair, threshold)
        except WorkerError as e:
            cell = failed_cell(key, str(e), base.sha, new.sha)
        results.upsert_cell(doc, cell)
        doc["wall_s"] = time.perf_counter() - t0
        if out:
            results.save_atomic(out, doc)
    return doc


def format_grid(doc: dict[str, Any]) -> str:
    """Markdown table of a paired grid."""
    cfg = doc["config"]
    lines = [
        f"base {cfg['base_sha'][:12]} -> new {cfg['new_sha'][:12]}: time ratio new / base per round "
        f"(above 1 is slower), {cfg['rounds']} rounds x {cfg['steps']} steps, threshold {cfg['threshold']:.1%}",
        "",
        "| cell | base ms | new ms | ratio (95% CI) | process spread base / new | memory | compile | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in doc["cells"]:
        name = f"{c['model']}/{c['scale']}/{c['mode']}/{c['phase']}"
        p = c.get("paired")
        if c["status"] == "failed" or not p:
            lines.append(f"| {name} | - | - | - | - | - | - | **{c['status']}**: {c['error']} |")
            continue
        lo, hi = c["paired_ci95"]
        b_ms, n_ms = float(np.median(p["base"]["ms"])), float(np.median(p["new"]["ms"]))
        mem = f"{p['peak_mem_ratio']:.3f}x" if p.get("peak_mem_ratio") else "-"
        sb, sn = p["process_spread"]["base"], p["process_spread"]["new"]
        v = p["verdict"] if c["status"] == "ok" else f"{p['verdict']}, **{c['status']}**"
        lines.append(
            f"| {name} | {b_ms:.3f} | {n_ms:.3f} | {c['paired_ratio']:.3f} ({lo:.3f}-{hi:.3f}) | "
            f"{sb:.1%} / {sn:.1%} | {mem} | {p['compile_ratio']:.2f}x | {v} |"
        )
    return "\n".join(lines)
