"""A chunked chain's input that is a column slab of one linear (optimus/memory/chunk_slab.py
item 2): MMoE's experts' first layers, merged with the gates into one GEMM, are computed per
chunk from their own weight rows and the gates from theirs, so the whole ``[B, E * H + gates]``
output never exists; values, layout and gradients are the unchunked graph's and eager's. Not
recognised (the chunks then read ``narrow`` views of the whole output, as before) where another
reader overlaps the slab's columns or is not a column ``narrow``/``split``."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from layout_helpers import assert_same_results
from optimus_helpers import assert_parity
from torch import fx, nn

import optimus
from optimus.engine.param_layout import RuntimeStack
from optimus.memory import chunk_slab
from optimus.params.relayout import RelayoutParams
from optimus.semantics.meta import record


class _MMoE(nn.Module):
    """Experts (Linear -> ReLU -> Linear -> ReLU) and per-task softmax gates over one input:
    the mmoe family's dense arch without adapters."""

    def __init__(self, d: int = 12, h: int = 16, o: int = 8, experts: int = 4, tasks: int = 2) -> None:
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, o), nn.ReLU()) for _ in range(experts)
        )
        self.gates = nn.ModuleList(nn.Linear(d, experts) for _ in range(tasks))
        self.heads = nn.ModuleList(nn.Linear(o, 1) for _ in range(tasks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts = torch.stack([e(x) for e in self.experts], dim=1)
        out = []
        for gate, head in zip(self.gates, self.heads, strict=True):
            weights = torch.softmax(gate(x), dim=-1).unsqueeze(-1)
            out.append(head((weights * experts).sum(dim=1)))
        return torch.cat(out, dim=1)


def _config(chunk: int | None, relayout: bool = True) -> optimus.OptimusConfig:
    return optimus.OptimusConfig(
        layout=RelayoutParams() if relayout else RuntimeStack(),
        cost_model=optimus.AnalyticCostModel(inductor=True),
        inference_chunk_bytes=chunk,
    )


def _widths(gm: fx.GraphModule) -> list[int]:
    """Output widths of the graph's 2-D linears."""
    from optimus.semantics.meta import tensor_meta

    out = []
    for n in gm.graph.nodes:
        if n.target is F.linear and (m := tensor_meta(n)) is not None and len(m.shape) == 2:
            out.append(m.shape[1])
    return out


def test_experts_first_layer_is_computed_per_chunk() -> None:
    torch.manual_seed(0)
    module, x = _MMoE().eval(), torch.randn(32, 12)
    whole = optimus.optimize(module, (x,), config=_config(None))
    assert whole.optimus_report.rules_fired.get("merge_shared_linear", 0) >= 1
    assert 4 * 16 + 2 * 4 in _widths(whole)  # experts' first layers and both gates: one GEMM
    gm = optimus.optimize(module, (x,), config=_config(32 * 16 * 4))  # one member a chunk
    rep = gm.optimus_report
    assert rep.chunked_groups >= 1
    assert any("linear computed per chunk" in n for n in rep.notes), rep.notes
    widths = _widths(gm)
    assert 4 * 16 + 2 * 4 not in widths and 4 * 16 not in widths
    assert widths.count(16) == 4 and 2 * 4 in widths  # each expert's rows; the gates' own
    with torch.no_grad():
        torch.testing.assert_close(gm(x), whole(x), rtol=1e-6, atol=1e-6)
    assert_same_results(module(x), gm(x), [x, *module.parameters()])


class _WideHead(nn.Module):
    """``_MMoE`` under a head far wider than the experts' merged GEMM: the step's peak is the head's."""

    def __init__(self) -> None:
        super().__init__()
        self.mmoe = _MMoE()
        self.wide = nn.Linear(2, 4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.wide(self.mmoe(x))).sum(dim=1)


def test_a_slab_that_does_not_hold_the_peak_keeps_its_linear_whole() -> None:
    """Per chunk, the merged GEMM would be narrower GEMMs (slower) for no lower peak: the chunks
    read ``narrow`` views of the whole linear instead, and the report says why."""
    torch.manual_seed(0)
    module, x = _WideHead().eval(), torch.randn(32, 12)
    whole = optimus.optimize(module, (x,), config=_config(None))
    gm = optimus.optimize(module, (x,), config=_config(32 * 16 * 4))
    rep = gm.optimus_report
    assert rep.chunked_groups >= 1
    assert not any("linear computed per chunk" in n for n in rep.notes), rep.notes
    assert any(n.startswith("chunk_slab: 1 linear(s) kept whole") for n in rep.notes), rep.notes
    assert 4 * 16 + 2 * 4 in _widths(gm)  # the experts' first layers and the gates: one GEMM
    with torch.no_grad():
        torch.testing.assert_close(gm(x), whole(x), rtol=1e-6, atol=1e-6)
    assert_same_results(module(x), gm(x), [x, *module.parameters()])


def test_backward_through_per_chunk_linears_in_eval_mode() -> None:
    torch.manual_seed(0)  # 8 experts: with the members stacked per call, the second layers batch
    module, x = _MMoE(experts=8).eval(), torch.randn(32, 12)
    gm = optimus.optimize(module, (x,), config=_config(32 * 16 * 4, relayout=False))
    assert any("linear computed per chunk" in n for n in gm.optimus_report.notes)
    assert_parity(module, gm, (x,))


def _slab_graph(rest: str) -> tuple[fx.GraphModule, fx.Node, tuple[torch.Tensor, ...]]:
    """``linear`` whose columns [0, 12) are 3 members of 4 read as ``[3, B, 4]``, and whose
    other columns are read as ``rest`` says."""
    graph = fx.Graph()
    x, w, b = graph.placeholder("x"), graph.placeholder("w"), graph.placeholder("b")
    lin = graph.call_function(F.linear, (x, w, b))
    nar = graph.call_function(torch.narrow, (lin, 1, 0, 12))
    src = graph.call_method("movedim", (graph.call_method("unflatten", (nar, 1, (3, 4))), 1, 0))
    outs = [graph.call_function(torch.relu, (src,))]
    if rest == "split":
        parts = graph.call_function(torch.split, (lin, [12, 2, 2], 1))
        outs += [
            graph.call_function(operator.getitem, (parts, 1)),
            graph.call_function(operator.getitem, (parts, 2)),
        ]
    elif rest == "narrow":
        outs.append(graph.call_function(torch.narrow, (lin, 1, 12, 4)))
    elif rest == "both":  # a narrow of the gates' first columns and a split read at its last piece
        outs.append(graph.call_function(torch.narrow, (lin, 1, 12, 2)))
        parts = graph.call_function(torch.split, (lin, [14, 2], 1))
        outs.append(graph.call_function(operator.getitem, (parts, 1)))
    elif rest == "overlap":
        outs.append(graph.call_function(torch.narrow, (lin, 1, 8, 8)))
    elif rest == "whole":
        outs.append(graph.call_function(torch.sigmoid, (lin,)))
    graph.output(tuple(outs))
    gm = fx.GraphModule(nn.Module(), graph)
    inputs = (torch.randn(5, 6), torch.randn(16, 6), torch.randn(16))
    record(gm, inputs)
    return gm, src, inputs


def test_find_takes_column_readers_outside_the_slab() -> None:
    for rest in ("split", "narrow", "both", "none"):
        _gm, src, _ = _slab_graph(rest)
        slab = chunk_slab.find(src, set())
        assert slab is not None, rest
        assert (slab.offset, slab.width) == (0, 4)


def test_find_declines_overlapping_or_whole_readers() -> None:
    """Columns the slab also holds, or the whole value, read elsewhere: computing the slab again
    per chunk would not free the linear's output; so is anything in the alias class of a value
    written in place."""
    for rest in ("overlap", "whole"):
        gm, src, _ = _slab_graph(rest)
        assert chunk_slab.find(src, set()) is None, rest
    gm, src, _ = _slab_graph("split")
    lin = next(n for n in gm.graph.nodes if n.target is F.linear)
    assert chunk_slab.find(src, {lin}) is None


def test_emit_and_restrict_compute_the_same_values() -> None:
    """Chunks of the slab from their own weight rows, and the rest's readers re-pointed to a
    linear of the rest's rows: the graph's outputs are unchanged (last bits aside)."""
    for rest in ("split", "narrow", "both", "none"):
        gm, src, inputs = _slab_graph(rest)
        ref = gm(*inputs)
        slab = chunk_slab.find(src, set())
        assert slab is not None
        graph = gm.graph
        relu = next(iter(src.users))
        pieces, cursor = [], src
        for start in range(3):
            cursor = chunk_slab.emit(graph, slab, start, 1, cursor)
            pieces.append(cursor)
        with graph.inserting_after(cursor):
            cat = graph.call_function(torch.cat, (pieces, 0))
        relu.replace_input_with(src, cat)
        graph.erase_node(src)
        for view in slab.chain:
            graph.erase_node(view)
        chunk_slab.restrict(graph, slab)
        graph.lint()
        gm.recompile()
        assert not any(n is slab.linear for n in graph.nodes), rest
        for a, b in zip(ref, gm(*inputs), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_an_effect_between_the_linear_and_the_chain_keeps_the_linear_whole() -> None:
    """A grad-mode switch placed after the merged linear: the chunks, which run after the chain,
    would compute their columns in the other mode. The group is still cut (its chunks read
    ``narrow`` views of the whole linear, computed where it was), and the values are the same."""
    from optimus.memory.chunked import chunk_stacked

    graph = fx.Graph()
    x, w, b, w2 = (graph.placeholder(n) for n in ("x", "w", "b", "w2"))
    lin = graph.call_function(F.linear, (x, w, b))
    graph.call_function(torch._C._set_grad_enabled, (False,))
    src = graph.call_method(
        "movedim",
        (
            graph.call_method("unflatten", (graph.call_function(torch.narrow, (lin, 1, 0, 12)), 1, (3, 4))),
            1,
            0,
        ),
    )
    h = graph.call_function(
        torch.relu, (graph.call_function(torch.bmm, (graph.call_function(torch.relu, (src,)), w2)),)
    )
    graph.call_function(torch._C._set_grad_enabled, (True,))
    moved = graph.call_function(torch.movedim, (h, 0, 1))
    experts = graph.call_function(torch.clone, (moved,), {"memory_format": torch.contiguous_format})
    gates = graph.call_function(torch.narrow, (lin, 1, 12, 2))
    graph.output((experts, gates))
    gm = fx.GraphModule(nn.Module(), graph)
    inputs = (torch.randn(5, 6), torch.randn(14, 6), torch.randn(14), torch.randn(3, 4, 4))
    record(gm, inputs)
    ref = gm(*inputs)
    done, notes = chunk_stacked(gm, 1)
    assert done == 1, notes
    assert not any("per chunk" in n for n in notes), notes
    assert any(n.target is F.linear for n in gm.graph.nodes)
    for a, got in zip(ref, gm(*inputs), strict=True):
        torch.testing.assert_close(got, a, rtol=1e-6, atol=1e-6)
    assert torch.is_grad_enabled()
