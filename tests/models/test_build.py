"""Every family at tiny: forward, loss, backward, an optimizer step, determinism, the contract."""

from __future__ import annotations

import copy

import pytest
import torch
from torchrec import EmbeddingBagCollection, KeyedJaggedTensor

import models


def test_public_names() -> None:
    assert models.FAMILIES == ("dlrm", "dcn", "towers", "mmoe")
    assert models.SCALES == ("tiny", "small", "medium", "large", "xl", "medium-hetero")


def test_contract_shapes(tiny: models.Built) -> None:
    m = tiny.meta
    assert isinstance(tiny.module.sparse, EmbeddingBagCollection)
    assert len(tiny.batches) == m["config"]["num_batches"]
    for batch in tiny.batches:
        dense_features, kjt = batch.inputs
        assert isinstance(kjt, KeyedJaggedTensor)
        assert dense_features.shape == (m["batch_size"], m["num_dense_features"])
        assert batch.labels.shape == (m["batch_size"], m["num_tasks"])
        assert batch.labels.dtype == torch.float32
        assert set(batch.labels.unique().tolist()) <= {0.0, 1.0}
    logits = tiny.module(*tiny.batches[0].inputs)
    assert logits.shape == (m["batch_size"], m["num_tasks"])


def test_meta_fields(tiny: models.Built) -> None:
    m = tiny.meta
    assert m["params"] == sum(p.numel() for p in tiny.module.parameters())
    assert m["dense_params"] == sum(p.numel() for p in tiny.module.dense.parameters())
    ebc_bytes = sum(p.numel() * p.element_size() for p in tiny.module.sparse.parameters())
    assert m["embedding_bytes"] == ebc_bytes
    assert m["num_tables"] == len(tiny.module.sparse.embedding_bag_configs())
    assert m["num_features"] == len(tiny.batches[0].inputs[1].keys())
    assert m["flops_per_sample"] > 0 and m["dense_nodes"] > 0
    assert m["config"] == models.presets.resolve(m["family"], "tiny")


def test_dense_inputs_give_the_module_output(tiny: models.Built) -> None:
    batch = tiny.batches[1]
    with torch.no_grad():
        direct = tiny.module(*batch.inputs)
        dense_features, pooled = tiny.dense_inputs(batch)
        via_dense = tiny.module.dense(dense_features, pooled)
    assert pooled.shape == (tiny.meta["batch_size"], tiny.meta["num_features"] * tiny.meta["embedding_dim"])
    assert not pooled.requires_grad
    torch.testing.assert_close(via_dense, direct, rtol=0, atol=0)


def test_train_step_updates_sparse_and_dense(tiny: models.Built) -> None:
    module = copy.deepcopy(tiny.module)
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    batch = tiny.batches[0]
    loss = tiny.loss(module(*batch.inputs), batch.labels)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grads = {name: p.grad for name, p in module.named_parameters()}
    assert all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
    assert any(float(g.abs().sum()) > 0 for n, g in grads.items() if n.startswith("sparse."))
    assert any(float(g.abs().sum()) > 0 for n, g in grads.items() if n.startswith("dense."))
    opt.step()
    changed = [k for k, v in module.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("sparse.") for k in changed) and any(k.startswith("dense.") for k in changed)
    with torch.no_grad():
        after = tiny.loss(module(*batch.inputs), batch.labels)
    assert after.item() < loss.detach().item(), "one SGD step on the same batch should lower its loss"


def test_loss_is_bce_averaged_over_tasks(tiny: models.Built) -> None:
    logits = torch.tensor([[0.0, 2.0], [-1.0, 3.0]])
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    per_task = [
        torch.nn.functional.binary_cross_entropy_with_logits(logits[:, t], labels[:, t]) for t in range(2)
    ]
    torch.testing.assert_close(tiny.loss(logits, labels), torch.stack(per_task).mean())


@pytest.mark.parametrize("family", models.FAMILIES)
def test_deterministic_for_a_seed(family: str) -> None:
    a, b = (models.build(family, "tiny", seed=3, count_nodes=False) for _ in range(2))
    c = models.build(family, "tiny", seed=4, count_nodes=False)
    for x, y in zip(a.batches, b.batches, strict=True):
        torch.testing.assert_close(x.inputs[0], y.inputs[0], rtol=0, atol=0)
        assert torch.equal(x.inputs[1].values(), y.inputs[1].values())
        assert torch.equal(x.inputs[1].lengths(), y.inputs[1].lengths())
        assert torch.equal(x.labels, y.labels)
    with torch.no_grad():
        out_a, out_b = a.module(*a.batches[0].inputs), b.module(*b.batches[0].inputs)
        out_c = c.module(*a.batches[0].inputs)
    torch.testing.assert_close(out_a, out_b, rtol=0, atol=0)
    assert not torch.allclose(out_a, out_c), "a different seed must give different weights"
    assert not torch.equal(a.batches[0].inputs[1].values(), c.batches[0].inputs[1].values())


def test_build_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    models.build("towers", "tiny", seed=7, count_nodes=False)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("dcn", {"structure": "parallel"}),
        ("dcn", {"adapter_dim": 0}),
        ("mmoe", {"adapter_dim": 0}),
        ("dlrm", {"feature_projections": False, "interaction_groups": 2}),
        ("towers", {"tower_layers": 1, "gated": False}),
        ("towers", {"tower_layers": 3}),
        ("dlrm", {"features_per_table": 2}),
    ],
)
def test_variants_train(family: str, overrides: dict) -> None:
    b = models.build(family, "tiny", overrides=overrides, count_nodes=False)
    batch = b.batches[0]
    logits = b.module(*batch.inputs)
    assert logits.shape == (b.meta["batch_size"], b.meta["num_tasks"])
    b.loss(logits, batch.labels).backward()
    assert all(p.grad is not None for p in b.module.dense.parameters())


def test_variants_change_structure() -> None:
    stacked = models.build("dcn", "tiny", count_nodes=False).module.dense
    parallel = models.build(
        "dcn", "tiny", overrides={"structure": "parallel"}, count_nodes=False
    ).module.dense
    assert stacked.head.in_features != parallel.head.in_features
    shared = models.build("dlrm", "tiny", overrides={"features_per_table": 2}, count_nodes=False)
    assert shared.meta["num_tables"] == 2 and shared.meta["num_features"] == 4
