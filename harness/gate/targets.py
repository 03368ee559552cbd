"""The paper's performance goals (``--goals paper``), judged target by target from harness results files.

Why a command: the goals are ratios between modes of one ``reproduce`` run (speedup over compile,
compile time, peak memory, the peer, eager). Checking them by eye in four tables invites mistakes
and cherry-picking; ``optimus-bench targets RESULTS.json... [--json OUT]`` reads the committed JSON,
prints every figure it judged with its 95% interval, and says met / missed / no data. It never
fails a run (the goals are aims, not CI gates); ``--json`` writes the same verdicts for tooling.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from harness.report.paper import speedup
from harness.spec import CellKey
from harness.store.results import cell_map

SPEED_FAMILIES = ("towers", "mmoe")
SCALED_FAMILIES = ("towers", "mmoe", "dcn")
FLOOR = 0.97


@dataclass
class Verdict:
    """One judged figure: which target, which cell, the figure, and whether it holds."""

    target: str
    cell: str
    figure: str
    met: bool | None  # None: a cell is missing or not ok, so nothing can be said

    def row(self) -> str:
        state = {True: "met", False: "**missed**", None: "no data"}[self.met]
        return f"| {self.target} | {self.cell} | {self.figure} | {state} |"


def _ok(c: dict[str, Any] | None) -> bool:
    return c is not None and c.get("status") == "ok"


def _status(c: dict[str, Any] | None) -> str:
    return "missing" if c is None else str(c.get("status"))


def cell_pair(
    cells: dict[CellKey, dict[str, Any]], key: CellKey, base_mode: str, name: str
) -> tuple[dict[str, Any], dict[str, Any], str] | Verdict:
    """(base cell, new cell, label) when both are ok; else the no-data verdict saying why."""
    base = cells.get(CellKey(key.model, key.scale, base_mode, key.phase))
    new = cells.get(key)
    label = f"{key.model} {key.scale} {key.phase}"
    if base is None or new is None or not (_ok(base) and _ok(new)):
        return Verdict(name, label, f"{key.mode} {_status(new)}, {base_mode} {_status(base)}", None)
    return base, new, label


def speedup_verdict(
    cells: dict[CellKey, dict[str, Any]], key: CellKey, base_mode: str, goal: float, name: str
) -> Verdict:
    """Speedup of ``key``'s mode over ``base_mode`` (median ratio with 95% bootstrap CI) >= goal."""
    pair = cell_pair(cells, key, base_mode, name)
    if isinstance(pair, Verdict):
        return pair
    base, new, label = pair
    s = speedup(base, new)
    return Verdict(name, label, f"{s['x']:.2f}x ({s['lo']:.2f}-{s['hi']:.2f})", s["x"] >= goal)


def compile_time_verdict(
    cells: dict[CellKey, dict[str, Any]], key: CellKey, base_mode: str, goal: float, name: str
) -> Verdict:
    """compile_s of ``key`` / compile_s of ``base_mode`` <= goal."""
    pair = cell_pair(cells, key, base_mode, name)
    if isinstance(pair, Verdict):
        return pair
    base, new, label = pair
    if not base.get("compile_s") or new.get("compile_s") is None:
        return Verdict(name, label, "no compile time recorded", None)
    r = new["compile_s"] / base["compile_s"]
    return Verdict(
        name,
        label,
        f"{base['compile_s']:.1f} s -> {new['compile_s']:.1f} s ({(r - 1) * 100:+.0f}%)",
        r <= goal,
    )


def verdicts(docs: Iterable[dict[str, Any]]) -> list[Verdict]:
    """Every target of the paper's goals over every (model, scale, phase) the results hold."""
    cells: dict[CellKey, dict[str, Any]] = {}
    for doc in docs:
        cells.update(cell_map(doc))
    groups = sorted({(k.model, k.scale, k.phase) for k in cells})
    out: list[Verdict] = []
    opt = "compile+optimus"
    for model, scale, phase in groups:
        key = CellKey(model, scale, opt, phase)
        if model in SPEED_FAMILIES and scale in ("medium", "large"):
            goal = 1.6 if phase == "infer" else 1.3
            out.append(speedup_verdict(cells, key, "compile", goal, f"speedup vs compile >= {goal}x"))
        if model in SCALED_FAMILIES and scale == "large":
            out.append(compile_time_verdict(cells, key, "compile", 0.5, "compile time <= 50% of compile"))
        if model == "towers" and scale == "large" and phase == "train":
            base, new = cells.get(CellKey(model, scale, "compile", phase)), cells.get(key)
            if (
                _ok(base)
                and _ok(new)
                and base
                and new
                and base.get("peak_mem_bytes")
                and new.get("peak_mem_bytes")
            ):
                r = new["peak_mem_bytes"] / base["peak_mem_bytes"]
                fig = f"{base['peak_mem_bytes'] / 2**20:.1f} -> {new['peak_mem_bytes'] / 2**20:.1f} MiB ({(r - 1) * 100:+.1f}%)"
                out.append(
                    Verdict("train peak memory <= 94% of compile", f"{model} {scale} {phase}", fig, r <= 0.94)
                )
            else:
                out.append(
                    Verdict(
                        "train peak memory <= 94% of compile", f"{model} {scale} {phase}", "no ok cells", None
                    )
                )
        peer = cells.get(CellKey(model, scale, "compile+peer", phase))
        if peer is not None and peer.get("status") != "ok":
            out.append(
                Verdict(
                    "ahead of compile+peer (latency)",
                    f"{model} {scale} {phase}",
                    f"peer {peer['status']}",
                    None,
                )
            )
        else:
            out.append(speedup_verdict(cells, key, "compile+peer", 1.0, "ahead of compile+peer (latency)"))
            out.append(
                compile_time_verdict(cells, key, "compile+peer", 1.0, "ahead of compile+peer (compile time)")
            )
        out.append(speedup_verdict(cells, key, "compile", FLOOR, f"no cell below {FLOOR}x of compile"))
        if model == "towers" and phase == "infer":
            out.append(
                speedup_verdict(
                    cells,
                    CellKey(model, scale, "eager+optimus", phase),
                    "eager",
                    1.3,
                    "eager+optimus >= 1.3x eager",
                )
            )
    return out


def render(found: list[Verdict]) -> str:
    met = sum(v.met is True for v in found)
    missed = sum(v.met is False for v in found)
    lines = [
        "| target | cell | figure (median ratio, 95% CI) | verdict |",
        "| --- | --- | --- | --- |",
        *(v.row() for v in found),
        "",
        f"{met} met, {missed} missed, {len(found) - met - missed} without data.",
    ]
    return "\n".join(lines)


def as_json(found: list[Verdict]) -> list[dict[str, Any]]:
    """The verdicts as plain dicts (what ``--json`` writes)."""
    return [asdict(v) for v in found]
