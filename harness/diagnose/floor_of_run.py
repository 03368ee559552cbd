"""The roofline floor added to a results file made before runs recorded it.

    python -m harness.diagnose.floor_of_run RUN.json --peaks-from PEAKS.json --out RUN-floor.json

WHY: a run records each cell's floor (``floor_ms``, ``of_floor``: docs/harness.md, "The floor
(roofline)") when it measures the machine's peaks at its start. Reference runs made before that
have latencies but no floor, and rerunning them costs hours at ``large``. The floor does not
depend on the run: it is the dense arch's FLOPs and unavoidable bytes (counted here by building
each family at the run's scale, as a cell does) at the machine's peaks, which ``--peaks-from``
takes from another run on the same machine (its ``env.peaks``). So the column can be added to
the old run without timing anything again, and every cell of one family and phase gets the same
floor, as in a run that records it.

The output is the run with ``floor``, ``floor_ms`` and ``of_floor`` in every ok cell that has a
latency, ``env.peaks`` set, and ``env.floor_added`` saying where the peaks came from; ``report``
reads it as any run. Single-process runs only (a sharded cell's floor is not defined).
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

from harness import exit_codes
from harness.store import results


def add_floor(doc: dict[str, Any], peaks: dict[str, Any], peaks_from: str) -> dict[str, Any]:
    """A copy of ``doc`` with the floor filled in (each family and phase counted once)."""
    from harness.measure import roofline
    from harness.run.cell import build_model, example_inputs, input_requires_grad

    out = copy.deepcopy(doc)
    config = out.get("config", {})
    counted: dict[tuple[str, str, str], dict[str, Any]] = {}
    for cell in out.get("cells", []):
        if cell.get("nproc", 1) != 1 or cell.get("status") != "ok" or not cell.get("latency_ms"):
            continue
        key = (cell["model"], cell["scale"], cell["phase"])
        if key not in counted:
            model, scale, phase = key
            b = build_model(
                config.get("provider", "models:build"), model, scale, "cpu", int(config.get("seed", 0))
            )
            batches = list(b.batches)
            train = phase == "train"
            b.module.train(train)
            grads = input_requires_grad(b.module, batches[0]) if train else None
            counted[key] = roofline.count(b.module.dense, example_inputs(b, batches), train, grads)
        roofline.fill_cell(cell, counted[key], peaks)
    out.setdefault("env", {})["peaks"] = peaks
    out["env"]["floor_added"] = f"counted after the run; machine peaks from {peaks_from}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.diagnose.floor_of_run",
        description="add the roofline floor to a results file made before runs recorded it",
    )
    parser.add_argument("run", help="the results file (left unchanged)")
    parser.add_argument(
        "--peaks-from", required=True, help="a results file of the same machine with env.peaks"
    )
    parser.add_argument("--out", required=True, help="where the run with its floor is written (atomically)")
    args = parser.parse_args(argv)
    try:
        doc = results.load(args.run)
        peaks = results.load(args.peaks_from).get("env", {}).get("peaks")
    except (OSError, ValueError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    if not peaks:
        print(f"{parser.prog}: error: {args.peaks_from} has no env.peaks (a run made before runs measured them)", file=sys.stderr)  # fmt: skip
        return exit_codes.BAD_INPUT
    if config_torch_threads := doc.get("config", {}).get("threads"):
        import torch

        torch.set_num_threads(int(config_torch_threads))
    out = add_floor(doc, peaks, args.peaks_from)
    results.save_atomic(args.out, out)
    filled = sum(1 for c in out.get("cells", []) if c.get("floor_ms") is not None)
    print(f"{args.out}: floor added to {filled} of {len(out.get('cells', []))} cells")
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
