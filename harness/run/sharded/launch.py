"""The parent half of a sharded cell: plan, start torchrun, wait, clean up, merge.

Why this shape: torchrun itself stops the remaining ranks when one exits non-zero, and the
process-group timeout makes a peer of a hung rank fail instead of waiting forever; the
cell's own timeout is the last line, and on it (or on any exit) every process of the cell
is killed, found through the launcher's tree and the environment mark they all inherit
(``harness.run.sharded.procs``). The ranks' own files, not torchrun's exit status, say what
happened (``harness.run.sharded.merge``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.run.process_env import child_env
from harness.run.sharded import merge, procs
from harness.run.sharded import plan as planmod
from harness.spec import CellKey
from harness.store import cell_record

DEFAULT_PG_TIMEOUT_S = 120.0
KEEP_LOG_ENV = "OPTIMUS_BENCH_SHARDED_LOGS"  # a directory: keep each cell's torchrun log there


def plan_for(config: dict[str, Any], model: str) -> dict[str, Any]:
    """Build ``model`` here (the parent) and plan its tables over ``config['nproc']`` ranks."""
    from harness.run.cell import build_model

    b = build_model(config["provider"], model, config["scale"], "cpu", int(config["seed"]))
    doc = planmod.make_plan(
        b.module, int(config["nproc"]), str(config.get("sharding") or "auto"), config.get("device", "cpu")
    )
    doc["model"] = model
    return doc


RANK_MODULE = "harness.run.sharded.rank"
QUALITY_RANK_MODULE = "harness.run.sharded.quality_rank"  # a quality run's cell (``run --quality``)


def torchrun_cmd(nproc: int, spec_path: Path, out_dir: Path, module: str = RANK_MODULE) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--max-restarts", "0", "--monitor-interval", "0.5",
        "-m", module, str(spec_path), str(out_dir),
    ]  # fmt: skip


@dataclass
class Job:
    """What a finished (or killed) torchrun job left: each rank's record and progress, the log."""

    recs: dict[int, dict[str, Any]]
    prog: dict[int, dict[str, Any]]
    log_text: str
    rc: int
    timed_out: bool


def run_job(spec: dict[str, Any], nproc: int, config: dict[str, Any], timeout_s: float, label: str,
            module: str = RANK_MODULE) -> Job:  # fmt: skip
    """``module`` on ``nproc`` ranks under torchrun with ``spec``; every process of the job is
    killed when it ends, fails or passes ``timeout_s``. Never raises on a rank's fault."""
    with tempfile.TemporaryDirectory(prefix="optimus-bench-sharded-") as tmp:
        spec_path, out_dir, log_path = Path(tmp, "spec.json"), Path(tmp, "ranks"), Path(tmp, "torchrun.log")
        out_dir.mkdir()
        spec_path.write_text(json.dumps(spec))
        cell_id = uuid.uuid4().hex
        env = child_env(str(Path(tmp, "inductor-cache")), int(config.get("threads") or 0))
        env[procs.CELL_ID_ENV] = cell_id
        env.setdefault("OMP_NUM_THREADS", "1")
        env["TORCHELASTIC_ERROR_FILE"] = str(Path(tmp, "error.json"))
        timed_out = False
        with open(log_path, "wb") as log:
            from harness.env import REPO_ROOT

            proc = subprocess.Popen(
                torchrun_cmd(nproc, spec_path, out_dir, module), stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=str(REPO_ROOT), start_new_session=True,
            )  # fmt: skip
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out, rc = True, -9
            except BaseException:
                procs.kill_cell(proc.pid, cell_id)
                proc.wait()
                raise
            finally:
                procs.kill_cell(proc.pid, cell_id)  # ranks outlive torchrun's group: sweep by mark
                proc.wait()
        log_text = log_path.read_text(errors="replace")
        keep = os.environ.get(KEEP_LOG_ENV)
        if keep:  # the whole torchrun log of every cell, for debugging a rank
            Path(keep).mkdir(parents=True, exist_ok=True)
            Path(keep, f"{label.replace('/', '_')}.log").write_text(log_text)
        recs, prog = merge.read_ranks(out_dir, nproc)
    return Job(recs, prog, log_text, rc, timed_out)


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_sharded(
    key: CellKey, config: dict[str, Any], timeout_s: float, plan_doc: dict[str, Any] | None
) -> dict[str, Any]:
    """One sharded cell as one torchrun job; always returns a cell (never raises on a fault)."""

    nproc = int(config["nproc"])
    cell = cell_record.empty(key)
    cell.update({"nproc": nproc, "sharding": config.get("sharding") or "auto"})
    t0 = time.perf_counter()
    if plan_doc is None:
        try:
            plan_doc = plan_for(config, key.model)
        except planmod.PlanError as e:
            cell["error"] = f"planner: {e}"
            cell["wall_s"] = time.perf_counter() - t0
            return cell
    cell["plan"] = plan_doc
    cell["plan_summary"] = planmod.describe(plan_doc)
    pg_timeout = float(config.get("pg_timeout_s") or DEFAULT_PG_TIMEOUT_S)
    spec = {"model": key.model, "scale": key.scale, "mode": key.mode, "phase": key.phase,
            "config": {**config, "pg_timeout_s": pg_timeout}, "plan": plan_doc}  # fmt: skip
    module = QUALITY_RANK_MODULE if config.get("quality_steps") else RANK_MODULE
    job = run_job(spec, nproc, config, timeout_s, key.label(), module)
    recs, prog, log_text, rc, timed_out = job.recs, job.prog, job.log_text, job.rc, job.timed_out
    cell["wall_s"] = time.perf_counter() - t0
    cell["finished_at"] = time.time()
    finished = ("ok", "mismatch", "quality_mismatch")
    all_done = len(recs) == nproc and all(r.get("status") in finished for r in recs.values())
    if all_done and not timed_out:
        merge.merge(cell, recs, nproc)
        if rc != 0:
            cell["torchrun_rc"] = rc
        if cell["status"] != "ok":
            cell["log_tail"] = _tail(log_text)
        return cell
    culprit, reason = merge.diagnose(recs, prog, log_text, nproc, timed_out, timeout_s, pg_timeout)
    cell["status"] = "timeout" if timed_out else "failed"
    prefix = f"cell did not finish within {timeout_s:g} s and was killed; " if timed_out else ""
    cell["error"] = prefix + reason
    cell["failed_rank"] = culprit
    cell["ranks"] = [
        {"rank": r, "status": (recs.get(r) or {}).get("status", "no record"), "error": (recs.get(r) or {}).get("error"),
         "progress": prog.get(r)}
        for r in range(nproc)
    ]  # fmt: skip
    cell["torchrun_rc"] = rc
    cell["log_tail"] = _tail(log_text, 20)
    return cell
