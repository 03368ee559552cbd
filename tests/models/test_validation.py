"""Bad input raises ValueError naming the field and the allowed values, before any allocation."""

from __future__ import annotations

import pytest

import models
from models import builder as build_module
from models import registry


def test_unknown_family_lists_families() -> None:
    with pytest.raises(ValueError, match=r"unknown family 'wide'.*dlrm.*dcn.*towers.*mmoe"):
        models.build("wide", "tiny")


def test_unknown_scale_lists_scales() -> None:
    with pytest.raises(ValueError, match=r"unknown scale 'huge'.*tiny.*small.*medium.*large.*xl"):
        models.build("dlrm", "huge")


@pytest.mark.parametrize(
    ("family", "field", "value"),
    [
        ("dlrm", "batch_size", -1),
        ("dlrm", "embedding_dim", 0),
        ("dcn", "rows_per_table", -5),
        ("towers", "num_sparse_features", -2),
        ("mmoe", "num_experts", 0),
        ("towers", "tower_layers", 4),
        ("dcn", "cross_rank", -1),
        ("mmoe", "pooling_mean", -0.5),
        ("towers", "batch_size", 2.5),
        ("dlrm", "num_batches", True),
        ("dlrm", "top_mlp", (16, -3)),
        ("dlrm", "top_mlp", ()),
        ("dcn", "structure", "diagonal"),
        ("towers", "gated", 1),
    ],
)
def test_bad_field_is_named(family: str, field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"'{field}'.*allowed"):
        models.build(family, "tiny", overrides={field: value})


def test_unknown_override_lists_fields() -> None:
    with pytest.raises(ValueError, match=r"unknown config field 'batchsize'.*batch_size"):
        models.build("towers", "tiny", overrides={"batchsize": 8})


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_bad_seed(seed: object) -> None:
    with pytest.raises(ValueError, match="seed"):
        models.build("towers", "tiny", seed=seed)  # type: ignore[arg-type]


def test_cross_field_limits() -> None:
    with pytest.raises(ValueError, match="interaction_groups"):
        models.build("dlrm", "tiny", overrides={"interaction_groups": 5})
    with pytest.raises(ValueError, match="dense_groups"):
        models.build("towers", "tiny", overrides={"dense_groups": 99})


def _forbid_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("allocated before rejecting the config")

    monkeypatch.setattr(build_module.sparse, "build_ebc", refuse)
    monkeypatch.setattr(build_module.data, "make_batches", refuse)


def test_tables_too_big_rejected_before_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid_allocation(monkeypatch)  # the check: any allocation before the refusal raises
    with pytest.raises(ValueError, match=r"GiB.*memory_budget_gib=8.0.*rows_per_table"):
        models.build("dlrm", "large", overrides={"rows_per_table": 50_000_000})


def test_dense_too_big_rejected_before_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid_allocation(monkeypatch)
    real = registry.FAMILY_MODULES["mmoe"].build_dense
    calls: list[str] = []

    def spy(cfg, lay):  # type: ignore[no-untyped-def]
        import torch

        calls.append(str(torch.empty(0).device))
        return real(cfg, lay)

    monkeypatch.setattr(registry.FAMILY_MODULES["mmoe"], "build_dense", spy)
    # Experts of 60k x 60k would need ~40 GiB of fp32 weights; tables alone are tiny.
    with pytest.raises(ValueError, match="memory_budget_gib"):
        models.build("mmoe", "tiny", overrides={"expert_mlp": (60_000, 60_000)})
    assert calls == ["meta"], "the dense arch may only be built on the meta device before the check"


def test_budget_is_a_field() -> None:
    with pytest.raises(ValueError, match="memory_budget_gib"):
        models.build("towers", "small", overrides={"memory_budget_gib": 0.001})
