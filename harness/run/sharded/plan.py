"""The sharding plan: torchrec's planner, run in the parent, stored as JSON for every rank.

Why in the parent: a planner that cannot place the tables (too little memory for them) must
be one clear line before any rank starts, not N ranks of which one raised and the rest wait
in a collective. ``EmbeddingShardingPlanner.plan`` needs no process group: the parent gives
it ``Topology(world_size=N)`` and gets the plan every rank then rebuilds from the same JSON
(``sharding_plan``), so all ranks run one plan by construction.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from typing import Any

from harness.spec import SHARDINGS

FAULT_ENV = "OPTIMUS_BENCH_FAULT"
PLANNER_FAIL_DDR_BYTES = 1024  # the planner_fail test hook: 1 KiB per rank holds no table


class PlanError(ValueError):
    """The planner could not place the tables; the message is one line."""


def sharder(lr: float = 0.01) -> Any:
    """The EmbeddingBagCollection sharder every rank uses: fused exact SGD (the table update
    runs inside backward) with the harness's learning rate, so a training step matches
    plain SGD on an unsharded model."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": lr}
    )


def _planner_fail_requested() -> bool:
    return os.environ.get(FAULT_ENV, "").strip() == "planner_fail"


def column_shard(sharding: str, dim: int, nproc: int) -> int | None:
    """Columns per shard of a ``column_wise`` table: dim / nproc, so every table is split over
    the ranks. Why: torchrec's planner shards columns in blocks of at least 128 (``MIN_CW_DIM``),
    so a table of dim 128 or less (every table of our presets and MLPerf DLRMv2's) would stay one
    whole shard and the plan would place whole tables, as table-wise does. None (torchrec's
    default) for the other sharding types, and where dim does not divide by nproc."""
    if sharding != "column_wise" or dim % nproc or dim < nproc:
        return None
    return dim // nproc


def make_plan(module: Any, nproc: int, sharding: str, device: str = "cpu") -> dict[str, Any]:
    """Plan ``module``'s EmbeddingBagCollection over ``nproc`` ranks; the plan as JSON.

    ``sharding`` constrains every table to one sharding type (``auto``: the planner
    chooses; ``column_wise``: in shards of ``column_shard`` columns). Raises PlanError (one
    line) when the planner cannot place the tables.
    """
    import logging

    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    if sharding not in SHARDINGS:
        raise ValueError(f"sharding: unknown {sharding!r}; allowed values: {', '.join(SHARDINGS)}")
    if nproc < 2:
        raise ValueError(f"nproc: a sharded cell needs at least 2 ranks, got {nproc}")
    constraints = None
    if sharding != "auto":
        constraints = {
            c.name: ParameterConstraints(
                sharding_types=[sharding], min_partition=column_shard(sharding, c.embedding_dim, nproc)
            )
            for c in module.sparse.embedding_bag_configs()
        }
    caps: dict[str, int] = {}
    if _planner_fail_requested():
        caps = {"ddr_cap": PLANNER_FAIL_DDR_BYTES, "hbm_cap": PLANNER_FAIL_DDR_BYTES}
    compute = "cuda" if device == "cuda" else "cpu"
    quiet = [logging.getLogger(n) for n in ("torchrec.distributed.planner", "torchrec")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:  # the planner's warnings and stats tables are not the harness's output
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            topology = Topology(world_size=nproc, compute_device=compute, local_world_size=nproc, **caps)
            planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
            plan = planner.plan(module, [sharder()])
    except Exception as e:  # PlannerError, or RuntimeError("No available sharding type ...")
        first = str(e).strip().splitlines()[0].strip() if str(e).strip() else type(e).__name__
        raise PlanError(
            f"the planner could not place the tables over {nproc} ranks (sharding {sharding}): "
            f"{type(e).__name__}: {first[:300]}"
        ) from None
    finally:
        for lg, lv in zip(quiet, levels, strict=True):
            lg.setLevel(lv)
    return plan_json(plan, nproc, sharding)


def plan_json(plan: Any, nproc: int, sharding: str) -> dict[str, Any]:
    """The ShardingPlan as plain JSON: per module path, per table, its type, kernel, ranks, shards."""
    modules: dict[str, Any] = {}
    for path, mplan in plan.plan.items():
        tables = {}
        for name, ps in mplan.items():
            shards = []
            spec = ps.sharding_spec
            for sm in getattr(spec, "shards", None) or []:
                shards.append(
                    {
                        "offsets": list(sm.shard_offsets),
                        "sizes": list(sm.shard_sizes),
                        "placement": str(sm.placement),
                    }
                )
            tables[name] = {
                "sharding_type": ps.sharding_type,
                "compute_kernel": ps.compute_kernel,
                "ranks": list(ps.ranks or []),
                "shards": shards,
            }
        modules[path] = tables
    return {"nproc": nproc, "sharding": sharding, "modules": modules}


def sharding_plan(doc: dict[str, Any]) -> Any:
    """Rebuild torchrec's ShardingPlan from ``plan_json``'s output (on every rank)."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    out = {}
    for path, tables in doc["modules"].items():
        mplan = EmbeddingModuleShardingPlan()
        for name, t in tables.items():
            spec = None
            if t["shards"]:
                spec = EnumerableShardingSpec(
                    [ShardMetadata(s["offsets"], s["sizes"], s["placement"]) for s in t["shards"]]
                )
            mplan[name] = ParameterSharding(t["sharding_type"], t["compute_kernel"], t["ranks"], spec)
        out[path] = mplan
    return ShardingPlan(out)


def rank_shards(doc: dict[str, Any], rank: int) -> list[dict[str, Any]]:
    """What ``rank`` holds: one entry per table shard placed on it (data-parallel: a replica)."""
    held = []
    for tables in doc["modules"].values():
        for name, t in tables.items():
            if t["sharding_type"] == "data_parallel":
                held.append({"table": name, "sharding_type": t["sharding_type"], "replica": True})
                continue
            for s in t["shards"]:
                if s["placement"].split("/")[0] == f"rank:{rank}":
                    held.append(
                        {"table": name, "sharding_type": t["sharding_type"], "offsets": s["offsets"],
                         "sizes": s["sizes"]}
                    )  # fmt: skip
    return held


def rank_table_bytes(doc: dict[str, Any], rank: int, weights: Mapping[str, Any]) -> int:
    """Bytes of table weights ``rank`` holds under the plan: its shards, and a whole replica of each
    data-parallel table. ``weights``: table name -> its unsharded weight (for the element size).

    Why: a rank's memory holds these, not every table, so the Optimus modes' memory ceiling, a
    fraction of the whole, must count these (counting every table let mmoe small's training graph
    re-lay out under 2 ranks at +14% peak memory per rank over eager, where one process leaves it
    as captured)."""
    total = 0
    for held in rank_shards(doc, rank):
        w = weights[held["table"]]
        n = w.numel() if held.get("replica") else math.prod(held["sizes"])
        total += int(n) * w.element_size()
    return total


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """One line per sharding type: ``{"table_wise": 50}``; and tables per rank."""
    kinds: dict[str, int] = {}
    for tables in doc["modules"].values():
        for t in tables.values():
            kinds[t["sharding_type"]] = kinds.get(t["sharding_type"], 0) + 1
    return {"types": kinds, "nproc": doc["nproc"], "sharding": doc["sharding"]}


def describe(doc: dict[str, Any]) -> str:
    """``table_wise x50`` (for tables and reports)."""
    kinds = summary(doc)["types"]
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "no tables"
