"""A model fed a KeyedJaggedTensor is captured as one whole graph with its EmbeddingBagCollection
run eagerly outside it (optimus.capture.sparse_boundary): one graph across batches with other numbers of
ids, the re-layout active, and the same values and gradients as eager. Where the form is not the
unambiguous one (the model reads the KJT elsewhere, two collections), the boundary is not used."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import optimus
from optimus.capture.specialized import GUARD
from optimus.config import OptimusConfig
from optimus.params.relayout import RelayoutParams

torchrec = pytest.importorskip("torchrec")
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402

FEATURES, DIM, ROWS = 6, 4, 20


def _ebc(prefix: str = "f") -> EmbeddingBagCollection:
    tables = [
        EmbeddingBagConfig(
            name=f"{prefix}t{i}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f"{prefix}{i}"]
        )
        for i in range(FEATURES)
    ]
    return EmbeddingBagCollection(tables=tables)


def kjt(seed: int, batch: int = 4, prefix: str = "f") -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (FEATURES * batch,), generator=gen)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"{prefix}{i}" for i in range(FEATURES)], values=values, lengths=lengths
    )


class Towers(nn.Module):
    """Per-feature towers over the pooled embeddings, as torchrec models write them."""

    def __init__(self) -> None:
        super().__init__()
        self.sparse = nn.Module()
        self.sparse.ebc = _ebc()  # nested, as DLRM's sparse_arch.embedding_bag_collection
        self.towers = nn.ModuleList([nn.Linear(DIM, 8) for _ in range(FEATURES)])
        self.top = nn.Linear(3 + 8 * FEATURES, 1)

    def forward(self, x: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.sparse.ebc(features).to_dict()
        h = [torch.relu(t(pooled[f"f{i}"])) for i, t in enumerate(self.towers)]
        return self.top(torch.cat([x, *h], 1))


class ReadsTheKJT(Towers):
    """Also reads the KJT outside the collection: the boundary must not apply."""

    def forward(self, x: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        return super().forward(x, features) + features.values().float().mean()


class TwoCollections(Towers):
    def __init__(self) -> None:
        super().__init__()
        self.other = _ebc("g")

    def forward(self, x: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        return super().forward(x, features)


def _step(module: Any, x: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
    out = module(x, features)
    (out.square().sum()).backward()
    return out


def _optimize(mod: nn.Module, *inputs: Any) -> torch.fx.GraphModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optimus.optimize(mod, inputs, config=OptimusConfig(layout=RelayoutParams()))


def _assert_same_step(ref: nn.Module, mod: nn.Module, gm: Any, x: torch.Tensor, f: KeyedJaggedTensor) -> None:
    ref.zero_grad(set_to_none=True)
    mod.zero_grad(set_to_none=True)
    want, got = _step(ref, x, f), _step(gm, x, f)
    torch.testing.assert_close(got, want)
    for (name, p), q in zip(ref.named_parameters(), mod.parameters(), strict=True):
        if p.grad is None:  # a parameter eager never reads (TwoCollections.other)
            assert q.grad is None, name
            continue
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_whole_graph_one_capture_across_id_counts_and_relayout_active() -> None:
    torch.manual_seed(0)
    mod = Towers()
    ref = copy.deepcopy(mod)
    x = torch.randn(4, 3)
    gm = _optimize(mod, x, kjt(0))
    report = gm.optimus_report
    assert report.capture == "export", report.capture_reason
    assert "'sparse.ebc' run eagerly outside it" in report.capture_reason
    assert report.rules_fired.get("batch_linear") == 1
    reads = [str(n.target) for n in gm.dense.graph.nodes if n.op == "get_attr"]
    assert any("_optimus_stacked" in t for t in reads), reads  # the towers' weights, re-laid out
    counts = set()
    for seed in range(1, 6):
        f = kjt(seed)
        counts.add(f.values().numel())
        _assert_same_step(ref, mod, gm, x, f)
    assert len(counts) > 1  # the batches really had other numbers of ids
    assert gm.dense.optimus_specializations == {}  # ... and none of them was re-captured
    assert getattr(gm.dense, GUARD).reasons == []


def test_another_batch_size_and_eval_mode_are_recaptured_with_the_lookup_outside() -> None:
    torch.manual_seed(1)
    mod = Towers()
    ref = copy.deepcopy(mod)
    gm = _optimize(mod, torch.randn(4, 3), kjt(0))
    _assert_same_step(ref, mod, gm, torch.randn(7, 3), kjt(3, batch=7))
    variants = list(gm.dense.optimus_specializations.values())
    assert len(variants) == 1 and variants[0].optimus_report.capture == "export"
    gm.eval()
    ref.eval()
    assert not mod.training
    with torch.no_grad():
        torch.testing.assert_close(gm(torch.ones(4, 3), kjt(4)), ref(torch.ones(4, 3), kjt(4)))


def test_the_eager_fallback_of_the_dense_part_runs_the_real_model() -> None:
    torch.manual_seed(2)
    mod = Towers()
    gm = _optimize(mod, torch.randn(4, 3), kjt(0))
    source = getattr(gm.dense, GUARD).source  # what the guards run eagerly past their limit
    x, f = torch.randn(4, 3), kjt(5)
    pooled = mod.sparse.ebc(f).values()
    torch.testing.assert_close(source(x, pooled), mod(x, f))
    assert mod.sparse.ebc.__class__.__name__ == "EmbeddingBagCollection"  # the stub is gone again


def test_optimize_leaves_the_callers_kjt_untouched() -> None:
    torch.manual_seed(3)
    mod, f = Towers(), kjt(0)
    f_values, f_lengths = f.values().clone(), f.lengths().clone()
    caches = (f._length_per_key, f._offset_per_key, f._jt_dict)
    _optimize(mod, torch.randn(4, 3), f)
    assert (f._length_per_key, f._offset_per_key, f._jt_dict) == caches
    assert torch.equal(f.values(), f_values) and torch.equal(f.lengths(), f_lengths)


@pytest.mark.parametrize("cls", [ReadsTheKJT, TwoCollections])
def test_not_used_where_the_form_is_not_the_unambiguous_one(cls: type[nn.Module]) -> None:
    torch.manual_seed(4)
    mod = cls()
    ref = copy.deepcopy(mod)
    gm = _optimize(mod, torch.randn(4, 3), kjt(0))
    assert "run eagerly outside it" not in gm.optimus_report.capture_reason
    assert not hasattr(gm, "dense")
    _assert_same_step(ref, mod, gm, torch.randn(4, 3), kjt(1))


def test_a_re_capture_never_puts_the_old_collection_back() -> None:
    """The user replaces the collection after ``optimize``; a re-capture (here for eval mode)
    swaps the stub in and must put back the user's collection, not the one it found first."""
    torch.manual_seed(3)
    mod = Towers()
    gm = _optimize(mod, torch.randn(4, 3), kjt(0))
    mine = _ebc()
    mod.sparse.ebc = mine
    gm.eval()
    with torch.no_grad():
        gm(torch.ones(4, 3), kjt(4))
    assert mod.sparse.ebc is mine
