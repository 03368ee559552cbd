"""The speedup columns of ``reproduce``, measured side by side: compile+optimus and its baselines
of one model and phase, each mode in worker processes of its own, timed in alternating rounds
(``harness.run.paired.measure_sides``).

Why not the ratio of two cells: ``reproduce`` runs every cell in a process of its own, minutes
apart, for isolation, memory and compile time; a ratio of two such cells carries the load of the
minutes between them. On the development machine, towers medium inference read 0.90x from two
cells of one run and 1.27x (1.20-1.37) side by side. The cells keep their figures; the speedups
come from here, and carry the interval of the per-round ratios.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.env import REPO_ROOT, git_info
from harness.modes.mode_registry import BASELINES, TARGET
from harness.run.checkouts import Checkout
from harness.run.paired import PairOptions, SideSpec, WorkerError, measure_sides
from harness.spec import CellKey
from harness.store.results import cell_map


def this_checkout() -> Checkout:
    git = git_info()
    sha = git.get("sha") or "unknown"
    return Checkout(sha + ("-dirty" if git.get("dirty") else ""), REPO_ROOT)


def pair_modes(
    doc: dict[str, Any], opt: PairOptions, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Per (model, scale, phase) of ``doc`` whose target cell and at least one baseline cell are
    ok: the speedup of the target over each baseline, from one side-by-side measurement."""
    cells = cell_map(doc)
    groups = sorted({(k.model, k.scale, k.phase) for k in cells})
    here = this_checkout()
    out: list[dict[str, Any]] = []
    for model, scale, phase in groups:

        def ok(mode: str, model: str = model, scale: str = scale, phase: str = phase) -> bool:
            c = cells.get(CellKey(model, scale, mode, phase))
            return c is not None and c["status"] == "ok"

        baselines = [b for b in BASELINES if ok(b)]
        if not ok(TARGET) or not baselines:
            continue
        modes = [TARGET, *baselines]
        log(f"[paired speedups] {model}/{scale}/{phase}: {', '.join(modes)} side by side")
        sides = [SideSpec(m, here, m) for m in modes]
        try:
            m = measure_sides((model, scale, phase), sides, opt, log=log)
        except WorkerError as e:
            out.append({"model": model, "scale": scale, "phase": phase, "error": str(e)})
            continue
        for base_mode, fig in zip(baselines, m["figures"], strict=True):
            lo, hi = fig["ci95"]
            out.append({
                "model": model, "scale": scale, "phase": phase, "mode": TARGET, "against": base_mode,
                # fig's ratio is base_mode time / target time: the target's speedup over it
                "speedup": fig["ratio"], "ci95": [lo, hi], "rounds": m["rounds"], "processes": m["processes"],
                "process_spread": fig["process_spread"], "round_spread": fig["round_spread"],
                "stable": fig["stable"], "round_ratios": fig["round_ratios"],
            })  # fmt: skip
    return out
