"""MLPerf DLRMv2 (harness/providers/mlperf_dlrmv2.py): MLPerf's architecture and pooling, the row
cap in the meta, parity of the Optimus mode against eager in both phases, one-line refusals.

Most tests build with the tables capped at 64 rows and a batch of 16: the architecture (26
tables of dim 128, the MLPs, the DCN) is the scale's, only the row counts and the batch shrink."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet

from harness import cli, exit_codes
from harness.modes import mode_registry
from harness.providers import mlperf_dlrmv2 as mlperf
from harness.run import cell
from harness.run.runner import run_suite
from harness.spec import RunConfig
from harness.store import results

SMALL = dict(row_cap=64, batch_size=16)
SPEC = "harness.providers.mlperf_dlrmv2:build"


def widths(mlp: nn.Module) -> list[int]:
    return [m.out_features for m in mlp.modules() if isinstance(m, nn.Linear)]


def test_the_architecture_is_mlperf_dlrmv2() -> None:
    b = mlperf.build("mlperf_dlrmv2", "cpu", **SMALL)
    configs = b.module.sparse.embedding_bag_configs()
    assert len(configs) == 26 and {c.embedding_dim for c in configs} == {128}
    assert [c.num_embeddings for c in configs] == [min(r, 64) for r in mlperf.TABLE_ROWS]
    dense = b.module.dense
    assert widths(dense.dense_arch) == [512, 256, 128]
    assert widths(dense.over_arch) == [1024, 1024, 512, 256, 1]
    cross = dense.inter_arch.crossnet
    assert isinstance(cross, LowRankCrossNet) and len(cross.W_kernels) == 3
    assert all(tuple(w.shape) == (27 * 128, 512) for w in cross.W_kernels)  # 26 features + the dense one
    dense_features, kjt = b.batches[0].inputs
    assert dense_features.shape == (16, 13)
    lengths = kjt.lengths().view(26, 16)  # feature-major: every sample has MLPerf's multi-hot size
    assert (lengths == torch.tensor(mlperf.MULTI_HOT_SIZES).unsqueeze(1)).all()
    assert b.batches[0].labels.shape == (16, 1)
    logits = b.module(*b.batches[0].inputs)
    assert logits.shape == (16, 1) and torch.isfinite(b.loss(logits, b.batches[0].labels))


def test_the_row_counts_are_mlperfs_and_the_cap_is_in_the_meta() -> None:
    assert len(mlperf.TABLE_ROWS) == len(mlperf.MULTI_HOT_SIZES) == 26
    assert sum(mlperf.TABLE_ROWS) == 204_184_588 and sum(mlperf.MULTI_HOT_SIZES) == 214
    small = mlperf.build("mlperf_dlrmv2", "cpu", **SMALL).meta
    assert small["row_cap"] == 64 and small["table_rows"] == sum(min(r, 64) for r in mlperf.TABLE_ROWS)
    cap = mlperf.ROW_CAPS["cpu"]
    assert cap is not None
    rows = mlperf.table_rows(cap)
    assert rows == [min(r, cap) for r in mlperf.TABLE_ROWS]
    assert mlperf.table_rows(None) == list(mlperf.TABLE_ROWS)
    assert sum(rows) * mlperf.BYTES_PER_ROW < 1 << 30  # the cpu scale's tables: under 1 GiB


def test_the_cpu_scale_records_its_cap() -> None:
    meta = mlperf.build("mlperf_dlrmv2", "cpu").meta
    assert meta["row_cap"] == mlperf.ROW_CAPS["cpu"] and meta["batch_size"] == 256
    assert meta["table_bytes"] == meta["table_rows"] * 128 * 4


@pytest.mark.parametrize("phase", ["infer", "train"])
def test_eager_optimus_matches_eager(phase: str) -> None:
    b = mlperf.build("mlperf_dlrmv2", "cpu", **SMALL)
    train = phase == "train"
    module, ref = b.module, copy.deepcopy(b.module)
    module.train(train)
    ref.train(train)
    original = dict(module.named_parameters())
    prepared = mode_registry.prepare("eager+optimus", module.dense, cell.example_inputs(b, b.batches))
    module.dense = prepared.module
    forward = cell.forward_fn(b, train)
    out, ref_out = forward(module, b.batches[0]), forward(ref, b.batches[0])
    assert cell.close(ref_out, out, 1e-4, 1e-3), cell.max_err(ref_out, out)
    if train:
        grads = cell.compare_grads(ref, module, original, 1e-4, 1e-3)
        assert grads["bad"] == [] and grads["grads_compared"] == grads["grads_total"] > 0


def test_an_unknown_scale_or_family_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"^unknown scale 'tiny'; allowed scales: \['cpu', 'full'\]$"):
        mlperf.build("mlperf_dlrmv2", "tiny")
    with pytest.raises(ValueError, match=r"^unknown family 'dlrm'"):
        mlperf.build("dlrm", "cpu")
    argv = ["run", "--provider", SPEC, "--scale", "tiny", "--no-progress", "--out", "unused.json"]
    assert cli.main(argv) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown 'tiny'; allowed values: cpu, full" in err, err


def test_the_full_scale_is_refused_in_one_line_where_it_cannot_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any table is allocated: 97 GiB of tables on a (here: pretended) 16 GiB machine."""
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": (16 << 30) // 4096}
    monkeypatch.setattr(mlperf.os, "sysconf", pages.__getitem__)
    with pytest.raises(MemoryError, match=r"the tables need 97\.4 GiB and this machine has 16\.0 GiB") as e:
        mlperf.build("mlperf_dlrmv2", "full")
    assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["table_wise", "column_wise"])
def test_a_two_rank_training_cell_runs_sharded(tmp_path: Path, sharding: str) -> None:
    """At the cpu scale, over 2 ranks: every table shard checked against the single-process run
    (about half a minute of torchrun on 2 cores per plan, hence slow). Column-wise splits every
    table into two 64-column shards, one per rank."""
    cfg = RunConfig(models=["mlperf_dlrmv2"], scale="cpu", provider=SPEC, modes=["eager"], phases=["train"],
                    device="cpu", nproc=2, sharding=sharding, warmup=1, min_iters=2, max_iters=3, budget_s=0.2,
                    timeout_s=900.0).validate()  # fmt: skip
    out = tmp_path / "sharded.json"
    run_suite(cfg, out, progress=False)
    [c] = results.load(out)["cells"]
    assert c["status"] == "ok", c.get("error")
    for rank in c["ranks"]:
        shards = rank["shard"]
        assert {s["sharding_type"] for s in shards} == {sharding}
        assert rank["parity"]["table_shards_compared"] == len(shards)
        widths = {s["sizes"][1] for s in shards}
        assert widths == ({64} if sharding == "column_wise" else {128})
    assert sum(len(r["shard"]) for r in c["ranks"]) == (52 if sharding == "column_wise" else 26)
