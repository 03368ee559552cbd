"""The re-layout under torchrec's DistributedModelParallel: its ``state_dict`` and a checkpoint
round trip through ``torch.distributed.checkpoint`` work as without Optimus.

Two gloo ranks (spawned), mmoe tiny (whose training fusion fits the memory ceiling): the dense arch optimized under the process group with
``RelayoutParams()`` (the members are the autograd leaves, DMP's dense DDP reduces them), the
tables sharded table-wise. After two training steps each rank saves ``dmp.state_dict()`` with
DCP, moves every dense parameter and table, loads the checkpoint back, and must compute what it
computed before the move. The state_dict has one key per parameter and table, as without the
re-layout: no key of Optimus's stacked storage, none missing.
"""

from __future__ import annotations

from pathlib import Path

import torch
from two_ranks import gloo_rank, spawn_two

from optimus.params.relayout import PREFIX

LR = 0.01


def _rank(rank: int, port: int, out: str) -> None:
    with gloo_rank(rank, port, out) as record:
        import torch.distributed.checkpoint as dcp
        from torchrec.distributed.model_parallel import DistributedModelParallel

        import models
        from harness.modes import builtin, mode_registry
        from harness.run import cell
        from harness.run.sharded import data
        from harness.run.sharded import plan as planmod

        torch.set_num_threads(1)
        built = models.build("mmoe", scale="tiny", device="cpu", seed=0)
        module = built.module
        module.train(True)
        unsharded_keys = sorted(module.state_dict())
        plan_doc = planmod.make_plan(module, 2, "table_wise")
        local = [data.local_batch(b, rank, 2) for b in built.batches]
        with builtin.optimus_guard("off"):  # the rewrite kept whatever the loaded machine times
            prepared = mode_registry.prepare("eager+optimus", module.dense, cell.example_inputs(built, local))
        module.dense = prepared.module
        record["relaid"] = prepared.info.get("relaid_groups") or 0
        record["gradients"] = prepared.info.get("optimus_gradients")
        dmp = DistributedModelParallel(
            module,
            device=torch.device("cpu"),
            plan=planmod.sharding_plan(plan_doc),
            sharders=[planmod.sharder(LR)],
        )
        dense_params = [p for n, p in dmp.named_parameters() if "embedding_bags" not in n]
        opt = torch.optim.SGD(dense_params, lr=LR)
        forward = cell.forward_fn(built, True)
        for b in local[:2]:
            opt.zero_grad(set_to_none=True)
            forward(dmp, b)
            opt.step()

        def logits() -> list[float]:
            with torch.no_grad():
                return dmp(*local[0].inputs).flatten().tolist()

        before = logits()
        state = dmp.state_dict()
        record["keys"] = sorted(state)
        record["unsharded_keys"] = unsharded_keys
        dcp.save(state, checkpoint_id=str(Path(out) / "ckpt"))
        with torch.no_grad():
            for p in dmp.parameters():
                p.add_(0.5)
            for _, t in dmp.named_buffers():
                if t.is_floating_point():
                    t.add_(0.5)
        record["moved"] = logits() != before
        restored = dmp.state_dict()
        dcp.load(restored, checkpoint_id=str(Path(out) / "ckpt"))
        dmp.load_state_dict(restored)
        record["before"], record["after"] = before, logits()


def test_dmp_state_dict_and_a_checkpoint_round_trip_keep_working(tmp_path: Path) -> None:
    r0, r1 = spawn_two(_rank, tmp_path)
    assert "error" not in r0 and "error" not in r1, r0.get("trace") or r1.get("trace")
    for r in (r0, r1):
        assert r["relaid"] > 0 and r["gradients"].startswith("autograd")  # the re-layout ran, DDP's way
        # DMP's keys: the tables' are the unsharded model's; the dense arch's are the captured
        # graph's (Dynamo names its parameters), one per parameter, none of the stacked storage
        keys = [k.removeprefix("_dmp_wrapped_module.") for k in r["keys"]]
        sparse = [k for k in r["unsharded_keys"] if not k.startswith("dense.")]
        assert [k for k in keys if not k.startswith("dense.")] == sparse
        dense = [k for k in keys if k.startswith("dense.")]
        assert len(dense) == len(r["unsharded_keys"]) - len(sparse)
        assert not any(PREFIX in k for k in dense)
        assert r["moved"]  # the move changed the outputs, so the load is what restored them
        torch.testing.assert_close(torch.tensor(r["after"]), torch.tensor(r["before"]), rtol=0, atol=0)
