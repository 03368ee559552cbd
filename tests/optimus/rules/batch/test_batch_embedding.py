"""batch_embedding: per-feature lookups become one lookup in the concatenated table.

Firing cases check values and gradients bit for bit against eager (every row is read from the
same place), layouts, and with the re-layout that the tables stay the user's parameters (a load
reaches the forward). Must-not-fire cases: lookups whose semantics a concatenated table would
change (``padding_idx``, ``max_norm``, which writes the table), other widths, and the cost-model
decline when each call would have to copy the tables.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND
from torch import nn

import optimus
from optimus.config import OptimusConfig
from optimus.params.relayout import RelayoutParams

G = 16  # the cost model takes the rewrite from about 10 lookups (the index check costs 4 ops)


class PerFeature(nn.Module):
    """A CTR model zoo's input layer: one ``nn.Embedding`` per categorical column of ``X``."""

    def __init__(self, widths: list[int] | None = None, **embedding_kw: object) -> None:
        super().__init__()
        widths = widths or [4] * G
        self.embs = nn.ModuleList([nn.Embedding(5 + 3 * i, w, **embedding_kw) for i, w in enumerate(widths)])  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [emb(x[:, i].long()) for i, emb in enumerate(self.embs)]
        return (
            torch.cat([o.sum(1, keepdim=True) for o in outs], 1)
            if len({o.shape for o in outs}) > 1
            else torch.stack(outs, 1)
        )


def _inputs(model: PerFeature, batch: int = 6, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    cols = [torch.randint(0, e.num_embeddings, (batch,), generator=gen) for e in model.embs]
    return torch.stack(cols, 1).float()


def _train_step(model: nn.Module, fn: object, x: torch.Tensor) -> torch.Tensor:
    out = fn(x)  # type: ignore[operator]
    (out * torch.arange(out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach()


@pytest.mark.parametrize(
    ("config", "cost_model"),
    [
        (OptimusConfig(layout=RelayoutParams()), None),  # the tables are one storage: no copy
        (OptimusConfig(), LAUNCH_BOUND),  # a cat of the tables per call, rated a win here
    ],
    ids=["relayout", "runtime-cat"],
)
def test_lookups_become_one_and_match_eager_bit_for_bit(config: OptimusConfig, cost_model: object) -> None:
    torch.manual_seed(0)
    model = PerFeature()
    ref = copy.deepcopy(model)
    x = _inputs(model)
    kw = {"cost_model": cost_model} if cost_model is not None else {}
    gm = optimus.optimize(model, (x,), config=config, **kw)  # type: ignore[arg-type]
    assert gm.optimus_report.rules_fired.get("batch_embedding") == 1
    lookups = [n for n in gm.graph.nodes if n.target is F.embedding]
    assert len(lookups) == 1
    want, got = _train_step(ref, ref, x), _train_step(model, gm, x)
    assert torch.equal(got, want)
    assert_same_results(ref(x), gm(x), sources=[x])
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        assert q.grad is not None and torch.equal(q.grad, p.grad), name


def test_relayout_keeps_each_table_a_parameter_of_the_user() -> None:
    torch.manual_seed(0)
    model = PerFeature()
    x = _inputs(model)
    gm = optimus.optimize(model, (x,), config=OptimusConfig(layout=RelayoutParams()))
    assert gm.optimus_report.rules_fired.get("batch_embedding") == 1
    keys = set(PerFeature().state_dict())
    assert set(model.state_dict()) == keys
    fresh = PerFeature()
    torch.nn.init.normal_(fresh.embs[3].weight)
    model.load_state_dict(fresh.state_dict())  # writes through the views into the one table
    torch.testing.assert_close(gm(x), fresh(x), rtol=0, atol=0)


def test_an_index_outside_its_table_raises_instead_of_reading_the_next_table() -> None:
    torch.manual_seed(0)
    model = PerFeature()
    x = _inputs(model)
    gm = optimus.optimize(model, (x,), config=OptimusConfig(layout=RelayoutParams()))
    assert gm.optimus_report.rules_fired.get("batch_embedding") == 1
    bad = x.clone()
    bad[0, 2] = model.embs[2].num_embeddings  # one past table 2: row 0 of table 3 when fused
    with pytest.raises(IndexError):
        model(bad)  # eager
    with pytest.raises(IndexError):
        gm(bad)
    bad[0, 2] = -1  # row -1 of table 2 would be the last row of table 1 when fused
    for fn in (model, gm):
        with pytest.raises(IndexError):
            fn(bad)


@pytest.mark.parametrize(
    "kw",
    [{"padding_idx": 0}, {"max_norm": 1.0}, {"scale_grad_by_freq": True}],
    ids=["padding_idx", "max_norm", "scale_grad_by_freq"],
)
def test_lookups_a_concatenated_table_would_change_stay(kw: dict[str, object]) -> None:
    torch.manual_seed(0)
    model = PerFeature(**kw)
    ref = copy.deepcopy(model)
    x = _inputs(model)
    gm = optimus.optimize(model, (x,), config=OptimusConfig(layout=RelayoutParams()), cost_model=LAUNCH_BOUND)
    assert "batch_embedding" not in gm.optimus_report.rules_fired
    torch.testing.assert_close(_train_step(model, gm, x), _train_step(ref, ref, x))
    for p, q in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p)  # max_norm renormalizes rows in place: alike
        torch.testing.assert_close(q.grad, p.grad)


def test_tables_of_other_widths_are_not_grouped() -> None:
    torch.manual_seed(0)
    model = PerFeature(widths=[4, 8] * G)
    x = _inputs(model)
    gm = optimus.optimize(model, (x,), config=OptimusConfig(layout=RelayoutParams()))
    assert gm.optimus_report.rules_fired.get("batch_embedding") == 2  # one per width
    torch.testing.assert_close(gm(x), copy.deepcopy(model)(x), rtol=0, atol=0)


def test_cost_model_declines_copying_large_tables_every_call() -> None:
    """Without the re-layout the concatenated table is a copy per call: for tables of 2,000+ rows
    the default CPU model rates it slower than the separate lookups, and declines."""

    class Big(PerFeature):
        def __init__(self) -> None:
            super().__init__()
            self.embs = nn.ModuleList([nn.Embedding(2000 + i, 16) for i in range(G)])

    torch.manual_seed(0)
    model = Big()
    x = _inputs(model)
    gm = optimus.optimize(model, (x,))
    report = gm.optimus_report
    assert "batch_embedding" not in report.rules_fired
    assert report.declined.get("batch_embedding", 0) >= 1, report.declined
    relaid = optimus.optimize(copy.deepcopy(model), (x,), config=OptimusConfig(layout=RelayoutParams()))
    assert relaid.optimus_report.rules_fired.get("batch_embedding") == 1  # no copy: taken


class ConcatenatedInputLayer(nn.Module):
    """DeepCTR's input layer: ``emb_i(X[:, i:i+1].long())`` per column, the lookups concatenated
    along the last dim and flattened; ``peek`` also reads one lookup elsewhere (a sum)."""

    def __init__(self, peek: bool = False) -> None:
        super().__init__()
        self.peek = peek
        self.embs = nn.ModuleList([nn.Embedding(5 + 3 * i, 4) for i in range(G)])
        self.head = nn.Linear(4 * G, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [emb(x[:, i : i + 1].long()) for i, emb in enumerate(self.embs)]  # [B, 1, D] each
        y = self.head(torch.flatten(torch.cat(outs, -1), 1))
        return y + outs[3].sum() if self.peek else y


def _head_reads_the_lookup_storage(gm: torch.fx.GraphModule, x: torch.Tensor) -> bool:
    """Run ``gm`` node by node: does the head linear's input share the lookup output's storage?"""
    seen: dict[str, torch.Tensor] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> object:
            out = super().run_node(n)
            if isinstance(out, torch.Tensor):
                seen[n.name] = out
            return out

    Recorder(gm).run(x)
    nodes = list(gm.graph.nodes)
    (lookup,) = [n for n in nodes if n.target is F.embedding]
    (head,) = [n for n in nodes if n.target in (F.linear, torch._C._nn.linear)]
    fed = head.args[0]
    assert isinstance(fed, torch.fx.Node)
    ptr = seen[lookup.name].untyped_storage().data_ptr()
    return seen[fed.name].untyped_storage().data_ptr() == ptr


def _unbind_dims(gm: nn.Module) -> list[int]:
    return [int(n.args[1]) for n in gm.graph.nodes if n.target is torch.unbind]  # type: ignore[union-attr]


@pytest.mark.parametrize("peek", [False, True], ids=["only-cat", "another-reader"])
def test_lookups_read_only_by_a_cat_are_laid_side_by_side(peek: bool) -> None:
    """Lookups read only by ``cat`` come out of one ``[B, 1, G, D]`` lookup, unbound along G (views
    a cat cannot tell from eager's contiguous results); with another reader each result stays a
    contiguous ``[G, ...]`` block. Values and gradients bit for bit either way, and out-of-range
    ids still raise."""
    torch.manual_seed(0)
    model = ConcatenatedInputLayer(peek)
    ref = copy.deepcopy(model)
    x = _inputs(model)  # type: ignore[arg-type]
    gm = optimus.optimize(model, (x,), config=OptimusConfig(layout=RelayoutParams()))
    assert gm.optimus_report.rules_fired.get("batch_embedding") == 1
    if peek:
        assert 0 in _unbind_dims(gm)
    else:  # the cat became a view of the lookup's output: what the head reads is that storage
        assert not _unbind_dims(gm)
        assert _head_reads_the_lookup_storage(gm, x)
    want, got = _train_step(ref, ref, x), _train_step(model, gm, x)
    assert torch.equal(got, want)
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        assert q.grad is not None and torch.equal(q.grad, p.grad), name
    bad = x.clone()
    bad[0, 2] = model.embs[2].num_embeddings  # one past table 2: row 0 of table 3 when fused
    for fn in (ref, gm):
        with pytest.raises(IndexError):
            fn(bad)
