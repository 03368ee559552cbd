"""Fused chains run a few members at a time in inference for Inductor (optimus/memory/chunked.py):
the chunked graph computes what the unchunked one does (dtypes, strides,
aliasing, gradients when a user backpropagates in eval mode; values to the last bits, as a
batched GEMM of fewer members may be blocked otherwise), the seam ``cat`` between two groups is
gone, and it is left alone in training, without an Inductor cost model, with the option off,
where a stacked value is read whole, and where an effect lies among the group's nodes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from layout_helpers import assert_same_results
from optimus_helpers import assert_parity
from torch import fx, nn

import optimus
from optimus.engine.param_layout import RuntimeStack
from optimus.memory.chunked import chunk_stacked
from optimus.params.relayout import RelayoutParams


class _Tower(nn.Module):
    """Linear -> LayerNorm -> SiLU twice, gated by sigmoid(Linear(x)): the towers family's tower."""

    def __init__(self, d: int, w: int) -> None:
        super().__init__()
        self.l1, self.n1 = nn.Linear(d, w), nn.LayerNorm(w)
        self.l2, self.n2 = nn.Linear(w, w), nn.LayerNorm(w)
        self.gate = nn.Linear(d, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.n2(self.l2(F.silu(self.n1(self.l1(x))))))
        return h * torch.sigmoid(self.gate(x))


class _Towers(nn.Module):
    """``wide`` towers over 4-wide pieces of one input and ``narrow`` over 2-wide pieces of
    another (two first-layer groups meeting one layer-norm group: a seam), then a head."""

    def __init__(self, wide: int = 12, narrow: int = 3, w: int = 8) -> None:
        super().__init__()
        self.a = nn.ModuleList(_Tower(4, w) for _ in range(wide))
        self.b = nn.ModuleList(_Tower(2, w) for _ in range(narrow))
        self.head = nn.Linear((wide + narrow) * w, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        outs = [t(p) for t, p in zip(self.a, torch.split(x, 4, dim=1), strict=True)]
        outs += [t(p) for t, p in zip(self.b, torch.split(y, 2, dim=1), strict=True)]
        return self.head(torch.cat(outs, dim=1))


def _model(
    training: bool = False, wide: int = 12, narrow: int = 3
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    module = _Towers(wide, narrow)
    module.train(training)
    return module, (torch.randn(32, 4 * wide), torch.randn(32, 2 * narrow))


def _config(chunk: int | None = 2048, inductor: bool = True, relayout: bool = True) -> optimus.OptimusConfig:
    return optimus.OptimusConfig(
        layout=RelayoutParams() if relayout else RuntimeStack(),
        cost_model=optimus.AnalyticCostModel(inductor=inductor),
        inference_chunk_bytes=chunk,
    )


def _count(gm: fx.GraphModule, target: object) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is target or n.target == target)


def _dim0_cats(gm: fx.GraphModule) -> int:
    return sum(
        1
        for n in gm.graph.nodes
        if n.target is torch.cat and (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) == 0
    )


def test_chunks_compute_what_the_whole_chain_does() -> None:
    module, inputs = _model()
    whole = optimus.optimize(module, inputs, config=_config(chunk=None))
    module2, _ = _model()
    gm = optimus.optimize(module2, inputs, config=_config())
    rep = gm.optimus_report
    assert rep.chunked_groups == 1
    assert whole.optimus_report.chunked_groups == 0
    # 2048 bytes per chunk over [32, 8]-float members: a few members a chunk, each chunk its own
    # batched GEMM; no chunk straddles a dim-0 cat, so none is added
    bmm_whole, bmm_chunked = _count(whole, torch.baddbmm), _count(gm, torch.baddbmm)
    assert bmm_whole >= 1 and bmm_chunked > bmm_whole
    assert _dim0_cats(gm) <= _dim0_cats(whole)
    assert any("chunks of at most" in note for note in rep.notes)
    with torch.no_grad():
        torch.testing.assert_close(gm(*inputs), whole(*inputs), rtol=1e-6, atol=1e-7)
    assert not any(n.target is torch.relu for n in gm.graph.nodes)
    assert_same_results(module(*inputs), gm(*inputs), [*inputs, *module.parameters()])


def test_backward_through_chunks_in_eval_mode_matches_eager() -> None:
    """Gradients w.r.t. every parameter (``autograd.grad``: members stacked per call, since a
    re-laid-out member is not in the autograd graph) and the inputs."""
    module, inputs = _model()
    gm = optimus.optimize(module, inputs, config=_config(relayout=False))
    assert gm.optimus_report.chunked_groups == 1
    assert_parity(module, gm, inputs)


def test_chunks_keep_the_estimated_peak_of_the_unchunked_graph_or_lower() -> None:
    from optimus.memory.live import estimate
    from optimus.semantics.normalize import canonicalize

    def peak(gm: fx.GraphModule) -> float:
        nodes = list(gm.graph.nodes)
        return estimate(nodes, {n: canonicalize(n) for n in nodes}).peak

    module, inputs = _model(wide=24, narrow=4)
    whole = optimus.optimize(module, inputs, config=_config(chunk=None))
    chunked = optimus.optimize(_model(wide=24, narrow=4)[0], inputs, config=_config())
    assert chunked.optimus_report.chunked_groups == 1
    assert peak(chunked) <= peak(whole)


def test_left_alone_in_training() -> None:
    module, inputs = _model(training=True)
    gm = optimus.optimize(module, inputs, config=_config(relayout=False))
    assert gm.optimus_report.chunked_groups == 0
    assert_parity(module, gm, inputs)


def test_left_alone_without_an_inductor_cost_model_or_with_the_option_off() -> None:
    for config in (_config(inductor=False), _config(chunk=None)):
        module, inputs = _model()
        gm = optimus.optimize(module, inputs, config=config)
        assert gm.optimus_report.chunked_groups == 0
        assert not any("chunks of at most" in note for note in gm.optimus_report.notes)


def test_a_stacked_value_read_whole_leaves_its_group_alone() -> None:
    """A fused value read by anything but the per-member hand-back (here the graph returns the
    stacked output of a batched GEMM) would have to be copied back whole from the chunks."""

    class Stacked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 4, 8))
            self.b = nn.Parameter(torch.randn(6, 1, 8))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = torch.baddbmm(self.b, x, self.w)
            return h, torch.sigmoid(h).sum()

    torch.manual_seed(0)
    module = Stacked().eval()
    inputs = (torch.randn(6, 16, 4),)
    gm = fx.symbolic_trace(module)
    from optimus.semantics.meta import record

    record(gm, inputs)
    done, notes = chunk_stacked(gm, 128)
    assert done == 0
    assert any("copied whole" in n or "returned by the graph" in n for n in notes)
    ref = module(*inputs)
    got = gm(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


def test_an_effect_in_the_graph_leaves_it_alone() -> None:
    class WithEffect(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 4, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.bmm(x, self.w)
            x.add_(1.0)  # a mutation anywhere: the pass cannot move reads past it safely
            return torch.flatten(torch.movedim(torch.sigmoid(h), 0, 1), 1, 2)

    torch.manual_seed(0)
    module = WithEffect().eval()
    inputs = (torch.randn(6, 16, 4),)
    gm = fx.symbolic_trace(module)
    from optimus.semantics.meta import record

    record(gm, (inputs[0].clone(),))
    done, notes = chunk_stacked(gm, 128)
    assert done == 0
    assert any("effect" in n for n in notes)


def test_a_plain_batch_dim_is_not_a_group() -> None:
    """Without a batched GEMM a leading dim is the batch, not a group of members: left alone."""

    class Plain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.flatten(torch.movedim(torch.sigmoid(x) * 2.0, 0, 1), 1, 2)

    gm = fx.symbolic_trace(Plain())
    from optimus.semantics.meta import record

    record(gm, (torch.randn(64, 16, 8),))
    assert chunk_stacked(gm, 128) == (0, [])


def test_a_seam_between_two_groups_is_cut_not_copied() -> None:
    """Two batched GEMMs of 6 and 2 members meeting one 8-member chain through a dim-0 cat (the
    towers family's sparse and dense towers): every chunk lies within one of them, so the cat
    goes, and the values are eager's."""

    class Seam(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wa, self.ba = nn.Parameter(torch.randn(6, 4, 8)), nn.Parameter(torch.randn(6, 1, 8))
            self.wb, self.bb = nn.Parameter(torch.randn(2, 3, 8)), nn.Parameter(torch.randn(2, 1, 8))
            self.w2 = nn.Parameter(torch.randn(8, 8, 8))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            h = torch.cat([torch.baddbmm(self.ba, x, self.wa), torch.baddbmm(self.bb, y, self.wb)], 0)
            h = F.silu(F.layer_norm(h, (8,)))
            h = torch.bmm(h, self.w2) * 0.5
            return torch.flatten(torch.movedim(h, 0, 1), 1, 2)

    torch.manual_seed(0)
    module = Seam().eval()
    inputs = (torch.randn(6, 16, 4), torch.randn(2, 16, 3))
    gm = fx.symbolic_trace(module)
    from optimus.semantics.meta import record

    record(gm, inputs)
    assert _dim0_cats(gm) == 1
    done, notes = chunk_stacked(gm, 2 * 16 * 8 * 4)  # two members a chunk
    assert done == 1, notes
    assert _dim0_cats(gm) == 0
    assert _count(gm, torch.bmm) == 4  # 6 + 2 members in chunks of 2
    assert not any(n.target is torch.relu for n in gm.graph.nodes)
    assert_same_results(module(*inputs), gm(*inputs), [*inputs, *module.parameters()])
    torch.testing.assert_close(gm(*inputs), module(*inputs), rtol=1e-6, atol=1e-7)


def test_random_tower_arches_chunk_exactly() -> None:
    """Towers arches of random group sizes, widths, batches and chunk sizes (chunks of two members
    up to the whole group, seams anywhere): the chunked graph equals the unchunked one
    within the last bits (a batched GEMM of fewer members may be blocked otherwise, as batching
    itself differs from eager's per-member GEMMs) and eager within tolerance, with the same
    output layout."""
    import random

    rng = random.Random(16)
    chunked_any = 0
    for case in range(10):
        wide, narrow = rng.randint(2, 20), rng.randint(1, 6)
        batch, chunk = rng.choice((1, 3, 16, 64)), rng.choice((1, 512, 4096, 1 << 20))
        torch.manual_seed(case)
        module = _Towers(wide, narrow, w=rng.choice((4, 8))).eval()
        inputs = (torch.randn(batch, 4 * wide), torch.randn(batch, 2 * narrow))
        whole = optimus.optimize(module, inputs, config=_config(chunk=None))
        gm = optimus.optimize(module, inputs, config=_config(chunk=chunk))
        chunked_any += gm.optimus_report.chunked_groups
        with torch.no_grad():  # a GEMM library may block a smaller batch otherwise: last bits
            torch.testing.assert_close(gm(*inputs), whole(*inputs), rtol=1e-6, atol=1e-7)
        assert not any(n.target is torch.relu for n in gm.graph.nodes)
    assert_same_results(module(*inputs), gm(*inputs), [*inputs, *module.parameters()])
    assert chunked_any >= 3  # the draws above cut most arches


def test_experts_handed_back_as_a_contiguous_copy_are_chunked() -> None:
    """MMoE's experts: ``relu(bmm(.))`` read as ``clone(movedim(v, 0, 1), contiguous)`` (the
    ``[B, E, H]`` tensor every task pools). The chunks' own ``movedim`` are concatenated on dim 1:
    the same contiguous ``[B, E, H]`` values in new storage."""

    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 8, 4))
            self.b = nn.Parameter(torch.randn(6, 1, 4))
            self.gate = nn.Parameter(torch.randn(6))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(torch.baddbmm(self.b, torch.relu(x), self.w))
            experts = torch.movedim(h, 0, 1).clone(memory_format=torch.contiguous_format)
            return (torch.softmax(self.gate, 0)[None, :, None] * experts).sum(1)

    torch.manual_seed(0)
    module = Experts().eval()
    inputs = (torch.randn(6, 16, 8),)
    gm = fx.symbolic_trace(module)
    from optimus.semantics.meta import record

    record(gm, inputs)
    done, notes = chunk_stacked(gm, 2 * 16 * 8 * 4)
    assert done == 1, notes
    assert _count(gm, torch.baddbmm) == 3
    assert not any(n.target == "clone" for n in gm.graph.nodes)
    assert_same_results(module(*inputs), gm(*inputs), [*inputs, *module.parameters()])
    assert_parity(module, gm, inputs)


def test_a_failing_pass_leaves_the_rules_graph(monkeypatch: object) -> None:
    """An error inside the pass undoes it alone: the rules' fused graph is kept and runs."""
    import pytest

    import optimus.api

    def broken(gm: fx.GraphModule, chunk: int) -> tuple[int, list[str]]:
        first = next(iter(gm.graph.nodes))
        with gm.graph.inserting_after(first):
            gm.graph.call_function(torch.relu, (first,))  # a half-made change, then a failure
        raise RuntimeError("boom")

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(optimus.api, "chunk_lightest", broken)
    module, inputs = _model()
    gm = optimus.optimize(module, inputs, config=_config())
    rep = gm.optimus_report
    assert rep.chunked_groups == 0
    assert any(note.startswith("chunk_stacked: undone: RuntimeError: boom") for note in rep.notes)
    assert rep.rules_fired.get("batch_linear", 0) + rep.rules_fired.get("merge_shared_linear", 0) >= 1
    assert not any(n.target is torch.relu for n in gm.graph.nodes)  # the half-made change is gone
    assert_same_results(module(*inputs), gm(*inputs), [*inputs, *module.parameters()])


def test_optimize_leaves_the_callers_autocast_alone() -> None:
    """A graph with an autocast region: the pass reads every node's metadata, and a context
    node's is never found by running it (that switched autocast on in the caller, seen on fuzz
    example 7200 as wrong dtypes in every later call)."""

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = self.lin(x)
            return y.float() * 2

    torch.manual_seed(0)
    module, x = Mixed().eval(), torch.randn(2, 4)
    gm = optimus.optimize(module, (x,), config=_config())
    assert not torch.is_autocast_enabled("cpu")
    assert torch.is_grad_enabled()
    assert_same_results(module(x), gm(x), [x, *module.parameters()])


def test_chunks_whose_kernels_differ_stay_within_the_graphs_budget() -> None:
    """The towers' chunks read their stacked layer-norm weights inside generated kernels (a
    distinct kernel per chunk for Inductor to compile): however small ``chunk_bytes``, the graph
    is cut into about MAX_CHUNKS chunks, plus the cuts at the seam, not one per member. MMoE's
    experts, whose parameters only reach GEMM library calls, are cut to one member a chunk
    (tests/optimus/memory/test_chunk_slab.py)."""
    import re

    from optimus.memory.chunked import MAX_CHUNKS

    module, inputs = _model(wide=24, narrow=4)
    gm = optimus.optimize(module, inputs, config=_config(chunk=1))
    counts = [int(m.group(1)) for n in gm.optimus_report.notes if (m := re.search(r"in (\d+) chunks", n))]
    assert counts and sum(counts) <= MAX_CHUNKS + 2, gm.optimus_report.notes
    assert_same_results(module(*inputs), gm(*inputs), [*inputs, *module.parameters()])
