"""The paper-style figures: what compile+optimus gains over compile and over the peer.

Why a module of its own: ``reproduce`` prints it, ``report`` writes it, and the asv suite
tracks the same numbers; all three call ``paper_rows``. A figure is only produced when both
cells are ``ok`` (parity held): a mismatched or failed cell is shown by its status and never
as a speedup.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.measure import limit
from harness.modes.mode_registry import BASELINES, EAGER_TARGET, REFERENCE, TARGET
from harness.spec import CellKey
from harness.stats import bootstrap_median_ratio
from harness.store.results import cell_map

# The paper's headline figures (Optimus, MLSys): the targets the table is read against.
PAPER = {
    "speedup": "up to 63% faster (1.63x)",
    "memory": "~6% less peak memory",
    "compile": ">400 s less compile time",
}
NOISY = 0.25  # IQR / median above which a latency is marked noisy


def speedup(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """base median / new median, with a bootstrap 95% CI (as a speedup, >1 = faster)."""
    b, n = base["latency_ms"]["samples"], new["latency_ms"]["samples"]
    lo, hi = bootstrap_median_ratio(b, n)  # of new/base
    return {"x": float(np.median(b) / np.median(n)), "lo": 1.0 / hi, "hi": 1.0 / lo}


def _pct(base: float | None, new: float | None) -> float | None:
    if base is None or new is None or base == 0:
        return None
    return (new / base - 1.0) * 100.0


def paired_speedups(doc: dict[str, Any]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """The side-by-side speedups ``reproduce`` measured (``harness.run.paired_modes``), by
    (model, scale, phase, baseline)."""
    out = {}
    for p in doc.get("paired_speedups") or []:
        if "speedup" in p:
            lo, hi = p["ci95"]
            out[(p["model"], p["scale"], p["phase"], p["against"])] = {
                "x": p["speedup"], "lo": lo, "hi": hi, "paired": True, "stable": p["stable"],
            }  # fmt: skip
    return out


def paper_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (model, phase) present in ``doc``: compile+optimus against its baselines. A
    speedup measured side by side is used where there is one (marked ``paired``); otherwise the
    ratio of the two cells."""
    cells = cell_map(doc)
    paired = paired_speedups(doc)
    pairs = sorted({(k.model, k.scale, k.phase) for k in cells}, key=lambda t: (t[0], t[2] != "infer", t[1]))
    rows = []
    for model, scale, phase in pairs:
        get = {
            m: cells.get(CellKey(model, scale, m, phase))
            for m in (REFERENCE, EAGER_TARGET, *BASELINES, TARGET)
        }
        row: dict[str, Any] = {"model": model, "scale": scale, "phase": phase}
        for m, c in get.items():
            row[f"{m} status"] = None if c is None else c["status"]
            row[f"{m} ms"] = c["latency_ms"]["median"] if c and c["status"] == "ok" else None
            row[f"{m} iqr"] = c["latency_ms"]["iqr"] if c and c["status"] == "ok" else None
        t = get[TARGET]
        for base_mode in BASELINES:
            bcell = get[base_mode]
            key = "vs " + base_mode
            if t is None or bcell is None:
                row[key] = None
                continue
            if t["status"] != "ok" or bcell["status"] != "ok":
                row[key] = {
                    "status": t["status"] if t["status"] != "ok" else f"{base_mode} {bcell['status']}"
                }
                continue
            row[key] = paired.get((model, scale, phase, base_mode)) or speedup(bcell, t)
        c = get[BASELINES[0]]
        ok = t is not None and c is not None and t["status"] == "ok" and c["status"] == "ok"
        row["mem_change_pct"] = (
            _pct(c.get("peak_mem_bytes"), t.get("peak_mem_bytes")) if ok and c and t else None
        )
        if (
            ok
            and c is not None
            and t is not None
            and c.get("compile_s") is not None
            and t.get("compile_s") is not None
        ):
            row["compile_s"] = (c["compile_s"], t["compile_s"])
            row["compile_change_s"] = t["compile_s"] - c["compile_s"]
            row["compile_change_pct"] = _pct(c["compile_s"], t["compile_s"])
        else:
            row["compile_s"] = row["compile_change_s"] = row["compile_change_pct"] = None
        row["limit"] = limit.summary(c, t)  # the ideal time of compile's groups batched (--limit)
        eo, e = get[EAGER_TARGET], get[REFERENCE]
        row["eager speedup"] = speedup(e, eo) if eo and e and eo["status"] == e["status"] == "ok" else None
        rows.append(row)
    return rows


def _sp(v: Any) -> str:
    if v is None:
        return "-"
    if "status" in v:
        return str(v["status"])
    mark = (" ‡" if v.get("stable", True) else " ‡ unstable") if v.get("paired") else ""
    return f"{v['x']:.2f}x ({v['lo']:.2f}-{v['hi']:.2f}){mark}"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_paper_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per model and phase, compile+optimus against compile and compile+peer (and, when
    the compile cells measured it, the limit: ideal speedup over compile and the headroom captured)."""
    with_limit = any(r.get("limit") for r in rows)
    lines = [
        f"| model | scale | phase | {BASELINES[0]} ms | {BASELINES[1]} ms | {TARGET} ms | speedup vs {BASELINES[0]} (95% CI) "
        f"| speedup vs {BASELINES[1]} (95% CI) | peak mem change | compile time {BASELINES[0]} -> optimus | compile time change |"
        + (f" ideal speedup vs {BASELINES[0]} | headroom captured |" if with_limit else ""),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        + (" --- | --- |" if with_limit else ""),
    ]
    for r in rows:

        def ms(m: str, r: dict[str, Any] = r) -> str:
            if r[f"{m} ms"] is None:
                return str(r[f"{m} status"] or "-")
            med, iqr = r[f"{m} ms"], r[f"{m} iqr"]
            noisy = " †" if iqr > NOISY * med else ""
            return f"{med:.3f} (IQR {iqr:.3f}){noisy}"

        cs = r["compile_s"]
        ctime = "-" if cs is None else f"{cs[0]:.1f} s -> {cs[1]:.1f} s"
        cchange = (
            "-"
            if r["compile_change_s"] is None
            else f"{r['compile_change_s']:+.1f} s ({r['compile_change_pct']:+.0f}%)"
        )
        mem = "-" if r["mem_change_pct"] is None else f"{r['mem_change_pct']:+.1f}%"
        lines.append(
            f"| {r['model']} | {r['scale']} | {r['phase']} | {ms(BASELINES[0])} | {ms(BASELINES[1])} | {ms(TARGET)} "
            f"| {_sp(r['vs ' + BASELINES[0]])} | {_sp(r['vs ' + BASELINES[1]])} | {mem} | {ctime} | {cchange} |"
            + (f" {_limit_text(r.get('limit'))} |" if with_limit else "")
        )
    lines.append("")
    lines.append(headline(rows))
    lines.append("")
    lines.append(
        f"Latency: median (interquartile range) of the timed steps in ms; † marks an IQR above {NOISY:.0%} "
        "of the median (other work on the machine: read that speedup with its interval). Speedup: median(base) / "
        "median(compile+optimus), 95% bootstrap interval in brackets; ‡ marks a speedup measured side by side "
        "(the modes in worker processes of their own, timed in alternating rounds: the median of the per-round "
        "ratios and its interval; 'unstable' when one mode's processes disagreed beyond the limit); a cell that failed or did not match "
        "eager shows its status instead. Compile time: first call with the FX graph and other compile "
        "caches off, minus one steady-state step."
        + (
            " Ideal speedup: compile's step time over the limit (its fusable groups as one ideal batched "
            "kernel each, pre-stacked weights); headroom captured: (compile - compile+optimus) / "
            "(compile - ideal) (docs/harness.md, 'The limit')."
            if with_limit
            else ""
        )
    )
    return "\n".join(lines)


def _limit_text(lim: dict[str, Any] | None) -> str:
    """'ideal speedup | captured' cells of one row."""
    if not lim:
        return "- | -"
    ideal = "-" if lim.get("ideal_speedup") is None else f"{lim['ideal_speedup']:.2f}x"
    cap = lim.get("captured")
    if cap is None:
        cap_text = "- (no headroom)" if lim.get("target_ms") is not None else "-"
    else:
        cap_text = f"{cap:.0%}"
    return f"{ideal} | {cap_text}"


def headline(rows: list[dict[str, Any]]) -> str:
    """Our best figures beside the paper's headline figures."""
    sps = [r["vs compile"]["x"] for r in rows if r["vs compile"] and "x" in r["vs compile"]]
    mems = [r["mem_change_pct"] for r in rows if r["mem_change_pct"] is not None]
    comp = [r["compile_change_s"] for r in rows if r["compile_change_s"] is not None]
    ours_sp = (
        f"up to {max(sps):.2f}x ({(max(sps) - 1) * 100:+.0f}%), median {float(np.median(sps)):.2f}x"
        if sps
        else "n/a"
    )
    ours_mem = f"{min(mems):+.1f}% best, {float(np.median(mems)):+.1f}% median" if mems else "n/a"
    ours_comp = f"{min(comp):+.1f} s best, {float(np.median(comp)):+.1f} s median" if comp else "n/a"
    return "\n".join(
        [
            "| headline | paper | this run |",
            "| --- | --- | --- |",
            f"| speedup of compile+optimus over compile | {PAPER['speedup']} | {ours_sp} |",
            f"| peak memory change | {PAPER['memory']} | {ours_mem} |",
            f"| compile time change | {PAPER['compile']} | {ours_comp} |",
        ]
    )
