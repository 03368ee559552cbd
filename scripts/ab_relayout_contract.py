"""Side by side: the re-layout with its parameter-contract checks (this tree) and the re-layout at
an older commit (default dbcb301, before them), eager+optimus, in one process.

Why: the contract (docs/optimus.md, "The re-layout and PyTorch's parameter contract") adds a
per-call check (a forward pre-hook: O(G) identity/address/requires_grad comparisons per group)
and a few O(G) attribute reads per group in the backward hooks. This measures what that costs on
a whole model, interleaved (``harness.interleaved``) so load drift hits both alike, and times the
check alone. The older ``optimus/layout_relayout.py`` is read with ``git show``.

    PYTHONPATH=. python scripts/ab_relayout_contract.py --model towers --scale large --phase infer
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import timeit
import types
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def layout_at(ref: str) -> Any:
    """``RelayoutParams`` as it was at ``ref`` (imported as a module of the optimus package)."""
    src = subprocess.check_output(["git", "show", f"{ref}:optimus/layout_relayout.py"], text=True)
    mod = types.ModuleType("optimus._layout_relayout_at_ref")
    mod.__package__ = "optimus"
    sys.modules[mod.__name__] = mod
    exec(compile(src, f"{ref}:optimus/layout_relayout.py", "exec"), mod.__dict__)
    return mod.RelayoutParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="towers")
    parser.add_argument("--scale", default="large")
    parser.add_argument("--phase", default="infer", choices=("infer", "train"))
    parser.add_argument("--ref", default="dbcb301", help="commit of the re-layout to compare against")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--clock",
        default="cpu",
        choices=("cpu", "wall"),
        help="cpu: this process's CPU time (with one thread, robust to other processes taking turns "
        "on a shared machine); wall: perf_counter",
    )
    args = parser.parse_args()

    import torch

    import optimus
    from harness import cell as cell_mod
    from harness import interleaved
    from harness.spec import DEFAULT_PROVIDER
    from optimus import relayout_contract
    from optimus.layout_relayout import RelayoutParams

    torch.set_num_threads(args.threads)
    train = args.phase == "train"
    contenders, dense = [], {}
    for name, layout in (("old", layout_at(args.ref)), ("new", RelayoutParams)):
        b = cell_mod.build_model(DEFAULT_PROVIDER, args.model, args.scale, "cpu", 0)
        module, batches = b.module, list(b.batches)
        module.train(train)
        example = cell_mod.example_inputs(b, batches)
        cfg = optimus.OptimusConfig(layout=layout(), cost_model=optimus.AnalyticCostModel(inductor=False))
        module.dense = optimus.optimize(module.dense, example, config=cfg)
        dense[name] = module.dense
        opt = torch.optim.SGD(module.parameters(), lr=0.01) if train else None
        step = cell_mod.step_fn(module, batches, opt, cell_mod.forward_fn(b, train))
        out = step()
        contenders.append(interleaved.Contender(name, step, 0.0, out.detach()))
    diff = (contenders[0].first_out - contenders[1].first_out).abs().max().item()
    bindings = dense["new"].meta.get(relayout_contract.BINDINGS_KEY, [])
    members = sum(len(bd.keys) for bd in bindings)
    n = 2000
    check_us = min(timeit.repeat(lambda: relayout_contract.sync(dense["new"]), number=n, repeat=5)) / n * 1e6
    import time

    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    samples = interleaved.interleave(contenders, rounds=args.rounds, steps=args.steps, warmup=3, clock=clock)
    summary = interleaved.summarize(samples, "old")
    print(
        json.dumps(
            {
                "args": vars(args),
                "max_abs_diff_first_step": diff,
                "groups": len(bindings),
                "members": members,
                "check_alone_us": check_us,
                "modes": {
                    k: {kk: v for kk, v in row.items() if kk != "rounds_ms"} for k, row in summary.items()
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
