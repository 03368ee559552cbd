"""Heterogeneous widths (``hetero_seed``): seeded, from the documented lists, in every family;
the uniform presets are untouched by the field."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import models
from models import presets, sparse, widths


def test_uniform_presets_do_not_carry_the_field() -> None:
    for family in models.FAMILIES:
        for scale in ("tiny", "small", "medium", "large", "xl"):
            assert "hetero_seed" not in presets.resolve(family, scale)


def test_medium_hetero_is_medium_plus_the_seed() -> None:
    for family in models.FAMILIES:
        hetero = presets.resolve(family, "medium-hetero")
        assert hetero == {**presets.resolve(family, "medium"), "hetero_seed": 0}


def test_draws_are_seeded_and_from_the_lists() -> None:
    a = widths.draw(50, 0, "tables", widths.EMBEDDING_DIMS)
    assert a == widths.draw(50, 0, "tables", widths.EMBEDDING_DIMS)
    assert a != widths.draw(50, 1, "tables", widths.EMBEDDING_DIMS)
    assert a != widths.draw(50, 0, "towers", widths.EMBEDDING_DIMS)  # one stream per kind
    assert set(a) <= set(widths.EMBEDDING_DIMS) and len(set(a)) > 1
    assert widths.around(16) == (8, 16, 32) and widths.around(8) == (8, 16)
    assert widths.widths({}, 3, "towers", 16) == (16, 16, 16)


def test_layout_draws_table_dims_and_pooled_width_follows() -> None:
    cfg = presets.resolve("towers", "small", {"hetero_seed": 7})
    lay = sparse.layout(cfg)
    assert len(lay.dims) == lay.num_tables and set(lay.dims) <= set(widths.EMBEDDING_DIMS)
    assert lay.pooled_dim == sum(lay.feature_dims) != lay.num_features * lay.embedding_dim
    assert lay.embedding_bytes == lay.rows_per_table * sum(lay.dims) * 4


@pytest.mark.parametrize("family", models.FAMILIES)
def test_every_family_builds_hetero_with_linears_of_many_shapes(family: str) -> None:
    b = models.build(family, "tiny", seed=0, overrides={"hetero_seed": 3}, count_nodes=False)
    uniform = models.build(family, "tiny", seed=0, count_nodes=False)
    dense_inputs = b.dense_inputs(b.batches[0])
    assert dense_inputs[1].shape[1] == sparse.layout(b.meta["config"]).pooled_dim
    batch = b.batches[0]
    loss = b.loss(b.module(*batch.inputs), batch.labels)
    loss.backward()
    assert torch.isfinite(loss)

    def shapes(m: nn.Module) -> set[tuple[int, int]]:
        return {(x.in_features, x.out_features) for x in m.modules() if isinstance(x, nn.Linear)}

    assert len(shapes(b.module.dense)) > len(shapes(uniform.module.dense))


def test_dlrm_hetero_needs_the_projections() -> None:
    with pytest.raises(ValueError, match=r"hetero_seed.*feature_projections"):
        presets.resolve("dlrm", "tiny", {"hetero_seed": 0, "feature_projections": False})


def test_bad_seed_names_the_field() -> None:
    with pytest.raises(ValueError, match="'hetero_seed'=-1 is too small"):
        presets.resolve("towers", "tiny", {"hetero_seed": -1})
