"""The first commit where a cell got slower: a binary search over the commits between GOOD and
BAD, each step a paired measurement of the midpoint against GOOD (``harness.run.pair_grid``).

Why against GOOD and not against the neighbour: every step then answers the same question ("is
this commit slower than the known-good one beyond the threshold?"), so a slowdown made of two
small steps is still found at the commit that crossed the threshold. Why paired: the step's
verdict is the whole 95% interval of the per-round ratio, measured side by side, and a step
whose interval straddles the threshold times more rounds before it decides.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.run import checkouts, pair_grid
from harness.run.paired import PairOptions


class BisectError(ValueError):
    """GOOD and BAD do not bracket a slowdown of the cell (one line; bad input)."""


class StepFailed(RuntimeError):
    """A step's pair could not be measured (a worker crashed, hung or mismatched)."""


def _measure(
    repo: Path, good: str, sha: str, key: tuple[str, str, str, str], opt: PairOptions, threshold: float,
    log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    with checkouts.checked_out(repo, [good, sha]) as (g, s):
        doc = pair_grid.run_grid(g, s, [key], opt, threshold=threshold, out=None, log=log)
    cell: dict[str, Any] = doc["cells"][0]
    if cell["status"] != "ok":
        raise StepFailed(f"commit {sha[:12]}: the cell could not be measured: {cell['error']}")
    return cell


def _step(sha: str, cell: dict[str, Any], threshold: float) -> dict[str, Any]:
    p = cell["paired"]
    v = p["verdict"]
    slower = v == "slower" or (v in ("undecided", "unstable") and cell["paired_ratio"] > 1 + threshold)
    return {
        "commit": sha, "ratio": cell["paired_ratio"], "ci95": cell["paired_ci95"], "rounds": p["rounds"],
        "verdict": v, "slower": slower, "decided_by": "interval" if v in ("slower", "not slower") else "median",
    }  # fmt: skip


def bisect(
    repo: Path,
    good: str,
    bad: str,
    key: tuple[str, str, str, str],
    opt: PairOptions,
    *,
    threshold: float,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Find the first commit after ``good`` up to ``bad`` whose cell ``key`` (model, scale, mode,
    phase) is slower than at ``good`` by more than ``threshold``."""
    commits = checkouts.commits_between(repo, good, bad)
    if not commits:
        raise BisectError(f"BAD {bad!r} is GOOD {good!r}: no commit between them")
    good_sha = checkouts.resolve(repo, good)
    steps: list[dict[str, Any]] = []
    measured: dict[str, dict[str, Any]] = {}

    def is_slower(i: int) -> bool:
        sha = commits[i]
        log(f"[bisect] step {len(steps) + 1}: {sha[:12]} ({i + 1} of {len(commits)} after GOOD) against GOOD")
        step = _step(sha, _measure(repo, good_sha, sha, key, opt, threshold, log), threshold)
        steps.append(step)
        measured[sha] = step
        lo, hi = step["ci95"]
        log(
            f"[bisect]   {step['ratio']:.3f}x ({lo:.3f}-{hi:.3f}), {step['rounds']} rounds: {step['verdict']}"
        )
        return bool(step["slower"])

    if not is_slower(len(commits) - 1):
        s = steps[-1]
        raise BisectError(
            f"BAD {bad!r} is not slower than GOOD beyond {threshold:.1%}: {s['ratio']:.3f}x "
            f"({s['ci95'][0]:.3f}-{s['ci95'][1]:.3f}); nothing to bisect"
        )
    lo, hi = -1, len(commits) - 1  # commits[lo] (or GOOD) is not slower; commits[hi] is
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if is_slower(mid):
            hi = mid
        else:
            lo = mid
    first = commits[hi]
    before = commits[lo] if lo >= 0 else good_sha
    return {
        "kind": "optimus-bench-bisect",
        "cell": dict(zip(("model", "scale", "mode", "phase"), key, strict=True)),
        "good": good_sha, "bad": commits[-1], "threshold": threshold, "commits": len(commits),
        "first_slower": first, "parent": before, "steps": steps,
        "confidence": confidence(first, before, measured, threshold),
    }  # fmt: skip


def confidence(first: str, before: str, measured: dict[str, dict[str, Any]], threshold: float) -> str:
    """One sentence: how sure the answer is, from the two steps that bound it."""
    f = measured[first]
    parts = [f"{first[:12]} is {f['ratio']:.3f}x GOOD's time ({f['ci95'][0]:.3f}-{f['ci95'][1]:.3f}, 95%)"]
    b = measured.get(before)
    if b is not None:
        parts.append(f"its parent {before[:12]} is {b['ratio']:.3f}x ({b['ci95'][0]:.3f}-{b['ci95'][1]:.3f})")
    else:
        parts.append(f"its parent {before[:12]} is GOOD itself")
    weak = [s for s in measured.values() if s["decided_by"] == "median"]
    if weak:
        where = ", ".join(s["commit"][:12] for s in weak)
        tail = (
            f"low confidence: at {where} the interval still straddled {1 + threshold:.3f} after the most "
            f"rounds, and the median decided"
        )
    else:
        tail = f"every step's whole 95% interval lay on one side of {1 + threshold:.3f}"
    return "; ".join(parts) + "; " + tail + "."


def format_bisect(doc: dict[str, Any]) -> str:
    c = doc["cell"]
    lines = [
        f"bisect {c['model']}/{c['scale']}/{c['mode']}/{c['phase']}: {doc['commits']} commits after GOOD "
        f"{doc['good'][:12]}, threshold {doc['threshold']:.1%}",
        "",
        "| step | commit | time vs GOOD (95% CI) | rounds | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    for i, s in enumerate(doc["steps"], 1):
        lo, hi = s["ci95"]
        lines.append(
            f"| {i} | {s['commit'][:12]} | {s['ratio']:.3f}x ({lo:.3f}-{hi:.3f}) | {s['rounds']} | {s['verdict']} |"
        )
    lines += ["", f"first slower commit: {doc['first_slower']}", doc["confidence"]]
    return "\n".join(lines)
