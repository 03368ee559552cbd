"""embedding_index_select: a trained lookup on CPU becomes ``index_select`` (whose backward is one
``index_add_`` instead of a sort).

Firing cases check the forward and the table's gradient bit for bit against eager (ids with many
repeats, 1-D, 2-D and 3-D ids), the layout, and that an id out of range still raises eager's
``IndexError``. Must-not-fire cases: no gradient (eval under ``no_grad``, a frozen table, a
lookup read only under ``no_grad``), ``padding_idx``, ``max_norm``, ``scale_grad_by_freq``,
``sparse``, a bfloat16 table, and the cost-model decline for a small lookup.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND
from torch import nn

import optimus
from optimus.config import OptimusConfig
from optimus.params.relayout import RelayoutParams
from optimus.rules.batch.embedding_index_select import FIXED_LAUNCHES, PER_ID_LAUNCHES

RULE = "embedding_index_select"
MANY = 512  # ids in a lookup the cost model takes (about 150 and up)


class Lookup(nn.Module):
    def __init__(self, rows: int = 7, width: int = 5, **kw: Any) -> None:
        super().__init__()
        self.emb = nn.Embedding(rows, width, **kw)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb(ids) * 2.0


class ReadUnderNoGrad(Lookup):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.emb(ids) * 2.0


def _ids(shape: tuple[int, ...], rows: int = 7, dtype: torch.dtype = torch.long) -> torch.Tensor:
    return torch.randint(0, rows, shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def _step(fn: Any, model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    out = fn(ids)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach()


def _fired(gm: Any) -> int:
    return int(gm.optimus_report.rules_fired.get(RULE, 0))


@pytest.mark.parametrize(
    "shape, dtype",
    [((MANY,), torch.long), ((64, 8), torch.long), ((16, 8, 4), torch.long), ((64, 8), torch.int32)],
    ids=["1d", "2d", "3d", "int32"],
)
@pytest.mark.parametrize("table", [torch.float32, torch.float64])
def test_trained_lookup_becomes_index_select_bit_for_bit(
    shape: tuple[int, ...], dtype: torch.dtype, table: torch.dtype
) -> None:
    torch.manual_seed(0)
    model = Lookup().to(table)
    ref = copy.deepcopy(model)
    ids = _ids(shape, dtype=dtype)  # 7 rows: every row is hit dozens of times
    gm = optimus.optimize(model, (ids,))
    assert _fired(gm) == 1
    assert not [n for n in gm.graph.nodes if n.target is F.embedding]
    want, got = _step(ref, ref, ids), _step(gm, model, ids)
    assert torch.equal(got, want)
    assert model.emb.weight.grad is not None and ref.emb.weight.grad is not None
    assert torch.equal(model.emb.weight.grad, ref.emb.weight.grad)
    assert_same_results(ref(ids), gm(ids), sources=[ids])


class InputLayer(nn.Module):
    """DeepCTR's input layer: one table per column of ``X``, the lookups stacked."""

    def __init__(self, features: int = 12) -> None:
        super().__init__()
        self.embs = nn.ModuleList([nn.Embedding(5 + i, 4) for i in range(features)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([emb(x[:, i].long()) for i, emb in enumerate(self.embs)], 1)


@pytest.mark.parametrize("layout", ["relayout", "runtime-cat"])
def test_the_batched_lookup_of_an_input_layer_is_rewritten(layout: str) -> None:
    """``batch_embedding`` makes the twelve lookups one (its table one storage with the re-layout,
    a cat of the tables per call without); that lookup, 12 x 64 ids, is then rewritten."""
    torch.manual_seed(0)
    model = InputLayer()
    ref = copy.deepcopy(model)
    x = torch.stack([_ids((64,), rows=5 + i) for i in range(12)], 1).float()
    config = OptimusConfig(layout=RelayoutParams()) if layout == "relayout" else OptimusConfig()
    gm = optimus.optimize(
        model, (x,), config=config, cost_model=None if layout == "relayout" else LAUNCH_BOUND
    )
    assert gm.optimus_report.rules_fired.get("batch_embedding") == 1
    # (counted twice when stack_unbind, in the same round, rebuilds the pieces from the old lookup)
    assert _fired(gm) >= 1
    assert not [n for n in gm.graph.nodes if n.target is F.embedding]
    want, got = _step(ref, ref, x), _step(gm, model, x)
    assert torch.equal(got, want)
    for p, q in zip(ref.parameters(), model.parameters(), strict=True):
        assert q.grad is not None and p.grad is not None and torch.equal(q.grad, p.grad)


def test_an_id_out_of_range_raises_as_eager() -> None:
    model = Lookup()
    ids = _ids((MANY,))
    gm = optimus.optimize(model, (ids,))
    assert _fired(gm) == 1
    bad = ids.clone()
    bad[3] = 7
    with pytest.raises(IndexError, match="index out of range in self"):
        model(bad)
    with pytest.raises(IndexError, match="index out of range in self"):
        gm(bad)


@pytest.mark.parametrize(
    "kw",
    [{"padding_idx": 0}, {"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True}],
    ids=["padding_idx", "max_norm", "scale_grad_by_freq", "sparse"],
)
def test_lookups_with_other_backwards_are_left_alone(kw: dict[str, Any]) -> None:
    model = Lookup(**kw)
    gm = optimus.optimize(model, (_ids((MANY,)),))
    assert _fired(gm) == 0
    assert [n for n in gm.graph.nodes if n.target is F.embedding]


def test_no_gradient_no_rewrite() -> None:
    """Eval under no_grad, a frozen table, a lookup read only under no_grad: the forward is the
    same gather, so nothing pays."""
    ids = _ids((MANY,))
    model = Lookup()
    with torch.no_grad():
        assert _fired(optimus.optimize(model, (ids,))) == 0
    frozen = Lookup()
    frozen.emb.weight.requires_grad_(False)
    assert _fired(optimus.optimize(frozen, (ids,))) == 0
    gm = optimus.optimize(ReadUnderNoGrad(), (ids,))
    assert _fired(gm) == 0
    assert any(r.startswith(f"{RULE}: no gradient") for r in gm.optimus_report.declined_reasons)


def test_half_precision_tables_are_left_alone() -> None:
    model = Lookup().to(torch.bfloat16)
    gm = optimus.optimize(model, (_ids((MANY,)),))
    assert _fired(gm) == 0
    assert f"{RULE}: not a float32/float64 table" in gm.optimus_report.declined_reasons


def test_the_cost_model_declines_a_small_lookup() -> None:
    """A per-feature lookup of a small batch: the gather path's fixed work costs more than the
    sort it saves (measured: 64 ids, 24.0 against 20.7 us)."""
    assert PER_ID_LAUNCHES * 64 < FIXED_LAUNCHES < PER_ID_LAUNCHES * MANY
    model = Lookup()
    gm = optimus.optimize(model, (_ids((64,)),))
    assert _fired(gm) == 0
    assert gm.optimus_report.declined.get(RULE, 0) == 1


class WordLanguageModel(nn.Module):
    """pytorch/examples' ``word_language_model`` RNNModel (LSTM), as the example writes it: an
    ``nn.Embedding`` encoder read through dropout, optionally tied to the decoder's weight."""

    def __init__(self, ntoken: int, ninp: int, nlayers: int, tie_weights: bool) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(0.5)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, ninp, nlayers, dropout=0.5)
        self.decoder = nn.Linear(ninp, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight

    def forward(self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> Any:
        emb = self.drop(self.encoder(x))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_pytorch_examples_word_language_model_bit_for_bit(tied: bool) -> None:
    """Code this repository did not write: 35 x 20 tokens (the example's bptt and batch), the
    encoder's lookup rewritten, one training step's outputs and every gradient bit for bit (with
    tied weights the table's gradient also gets the decoder's)."""
    torch.manual_seed(0)
    model = WordLanguageModel(500, 32, 2, tied)
    ref = copy.deepcopy(model)
    x = torch.randint(0, 500, (35, 20), generator=torch.Generator().manual_seed(1))
    hidden = (torch.zeros(2, 20, 32), torch.zeros(2, 20, 32))
    target = torch.randint(0, 500, (700,), generator=torch.Generator().manual_seed(2))
    gm = optimus.optimize(model, (x, hidden))
    assert _fired(gm) == 1

    def step(fn: Any, module: nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
        module.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        out, _ = fn(x, hidden)
        F.nll_loss(out, target).backward()
        return out.detach(), [p.grad.clone() for p in module.parameters() if p.grad is not None]

    (want, want_grads), (got, got_grads) = step(ref, ref), step(gm, model)
    assert torch.equal(got, want)
    assert len(got_grads) == len(want_grads) == len(list(ref.parameters()))
    assert all(torch.equal(g, w) for g, w in zip(got_grads, want_grads, strict=True))


def test_left_alone_for_inductor() -> None:
    """Inductor decomposes both backwards into one accumulating ``index_put``: nothing to gain."""
    from optimus.cost.analytic import AnalyticCostModel

    gm = optimus.optimize(Lookup(), (_ids((MANY,)),), cost_model=AnalyticCostModel(inductor=True))
    assert _fired(gm) == 0
    assert f"{RULE}: Inductor lowers both backwards to one scatter-add" in gm.optimus_report.declined_reasons
