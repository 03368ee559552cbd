"""Sharded cells beside the single-process cells of the same model, mode and phase.

    python -m harness.report.sharded_table --sharded S1.json [S2.json ...] --single P1.json [...]

Why: the question a sharded run answers is "what does N ranks cost or save against one
process", per rank and for the slowest rank; this puts both runs' figures in one markdown
table (median with q1-q3 spread, compile time, peak memory, the plan)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness.modes import mode_registry
from harness.spec import PHASES, CellKey
from harness.store import results


def _ms(lat: dict[str, Any] | None) -> str:
    if not lat:
        return "-"
    return f"{lat['median']:.2f} ({lat['q1']:.2f}-{lat['q3']:.2f})"


def _s(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def _mib(v: Any) -> str:
    return "-" if v is None else f"{v / 2**20:.1f}"


def _status(c: dict[str, Any]) -> str:
    if c["status"] == "ok":
        return "ok"
    if c["status"] == "mismatch" and c.get("max_abs_err") is not None:
        return f"mismatch (max abs err {c['max_abs_err']:.3g})"
    return f"{c['status']}: {str(c.get('error'))[:80]}".replace("|", "\\|")


def _load(c: dict[str, Any] | None) -> str:
    """The 1-minute load average the cell saw before timing (max over ranks)."""
    if c is None:
        return "-"
    vals = [r.get("loadavg_1m") for r in c.get("ranks") or []] + [c.get("loadavg_1m")]
    vals = [v for v in vals if v is not None]
    return f"{max(vals):.1f}" if vals else "-"


def rows(sharded: list[dict[str, Any]], single: list[dict[str, Any]]) -> list[str]:
    cells: dict[CellKey, dict[str, Any]] = {}
    for d in sharded:
        cells.update(results.cell_map(d))
    base: dict[CellKey, dict[str, Any]] = {}
    for d in single:
        base.update(results.cell_map(d))
    order = {m: i for i, m in enumerate(mode_registry.names())}
    keys = sorted(cells, key=lambda k: (k.model, PHASES.index(k.phase), order.get(k.mode, 99)))
    out = [
        "| model | phase | mode | plan | slowest rank ms | rank 0 ms | rank 1 ms | compile s (r0 / r1) "
        "| peak MiB (r0 / r1) | single ms | single compile s | single peak MiB | sharded / single | load 1m "
        "(sharded / single) | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k in keys:
        c = cells[k]
        ranks = c.get("ranks") or []
        lat = [r.get("latency_ms") for r in ranks] + [None, None]
        comp = " / ".join(_s(r.get("compile_s")) for r in ranks) or "-"
        mem = " / ".join(_mib(r.get("peak_mem_bytes")) for r in ranks) or "-"
        b = base.get(k)
        ratio = "-"
        if b and b["status"] == "ok" and c["status"] == "ok":
            ratio = f"{c['latency_ms']['median'] / b['latency_ms']['median']:.2f}"
        single_status = "" if b is None or b["status"] == "ok" else f"; single {b['status']}"
        out.append(
            f"| {k.model} | {k.phase} | {k.mode} | {c.get('plan_summary') or '-'} | {_ms(c.get('latency_ms'))} "
            f"| {_ms(lat[0])} | {_ms(lat[1])} | {comp} | {mem} "
            f"| {_ms(b.get('latency_ms') if b else None)} | {_s(b.get('compile_s') if b else None)} "
            f"| {_mib(b.get('peak_mem_bytes') if b else None)} | {ratio} | {_load(c)} / {_load(b)} "
            f"| {_status(c)}{single_status} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.report.sharded_table", description=__doc__)
    p.add_argument("--sharded", nargs="+", required=True, help="results files of run --nproc N")
    p.add_argument("--single", nargs="*", default=[], help="results files of the single-process runs")
    args = p.parse_args(argv)
    try:
        sharded = [results.load(f) for f in args.sharded]
        single = [results.load(f) for f in args.single]
    except results.ResultsError as e:
        print(f"harness.report.sharded_table: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(rows(sharded, single)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
