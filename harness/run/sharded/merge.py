"""Per-rank records -> one cell; and, when the job failed, which rank failed and why.

Why the slowest rank: every step ends in collectives, so the job is as fast as its slowest
rank at each step; rank 0's own samples would hide a straggler. The cell's latency samples
are the maximum over ranks at every step index (the ranks start each timed step together,
``harness.run.sharded.rank.timed_steps``), and each rank's own samples stay in ``ranks``.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
from pathlib import Path
from typing import Any

from harness.measure import timing

# Errors a rank raises because a peer is gone or late, not because of itself.
PEER_ERROR = re.compile(
    r"timed out|timeout|connection closed|connection reset|broken pipe|peer|DistBackendError|"
    r"ProcessGroup|SIGTERM|Signal 15",
    re.IGNORECASE,
)
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def read_ranks(out_dir: Path, nproc: int) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """(records, progress) of every rank that wrote one."""
    recs: dict[int, dict[str, Any]] = {}
    prog: dict[int, dict[str, Any]] = {}
    for r in range(nproc):
        for name, into in ((f"rank{r}.json", recs), (f"rank{r}.progress.json", prog)):
            with contextlib.suppress(OSError, json.JSONDecodeError):
                into[r] = json.loads((out_dir / name).read_text())
    return recs, prog


def torchrun_exitcodes(log: str) -> tuple[dict[int, int], int | None]:
    """Exit codes torchrun reported per rank, and its 'Root Cause (first observed failure)' rank."""
    codes = {int(r): int(c) for r, c in _FAILURE.findall(log)}
    root = None
    i = log.find("Root Cause")
    if i >= 0:
        m = _FAILURE.search(log, i)
        root = int(m.group(1)) if m else None
    return codes, root


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _where(p: dict[str, Any] | None) -> str:
    if not p:
        return "before it reported any progress"
    step = p.get("step", -1)
    return f"in {p.get('phase')}" + (f" at step {step}" if step is not None and step >= 0 else "")


def diagnose(
    recs: dict[int, dict[str, Any]], prog: dict[int, dict[str, Any]], log: str, nproc: int,
    timed_out: bool, timeout_s: float, pg_timeout_s: float,
) -> tuple[int | None, str]:  # fmt: skip
    """(culprit rank, one-line reason) for a job that did not finish with every rank ok."""
    codes, root = torchrun_exitcodes(log)
    # 1. A rank that raised for a reason of its own (OOM, a model error): its own words.
    own = [
        r
        for r, rec in sorted(recs.items())
        if rec.get("status") == "failed" and not PEER_ERROR.search(str(rec.get("error")))
    ]
    if own:
        r = own[0]
        where = recs[r].get("failed_in") or {}
        return r, f"rank {r} failed {_where(where)}: {str(recs[r].get('error'))[:300]}"
    # 2. A rank killed by a signal torchrun did not send (SIGKILL from outside, the OOM killer).
    silent = [r for r in range(nproc) if r not in recs]
    killed = [r for r in silent if codes.get(r, 0) < 0 and codes.get(r) != -signal.SIGTERM]
    if root is not None and root in killed:
        killed = [root] + [r for r in killed if r != root]
    if killed:
        r = killed[0]
        return (
            r,
            f"rank {r} was killed by {_signal_name(codes[r])} {_where(prog.get(r))} (exit code {codes[r]})",
        )
    # 3. A rank that stopped making progress (hung): the one furthest behind without a record.
    behind = [r for r in silent if r not in codes or codes[r] == -signal.SIGTERM]
    if behind:

        def order(r: int) -> tuple[int, int]:
            p = prog.get(r) or {}
            return (0 if p.get("phase") != "done" else 1, int(p.get("step", -1)))

        r = min(behind, key=order)
        peers = [q for q, rec in recs.items() if PEER_ERROR.search(str(rec.get("error")))]
        why = (
            f"its peers' collectives timed out after {pg_timeout_s:g} s (ranks {peers})"
            if peers
            else (
                f"the cell was killed at its {timeout_s:g} s timeout" if timed_out else "torchrun stopped it"
            )
        )
        return r, f"rank {r} hung {_where(prog.get(r))}: no progress, {why}"
    if recs:
        r = min(recs)
        return r, f"rank {r} failed: {str(recs[r].get('error'))[:300]}"
    return None, "no rank wrote a record or any progress"


def merge(cell: dict[str, Any], recs: dict[int, dict[str, Any]], nproc: int) -> dict[str, Any]:
    """Fill ``cell`` from the records of all ``nproc`` ranks (all present, and ok, mismatch or, in a
    quality cell, quality_mismatch)."""
    ranks = [recs[r] for r in range(nproc)]
    lists = [r["latency_ms"]["samples"] for r in ranks]
    n = min(len(s) for s in lists)
    slowest = [max(s[i] for s in lists) for i in range(n)]
    cell["latency_ms"] = timing.summarize(slowest)
    cell["latency_of"] = "slowest rank per step (max over ranks at each step index)"
    for name in ("compile_s", "first_call_s", "prepare_s", "build_s", "peak_mem_bytes", "max_abs_err"):
        vals = [r[name] for r in ranks if r.get(name) is not None]
        cell[name] = max(vals) if vals else None
    for name in ("graphs", "recompiles", "graph_breaks"):
        vals = [r[name] for r in ranks if r.get(name) is not None]
        cell[name] = max(vals) if vals else None
    first = ranks[0]
    # the guard's figures (optimus_guard, guard_*) are the first rank's on every rank (optimus.guard)
    for name in ("optimus_s", "nodes_before", "nodes_after", "rules_fired", "stop_reason", "optimus_graphs",
                 "optimus_path", "optimus_layout", "optimus_gradients", "relaid_groups", "peer_options",
                 "peak_mem_method", "optimus_guard", "guard_speedup", "guard_interval", "guard_rejected",
                 "guard_s"):  # fmt: skip
        if first.get(name) is not None:
            cell[name] = first[name]
    par = [r.get("parity") or {} for r in ranks]
    cell["parity"] = {
        "reference": par[0].get("reference") or "single-process eager, whole batches",
        "atol": par[0].get("atol"),
        "rtol": par[0].get("rtol"),
        "ranks_compared": nproc,
        **{
            k: max(p.get(k) or 0 for p in par)
            for k in ("max_out_err", "max_table_err", "max_param_err")
            if any(k in p for p in par)
        },
        **{
            k: sum(p.get(k) or 0 for p in par)
            for k in ("outputs_compared", "table_shards_compared")
            if any(k in p for p in par)
        },
    }
    if first.get("quality") is not None:  # a quality cell: rank 0 judged the gathered figures
        cell["quality"] = first["quality"]
    bad = [r for r in ranks if r.get("status") != "ok"]
    if bad:
        # a rank that differs from the reference outright outranks a loss curve that drifted
        worst = "mismatch" if any(r.get("status") == "mismatch" for r in bad) else "quality_mismatch"
        cell["status"] = worst
        cell["error"] = "; ".join(f"rank {r['rank']}: {r.get('error')}" for r in bad)[:1000]
    else:
        cell["status"] = "ok"
        cell["error"] = None
    cell["ranks"] = [_rank_entry(r) for r in ranks]
    splits = [r for r in ranks if r.get("step_split_ms")]
    if splits:  # the slowest rank's, as the latency: the others wait for it inside the collectives
        slow = max(splits, key=lambda r: r["step_split_ms"]["step"])
        cell["step_split_ms"] = slow["step_split_ms"]
        cell["step_split_rank"] = slow["rank"]
    return cell


def _rank_entry(r: dict[str, Any]) -> dict[str, Any]:
    keep = ("rank", "status", "error", "latency_ms", "first_call_s", "compile_s", "prepare_s", "graphs",
            "recompiles", "graph_breaks", "peak_mem_bytes", "peak_mem_static_bytes", "peak_mem_step_bytes",
            "peak_mem_steps", "peak_mem_step_min_bytes",
            "peak_mem_at", "max_abs_err", "parity", "shard", "build_s", "loadavg_1m", "step_split_ms")  # fmt: skip
    return {k: r.get(k) for k in keep}
