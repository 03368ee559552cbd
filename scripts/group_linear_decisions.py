"""What the cost model decides for ``group_linear`` on the heterogeneous models' dense archs.

WHY: the rule fires only where the cost model rates one grouped launch faster than G separate
linears on the device at hand. This prints, per (family, scale, cost model), how many candidate
groups the rule found over the whole optimization (all rules, as the harness runs them), how many
it applied, and the best and worst rated gain, so the CPU decision (decline) and what a CUDA
device would do are on record.

    PYTHONPATH=. python scripts/group_linear_decisions.py [--families towers,mmoe] [--scales medium-hetero]

Cost models: ``cpu-eager`` (the default analytic model), ``cpu-inductor`` (the same, pricing for
Inductor as compile+optimus does), ``cuda`` (CUDA constants and the Triton form: what the rule
would decide on a GPU; priced only, nothing runs on a GPU here).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

import models
import optimus
from optimus.cost import CUDA, AnalyticCostModel
from optimus.rules import REGISTRY
from optimus.rules.group_linear import GroupLinear


class CudaTriton(AnalyticCostModel):
    """CUDA constants for every device, with the Triton grouped form offered."""

    def grouped_linear_backends(self, device: torch.device) -> tuple[str, ...]:
        return ("triton", "padded")


COST_MODELS: dict[str, Any] = {
    "cpu-eager": AnalyticCostModel(),
    "cpu-inductor": AnalyticCostModel(inductor=True),
    "cuda": CudaTriton(cpu=CUDA),
}


class Recording(GroupLinear):
    """group_linear that records every candidate it offers, with the gain the model rates."""

    seen: list[dict[str, Any]] = []

    def match(self, ctx: Any) -> list[Any]:
        cands = super().match(ctx)
        device = ctx.device_of(cands[0].nodes) if cands else torch.device("cpu")
        for c in cands:
            _, backend, _ = self.choose(c.nodes, ctx)
            gain = ctx.cost_model.seconds(c.before, device) - ctx.cost_model.seconds(c.after, device)
            Recording.seen.append({"size": len(c.nodes), "backend": backend, "gain_us": gain * 1e6})
        return cands


def decisions(family: str, scale: str, model_name: str) -> dict[str, Any]:
    b = models.build(family, scale, seed=0, count_nodes=False)
    inputs = b.dense_inputs(b.batches[0])
    Recording.seen = []
    old = REGISTRY["group_linear"]
    REGISTRY["group_linear"] = Recording
    try:
        gm = optimus.optimize(b.module.dense, inputs, cost_model=COST_MODELS[model_name])
    finally:
        REGISTRY["group_linear"] = old
    rep = gm.optimus_report
    gains = [s["gain_us"] for s in Recording.seen]
    return {
        "family": family,
        "scale": scale,
        "cost_model": model_name,
        "candidates": len(Recording.seen),
        "fired": rep.rules_fired.get("group_linear", 0),
        "declined": rep.declined.get("group_linear", 0),
        "best_gain_us": round(max(gains), 1) if gains else None,
        "worst_gain_us": round(min(gains), 1) if gains else None,
        "backends": sorted({s["backend"] for s in Recording.seen}),
        "group_sizes": sorted({s["size"] for s in Recording.seen}),
        "rules_fired": rep.rules_fired,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(models.FAMILIES))
    parser.add_argument("--scales", default="medium-hetero")
    parser.add_argument("--cost-models", default=",".join(COST_MODELS))
    args = parser.parse_args(argv)
    for family in args.families.split(","):
        for scale in args.scales.split(","):
            for name in args.cost_models.split(","):
                print(json.dumps(decisions(family, scale, name)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
