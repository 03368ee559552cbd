"""The memory ceiling (``OptimusConfig.memory_ceiling``): the live estimate's model of Inductor's
fusion, the whole run tried first and kept when it fits, every rewrite gated when it does not,
the graph left as captured when nothing fits, the trial leaving the module alone, forward and
backward parity of what is kept, and the re-layout's gradient buffers left off."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND, assert_parity, optimize_traced, traced_context
from torch import fx, nn

import optimus
from optimus.cost.analytic import AnalyticCostModel
from optimus.engine.context import RewriteContext
from optimus.memory.live import (
    ceiling_budget,
    copies_by_index,
    earliest_inputs_first,
    estimate,
    inductor_placement,
    scheduled_peak,
    static_bytes,
)
from optimus.params.relayout import RelayoutParams, retained_gradient_buffers
from optimus.semantics.meta import record

B, N, G = 8, 16, 6
NBYTES = B * N * 4  # one float32 [B, N] tensor


class NormBlock(nn.Module):
    """linear -> layer_norm -> silu -> linear: Inductor computes the norm inside the SiLU kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(N, N), nn.Linear(N, N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(nn.functional.silu(nn.functional.layer_norm(self.a(x), (N,))))


class Joined(nn.Module):
    """G relus read only by one cat: Inductor writes each into its slice of the cat's buffer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(x[i]) for i in range(G)], 1)


class Towers(nn.Module):
    """G towers relu(x[i]).sum(0), one after another: batching them holds G outputs at once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.relu(x[i]).sum(0) for i in range(G)])


class WideEnd(nn.Module):
    """Towers meeting in a big matmul at the end: the peak is there, a batched group fits under it."""

    def __init__(self, wide: int = 64) -> None:
        super().__init__()
        self.lin = nn.ModuleList(nn.Linear(N, N) for _ in range(G))
        self.big = nn.Linear(G * N, wide * G * N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [torch.relu(lin(x[i])) for i, lin in enumerate(self.lin)]
        return self.big(torch.cat(outs, 1)).sum(1)


class Both(nn.Module):
    """WideEnd's group (fits under the big matmul) beside towers on a larger input whose batching
    lifts the peak (the whole run: 55,296 -> 76,804 estimated bytes, parameters 28,608)."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = WideEnd(wide=8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.wide(x).sum() + torch.stack([torch.sigmoid(y[i]).sum(0) for i in range(G)]).sum()


def _x() -> torch.Tensor:
    return torch.randn(G, B, N, generator=torch.Generator().manual_seed(0))


def _optimize_eval(module: nn.Module, inputs: tuple[torch.Tensor, ...], **kw: Any) -> fx.GraphModule:
    """``optimize_traced`` of the module in eval mode (captured for inference: the gated trial)."""
    traced = fx.symbolic_trace(module)
    traced.eval()
    kw.setdefault("cost_model", LAUNCH_BOUND)
    return optimus.optimize(traced, inputs, **kw)


def _fired(gm: fx.GraphModule, rule: str) -> int:
    report: Any = gm.optimus_report
    return int(report.rules_fired.get(rule, 0))


def test_inductor_estimate_computes_a_norm_inside_its_reader() -> None:
    ctx = traced_context(NormBlock(), (torch.randn(B, N),))
    nodes, canons = ctx.index.nodes, ctx.index.canons
    norm = next(n for n in nodes if "layer_norm" in n.name)
    fused, joined = inductor_placement(nodes)
    assert norm in fused and not joined
    plain, inductor = estimate(nodes, canons), estimate(nodes, canons, inductor=True)
    # while the norm runs: x, a's output and (eager only) the norm's own output
    assert plain.at(norm) == 3 * NBYTES
    assert inductor.at(norm) == 2 * NBYTES
    # the norm's input lives on until the SiLU that computes the norm has run
    silu = next(n for n in nodes if "silu" in n.name)
    assert inductor.at(silu) == 3 * NBYTES  # x, a's output, silu's output


def test_inductor_estimate_writes_joined_pieces_into_the_cat() -> None:
    ctx = traced_context(Joined(), (_x(),))
    nodes, canons = ctx.index.nodes, ctx.index.canons
    _, joined = inductor_placement(nodes)
    assert len(joined) == G
    # eager: the input, every relu output and the cat at once; Inductor: the input and the cat
    assert estimate(nodes, canons).peak == 3 * G * NBYTES
    assert estimate(nodes, canons, inductor=True).peak == 2 * G * NBYTES


class SharedIntoTwoCats(nn.Module):
    """One relu read by two cats (dlrm's bottom-MLP output in every interaction group): Inductor
    computes it inside each cat's kernel, so each cat's buffer is alive only from its own cat."""

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        r = torch.relu(x)
        a = torch.cat([r, y], 1)
        big = torch.sigmoid(z).sum()  # runs between the two cats
        b = torch.cat([r, y], 1)
        return a.sum() + b.sum() + big


def test_a_piece_read_by_two_cats_is_written_into_neither() -> None:
    x, y, z = torch.randn(B, N), torch.randn(B, N), torch.randn(4 * B, N)
    ctx = traced_context(SharedIntoTwoCats(), (x, y, z))
    nodes, canons = ctx.index.nodes, ctx.index.canons
    by = {n.name: n for n in nodes}
    fused, joined = inductor_placement(nodes)
    assert by["relu"] in fused and by["relu"] not in joined
    est = estimate(nodes, canons, inductor=True)
    # while sigmoid runs (inside its sum): the inputs (6 [B, N]) and the first cat (2); the
    # second cat is not alive yet (written into from relu's position, it would be: 10)
    assert est.at(by["sigmoid"]) == (6 + 2) * NBYTES
    # in Joined, a relu read by one cat is still written into it
    assert len(inductor_placement(traced_context(Joined(), (_x(),)).index.nodes)[1]) == G


class IndexCopy(nn.Module):
    """``y[:, idx]`` with a tensor index is a new tensor (dlrm's pair selection after its bmm)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("idx", torch.arange(0, N, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        picked = y[:, self.idx]
        later = torch.sigmoid(x)  # y is dead here: only its copy is alive
        return picked.sum() + later.sum()


def test_advanced_indexing_is_a_copy_that_frees_its_base() -> None:
    ctx = traced_context(IndexCopy(), (torch.randn(B, N),))
    nodes, canons = ctx.index.nodes, ctx.index.canons
    by = {n.name: n for n in nodes}
    picked = next(n for n in nodes if n.name.startswith("getitem"))
    assert copies_by_index(picked) and not copies_by_index(by["relu"])
    est = estimate(nodes, canons)
    # while sigmoid runs: x, the copy (a quarter of y) and sigmoid's output; y is freed
    assert est.at(by["sigmoid"]) == 2 * NBYTES + NBYTES // 4


class LateReaders(nn.Module):
    """A stacked matmul read slice by slice, each slice joined with a later branch's output and
    fed to its own matmul (the fused dlrm projections and interaction groups, in small)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(G, N, N))
        self.bottom = nn.Linear(N, N)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        big = torch.bmm(x, self.w)
        bottom = torch.relu(self.bottom(y))
        outs = []
        for i in range(G):
            c = torch.cat([bottom, big[i]], 1)
            outs.append(torch.mm(c, c.t()))
        return torch.stack(outs).sum()


def test_scheduled_peak_takes_the_lower_of_graph_order_and_earliest_inputs_first() -> None:
    ctx = traced_context(LateReaders(), (_x(), torch.randn(B, N)))
    nodes, canons = ctx.index.nodes, ctx.index.canons
    order = earliest_inputs_first(nodes)
    assert sorted(n.name for n in order) == sorted(n.name for n in nodes) and order[-1].op == "output"
    seen: set[fx.Node] = set()
    for n in order:  # topological
        assert all(p in seen for p in n.all_input_nodes), n
        seen.add(n)
    names = [n.name for n in order]
    # every slice's cat runs as soon as the stacked matmul and the branch have (so the stacked
    # buffer can die) before any of the matmuls that read the cats
    assert max(i for i, name in enumerate(names) if name.startswith("cat")) < names.index("mm")
    graph_order = estimate(nodes, canons, inductor=True).peak
    assert scheduled_peak(nodes, canons, inductor=True) == min(
        graph_order, estimate(order, canons, inductor=True).peak
    )
    assert scheduled_peak(nodes, canons, inductor=True) <= graph_order
    # eager runs the graph as written
    assert scheduled_peak(nodes, canons) == estimate(nodes, canons).peak


class HandBack(nn.Module):
    """relu(x[i]) stacked, then handed back through views into a cat (the fused towers' form):
    Inductor writes the relu through ``flatten(movedim(.))`` straight into the cat's buffer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)  # [G, B, N]
        return torch.cat([torch.flatten(torch.movedim(y, 0, 1), 1, 2), x[0]], 1)


def test_inductor_estimate_writes_through_views_into_the_cat() -> None:
    ctx = traced_context(HandBack(), (_x(),))
    nodes, canons = ctx.index.nodes, ctx.index.canons
    views = {
        n: n.op in ("call_function", "call_method") and n.name.startswith(("movedim", "flatten", "getitem"))
        for n in nodes
    }
    _, joined = inductor_placement(nodes, lambda n: views.get(n, False))
    assert [n.name for n in joined] == ["relu"]
    # eager: x, relu's output and the cat; Inductor: x and the cat ([B, (G + 1) * N])
    assert estimate(nodes, canons).peak == (G + G + G + 1) * NBYTES
    assert estimate(nodes, canons, inductor=True).peak == (G + G + 1) * NBYTES


def test_the_estimate_models_inductor_only_for_an_inductor_cost_model() -> None:
    gm = fx.symbolic_trace(Joined())
    record(gm, (_x(),))
    assert RewriteContext(gm, LAUNCH_BOUND).live.peak == 3 * G * NBYTES
    assert RewriteContext(gm, AnalyticCostModel(inductor=True)).live.peak == 2 * G * NBYTES


def test_ceiling_budget_is_a_fraction_of_the_whole_program() -> None:
    assert ceiling_budget(static=1000.0, peak=1000.0, ceiling=0.02) == pytest.approx(1040.0)
    assert ceiling_budget(static=0.0, peak=1000.0, ceiling=0.0) == 1000.0
    lin = fx.symbolic_trace(nn.Linear(N, N))
    assert static_bytes(lin) == (N * N + N) * 4


def test_ceiling_declines_every_fusion_that_lifts_the_peak() -> None:
    inputs = (_x(),)
    free = optimize_traced(Towers(), inputs)
    assert _fired(free, "batch_unary") == 1
    assert free.optimus_report.live_peak_after > free.optimus_report.live_peak_before
    gm = _optimize_eval(Towers(), inputs, config=optimus.OptimusConfig(memory_ceiling=0.02))
    report: Any = gm.optimus_report
    assert _fired(gm, "batch_unary") == 0
    assert any(n.startswith("memory_ceiling: every rewrite gated") for n in report.notes)
    assert report.declined_reasons.get("batch_unary: over memory_ceiling", 0) >= 1
    assert report.live_peak_after == report.live_peak_before
    assert_parity(Towers(), gm, inputs)


def test_a_training_graph_is_judged_by_its_step_not_its_forward() -> None:
    """Must not decline: the fused forward breaks the ceiling (the gated inference run above),
    but in training the whole step is judged (``optimus.memory.step``), where the activations
    saved for the backward are alive in both graphs and the fusion fits; the run is the run
    without a ceiling (same rules, same graph)."""
    torch.manual_seed(0)
    module = Both().train()
    inputs = (_x(), torch.randn(G, 8 * B, N, generator=torch.Generator().manual_seed(1)))
    free = optimize_traced(module, inputs)
    static = static_bytes(fx.symbolic_trace(module))
    budget = ceiling_budget(static, free.optimus_report.live_peak_before, 0.02)
    assert free.optimus_report.live_peak_after > budget  # the forward alone would decline it
    gm = optimize_traced(module, inputs, config=optimus.OptimusConfig(memory_ceiling=0.02))
    report: Any = gm.optimus_report
    assert report.rules_fired == free.optimus_report.rules_fired
    assert _fired(gm, "batch_unary") == 2
    assert gm.code == free.code
    assert not any("memory_ceiling" in n for n in report.notes)
    assert_parity(module, gm, inputs)


def test_ceiling_leaves_the_graph_as_captured_when_no_trial_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where even the gated trial's estimate breaks the ceiling (the gate's per-rewrite view can
    miss what a whole graph holds), nothing is rewritten."""
    from optimus import api

    monkeypatch.setattr(api, "_trial_peak", lambda gm, config, inference: math.inf)
    torch.manual_seed(0)
    module, inputs = WideEnd(), (_x(),)
    gm = _optimize_eval(module, inputs, config=optimus.OptimusConfig(memory_ceiling=0.02))
    report: Any = gm.optimus_report
    assert report.rules_fired == {}
    assert any(n.startswith("memory_ceiling: unchanged") for n in report.notes)
    assert str(report.stop_reason) == "unchanged"
    assert_parity(module, gm, inputs)


def test_ceiling_keeps_the_whole_run_where_it_fits() -> None:
    """Must not decline: the group fits under the big matmul's peak, so the run with the ceiling
    is the run without it (same rules, same graph), and it keeps results."""
    torch.manual_seed(0)
    module, inputs = WideEnd(), (_x(),)
    free = _optimize_eval(module, inputs)
    gm = _optimize_eval(module, inputs, config=optimus.OptimusConfig(memory_ceiling=0.02))
    assert _fired(gm, "batch_linear") == 1
    assert gm.optimus_report.rules_fired == free.optimus_report.rules_fired  # type: ignore[union-attr]
    assert gm.code == free.code
    assert not any("memory_ceiling" in n for n in gm.optimus_report.notes)  # type: ignore[union-attr]
    assert_parity(module, gm, inputs)


def test_ceiling_gates_every_rewrite_when_the_whole_run_does_not_fit() -> None:
    torch.manual_seed(0)
    module, inputs = Both(), (_x(), torch.randn(G, 8 * B, N, generator=torch.Generator().manual_seed(1)))
    free = optimize_traced(module, inputs)
    assert _fired(free, "batch_linear") == 1 and _fired(free, "batch_unary") == 2  # relus, sigmoids
    static = static_bytes(fx.symbolic_trace(module))
    budget = ceiling_budget(static, free.optimus_report.live_peak_before, 0.02)
    assert free.optimus_report.live_peak_after > budget
    gm = _optimize_eval(module, inputs, config=optimus.OptimusConfig(memory_ceiling=0.02))
    report: Any = gm.optimus_report
    assert any(n.startswith("memory_ceiling: every rewrite gated") for n in report.notes)
    assert _fired(gm, "batch_linear") == 1  # under the big matmul's peak
    assert _fired(gm, "batch_unary") == 1  # the relus after it; the sigmoid towers would lift it
    sigmoids = [n for n in gm.graph.nodes if n.target is torch.sigmoid]
    assert len(sigmoids) == G  # one per tower, not one stacked
    assert report.declined_reasons.get("batch_unary: over memory_ceiling", 0) >= 1
    assert report.live_peak_after <= budget
    assert_parity(module, gm, inputs)


def test_a_declined_trial_leaves_re_laid_out_parameters_alone() -> None:
    """The trial runs with a stand-in layout: where the ceiling leaves the graph unchanged, no
    parameter was re-pointed into stacked storage and no stacked parameter was registered."""

    class TinyTowers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.ModuleList(nn.Linear(N, N) for _ in range(G))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([torch.relu(lin(x[i])).sum(0) for i, lin in enumerate(self.lin)])

    torch.manual_seed(0)
    module, inputs = TinyTowers(), (torch.randn(G, 64, N),)
    ptrs = [p.data_ptr() for p in module.parameters()]
    config = optimus.OptimusConfig(layout=RelayoutParams(), memory_ceiling=0.0)
    gm = _optimize_eval(module, inputs, config=config)
    assert any(n.startswith("memory_ceiling") for n in gm.optimus_report.notes)  # type: ignore[union-attr]
    assert [p.data_ptr() for p in module.parameters()] == ptrs
    assert not any("_optimus_stacked" in name for name, _ in gm.named_parameters())
    assert_parity(module, gm, inputs)


def test_memory_beside_the_graph_widens_the_ceiling() -> None:
    """The ceiling is a fraction of the whole program: with the bytes a dense arch runs beside
    (its embedding tables) counted, a fusion the graph alone could not afford fits."""
    inputs = (_x(),)
    alone = _optimize_eval(Towers(), inputs, config=optimus.OptimusConfig(memory_ceiling=0.02))
    assert _fired(alone, "batch_unary") == 0
    peak = alone.optimus_report.live_peak_before  # type: ignore[union-attr]
    lifted = optimize_traced(Towers(), inputs).optimus_report.live_peak_after
    outside = int((lifted - peak) / 0.02)  # 2% of it pays for the fused form
    config = optimus.OptimusConfig(memory_ceiling=0.02, memory_outside_bytes=outside)
    beside = _optimize_eval(Towers(), inputs, config=config)
    assert _fired(beside, "batch_unary") == 1
    assert not any("memory_ceiling" in n for n in beside.optimus_report.notes)  # type: ignore[union-attr]
    assert_parity(Towers(), beside, inputs)


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_config_rejects_bad_memory_outside_bytes(value: object) -> None:
    with pytest.raises(ValueError, match="memory_outside_bytes"):
        optimus.OptimusConfig(memory_outside_bytes=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, True, "0.02"])
def test_config_rejects_bad_memory_ceiling(value: object) -> None:
    with pytest.raises(ValueError, match="memory_ceiling"):
        optimus.OptimusConfig(memory_ceiling=value)  # type: ignore[arg-type]


def test_memory_ceiling_reaches_the_fingerprint() -> None:
    base = optimus.OptimusConfig()
    assert base.memory_ceiling is None
    assert base.fingerprint() != base.with_(memory_ceiling=0.02).fingerprint()
    assert base.fingerprint() != base.with_(memory_outside_bytes=1).fingerprint()


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.ModuleList(nn.Linear(N, N) for _ in range(G))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(lin(x[i])) for i, lin in enumerate(self.lin)], 1)


@pytest.mark.parametrize("keep", [True, False])
def test_relayout_keeps_gradient_buffers_only_when_asked(keep: bool) -> None:
    torch.manual_seed(0)
    module, inputs = Layers(), (_x(),)
    reference = Layers()
    reference.load_state_dict(module.state_dict())
    config = optimus.OptimusConfig(layout=RelayoutParams(keep_gradient_buffers=keep))
    gm = optimize_traced(module, inputs, config=config)
    assert _fired(gm, "batch_linear") == 1
    weights = torch.randn(B, G * N, generator=torch.Generator().manual_seed(2))
    for _ in range(2):  # a second step reuses (or not) the first one's buffer
        for m in (module, reference):
            m.zero_grad(set_to_none=True)
        out, ref = gm(*inputs), reference(*inputs)
        torch.testing.assert_close(out, ref)
        (out * weights).sum().backward()
        (ref * weights).sum().backward()
        for p, q in zip(module.parameters(), reference.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            torch.testing.assert_close(p.grad, q.grad)
    assert bool(retained_gradient_buffers(gm)) is keep


def test_relayout_rejects_a_non_bool_keep_gradient_buffers() -> None:
    with pytest.raises(ValueError, match="keep_gradient_buffers"):
        RelayoutParams(keep_gradient_buffers=1)  # type: ignore[arg-type]
