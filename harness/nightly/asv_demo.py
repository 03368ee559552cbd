"""The demo asv dashboard of a synthetic nightly history, built and marked (no screenshot).

Why here and not in the script: ``scripts/asv_changes_demo.py`` (the command line, which also
renders the screenshot) and the dashboard test both need the build step, and tests import the
harness, never scripts. The committed demo history's nights have made-up commits and were never
run by asv, so this makes a throw-away git repository with one commit per night, writes asv
result files for those commits straight from the history, runs ``asv publish`` and marks the
change points (``harness.nightly.asv_marks``, the same step as ``optimus-bench changes --asv-html``).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.env import REPO_ROOT
from harness.nightly.asv_marks import benchmark_of, mark_dashboard, marks_of
from harness.nightly.changes import analyse_history
from harness.nightly.job import load_config
from harness.store.history_store import Night

MACHINE = "synthetic"
ENV_NAME = "virtualenv-py3.11"
PAGE = "#bench_compiled.CompiledCells.track_latency_ms"


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env, check=True)
    return proc.stdout.strip()


def make_repo(repo: Path, shas: list[str]) -> dict[str, str]:
    """One empty commit per night on ``main``, a day apart; history sha -> repo commit."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    start = dt.datetime(2026, 1, 1, 2, 17, tzinfo=dt.UTC)
    out = {}
    for i, sha in enumerate(shas):
        when = (start + dt.timedelta(days=i)).isoformat()
        env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_NAME": "demo",
               "GIT_AUTHOR_EMAIL": "demo@example.invalid", "GIT_COMMITTER_NAME": "demo",
               "GIT_COMMITTER_EMAIL": "demo@example.invalid"}  # fmt: skip
        git(repo, "commit", "-q", "--allow-empty", "-m", f"night {i + 1} (history sha {sha})", env=env)
        out[sha] = git(repo, "rev-parse", "HEAD")
    return out


def write_asv_results(results: Path, nights: list[Night], commit_of: dict[str, str], repo: Path) -> None:
    """asv's result files (api version 2) for each night's ok cells: median latency per cell."""
    cells = sorted(
        {(c["model"], c["scale"], c["phase"], c["mode"]) for n in nights for c in n.results["cells"]}
    )
    params = [sorted({c[k] for c in cells}) for k in range(4)]
    bench = benchmark_of("latency_ms")
    assert bench is not None, "latency_ms has an asv benchmark (harness.metric_registry)"
    (results / MACHINE).mkdir(parents=True)
    (results / "benchmarks.json").write_text(json.dumps({
        bench: {"code": "demo: figures of the nightly history", "name": bench, "param_names":
                ["family", "scale", "phase", "mode"], "params": [[repr(v) for v in p] for p in params],
                "timeout": 60, "type": "track", "unit": "ms", "version": "demo"},
        "version": 2}))  # fmt: skip
    (results / MACHINE / "machine.json").write_text(json.dumps({
        "arch": "x86_64", "cpu": "synthetic", "machine": MACHINE, "num_cpu": "2", "os": "synthetic",
        "ram": "0", "version": 1}))  # fmt: skip
    for n in nights:
        sha = str(n.night["sha"])
        commit = commit_of[sha]
        by_key = {(c["model"], c["scale"], c["phase"], c["mode"]): c for c in n.results["cells"]}
        values = []
        for key in itertools.product(*params):
            c = by_key.get(key)
            values.append(c["latency_ms"]["median"] if c and c["status"] == "ok" else None)
        date = int(git(repo, "show", "-s", "--format=%ct", commit)) * 1000
        doc = {"commit_hash": commit, "env_name": ENV_NAME, "date": date,
               "params": {"machine": MACHINE, "python": "3.11"}, "python": "3.11", "requirements": {},
               "env_vars": {}, "result_columns": ["result", "params", "version"],
               "results": {bench: [values, [[repr(v) for v in p] for p in params], "demo"]},
               "durations": {}, "version": 2}  # fmt: skip
        (results / MACHINE / f"{commit[:8]}-{ENV_NAME}.json").write_text(json.dumps(doc))


def build(history: str, work: Path) -> tuple[Path, list[dict[str, Any]], list[str]]:
    """Publish the dashboard of ``history`` under ``work`` and mark it: (html dir, marks, skipped)."""
    cfg = load_config(REPO_ROOT / "benchmarks" / "nightly_thresholds.json").changes
    found, nights, _left_out, _machine = analyse_history(history, cfg)
    repo = work / "repo"
    commit_of = make_repo(repo, [str(n.night["sha"]) for n in nights])
    write_asv_results(work / "results", nights, commit_of, repo)
    conf = {"version": 1, "project": "optimus-bench (demo history)", "project_url": "", "repo": str(repo),
            "dvcs": "git", "branches": ["main"], "environment_type": "virtualenv", "pythons": ["3.11"],
            "results_dir": str(work / "results"), "html_dir": str(work / "html")}  # fmt: skip
    (work / "asv.conf.json").write_text(json.dumps(conf))
    pub = subprocess.run([sys.executable, "-m", "asv", "publish", "--config", str(work / "asv.conf.json")],
                         cwd=work, capture_output=True, text=True, timeout=600)  # fmt: skip
    if pub.returncode != 0:
        raise SystemExit(f"asv_changes_demo: asv publish failed:\n{pub.stdout[-2000:]}{pub.stderr[-2000:]}")
    marked = mark_dashboard(work / "html", marks_of(found, commit_of, cfg.policy.dedupe))
    return work / "html", marked.placed, marked.skipped
