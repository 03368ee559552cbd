"""The limit of a cell (harness/measure/limit.py): the groups it finds, the programs it times, its formulas.

Known by construction: a Towers model that is nothing but one group of G independent linears
(``x.unbind(0)`` -> G x Linear(K -> N) -> tuple) has exactly one fusable group of G members of
shape [B, K] -> [B, N], and a chain of layers has none, so its ideal is the reference itself and
the headroom captured is undefined. Timing enters only through a seam (a fake timer) or as
identities between the recorded figures; no test asserts a speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import nn

from harness.measure import limit
from harness.report import markdown, paper
from models.synthetic_towers import Towers

G, B, K, N = 4, 6, 8, 5


def one_group() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Towers(G, K, N, slices="unbind", body=("linear",), join="tuple"), (torch.randn(G, B, K),)


def no_group() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(K, N), nn.ReLU(), nn.Linear(N, 3)), (torch.randn(B, K),)


def plan_of(model: nn.Module, example: tuple[torch.Tensor, ...], train: bool = False) -> limit.Plan:
    model.train(train)
    return limit.find_plan(limit.capture(model, example, train), inductor=False)


class FakeTimer:
    """Runs every step once (so the programs are exercised) and answers fixed milliseconds."""

    def __init__(self, ms: dict[str, float]) -> None:
        self.ms, self.calls = ms, 0

    def __call__(self, steps: dict[str, object]) -> dict[str, float]:
        self.calls += 1
        assert set(steps) == {"whole", "cut", "batched"}
        for s in steps.values():
            s()  # type: ignore[operator]
        return dict(self.ms)


# -- formulas -----------------------------------------------------------------------------------
def test_derive_subtracts_the_saving_of_batching() -> None:
    d = limit.derive(reference_ms=10.0, members_ms=4.0, batched_ms=1.0)
    assert d["ideal_ms"] == pytest.approx(7.0) and d["saving_ms"] == pytest.approx(3.0)
    assert d["ideal_speedup"] == pytest.approx(10.0 / 7.0) and not d["clamped"]


def test_derive_never_prices_a_group_slower_than_separate() -> None:
    d = limit.derive(reference_ms=10.0, members_ms=1.0, batched_ms=2.0)  # batching would slow it
    assert d["ideal_ms"] == 10.0 and d["saving_ms"] == 0.0 and d["ideal_speedup"] == 1.0


def test_derive_floors_at_the_batched_kernels_when_noise_overshoots() -> None:
    d = limit.derive(reference_ms=3.0, members_ms=5.0, batched_ms=1.0)  # standalone slower than the model
    assert d["ideal_ms"] == 1.0 and d["clamped"]


def test_captured_share_of_the_headroom() -> None:
    assert limit.captured(10.0, 8.0, 6.0) == pytest.approx(0.5)
    assert limit.captured(10.0, 6.0, 6.0) == pytest.approx(1.0)
    assert limit.captured(10.0, 11.0, 6.0) == pytest.approx(-0.25)  # slower than the reference
    assert limit.captured(10.0, 9.0, 10.0) is None  # no headroom: undefined, not 0 or inf


# -- the groups -----------------------------------------------------------------------------------
def test_one_group_model_is_one_linear_group_of_every_tower() -> None:
    plan = plan_of(*one_group())
    assert len(plan.groups) == 1 and plan.unpriced == {}
    (group,) = plan.groups
    assert group.kind == "linear" and len(group.members) == G
    for m in group.members:
        assert plan.tensors[m.kwargs["input"].index].shape == (B, K)
        assert plan.tensors[m.kwargs["weight"].index].shape == (N, K)
        assert plan.tensors[m.kwargs["bias"].index].shape == (N,)
    assert group.describe(plan.tensors)["input_shape"] == [B, K]


def test_chain_has_no_group() -> None:
    plan = plan_of(*no_group())
    assert plan.groups == [] and plan.tensors == []


def test_parameters_require_grad_inputs_do_not() -> None:
    plan = plan_of(*one_group(), train=True)
    (group,) = plan.groups
    m = group.members[0]
    assert plan.tensors[m.kwargs["weight"].index].grad and not plan.tensors[m.kwargs["input"].index].grad


def test_layer_norm_and_pointwise_groups_are_found() -> None:
    torch.manual_seed(0)
    model = Towers(G, K, N, slices="unbind", body=("linear", "norm", "tanh"), join="tuple")
    plan = plan_of(model, (torch.randn(G, B, K),))
    kinds = sorted(g.kind for g in plan.groups)
    assert kinds == ["layer_norm", "linear", "unary"]
    assert all(len(g.members) == G for g in plan.groups)


# -- the programs ------------------------------------------------------------------------------
def _linears(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is torch.nn.functional.linear)


def test_cut_program_is_the_graph_without_its_members() -> None:
    """Known by construction: the one-group model minus its group is the unbind alone."""
    model, example = one_group()
    plan = plan_of(model, example)
    whole, cut, cut_nodes = limit.context_programs(plan)
    assert _linears(whole) == G and _linears(cut) == 0 and len(cut_nodes) == G
    ph = [n for n in cut.graph.nodes if n.op == "placeholder"]
    assert len(ph) == 1 + G  # the input, then one per member output
    (x,) = example
    outs = whole(x)
    cut_outs = cut(x, *outs[:G])
    assert len(outs) == len(cut_outs)  # the same outputs: the model's and the members' inputs
    for a, b in zip(outs, cut_outs, strict=True):
        torch.testing.assert_close(a, b)


def test_cut_program_keeps_what_feeds_a_member_alive() -> None:
    torch.manual_seed(0)
    model = Towers(G, K, N, slices="unbind", body=("linear", "norm", "tanh"), join="tuple")
    plan = plan_of(model, (torch.randn(G, B, K),))
    _, cut, cut_nodes = limit.context_programs(plan)
    assert len(cut_nodes) == 3 * G and _linears(cut) == 0
    assert not any(n.target is torch.tanh for n in cut.graph.nodes)
    assert [n.op for n in cut.graph.nodes].count("output") == 1


def _separate(plan: limit.Plan) -> tuple[Any, list[limit.TensorSpec]]:
    """Every member of every group as its own op, standalone, on the plan's tensors: the
    members' arithmetic, which the batched kernels must reproduce."""
    from optimus.semantics.normalize import EMIT, emit_kwargs

    def resolve(v: Any, ts: Sequence[Any]) -> Any:
        if isinstance(v, limit.Slot):
            return ts[v.index]
        if isinstance(v, (list, tuple)):
            return type(v)(resolve(i, ts) for i in v)
        return v

    members = [m for g in plan.groups for m in g.members]

    def separate(*ts: Any) -> tuple[Any, ...]:
        outs = []
        for m in members:
            args, kw = emit_kwargs(m.op, {k: resolve(v, ts) for k, v in m.kwargs.items()})
            outs.append(EMIT[m.op](*args, **kw))
        return tuple(outs)

    return separate, list(plan.tensors)


def test_batched_program_computes_what_the_separate_ops_compute() -> None:
    """The ideal kernel is the same arithmetic on stacked tensors (so the right work is timed)."""
    torch.manual_seed(0)
    model = Towers(G, K, N, slices="unbind", body=("linear", "norm", "tanh"), join="tuple")
    plan = plan_of(model, (torch.randn(G, B, K),))
    sep, sep_specs = _separate(plan)
    bat, bat_specs = limit.batched_program(plan)
    ts = limit.make_tensors(sep_specs, train=False)
    outs = sep(*ts)
    stacked: list[torch.Tensor] = []
    for g in plan.groups:
        ms = g.members

        def col(name: str, ms: list[limit.Member] = ms) -> torch.Tensor:
            return torch.stack([ts[m.kwargs[name].index] for m in ms])

        if g.kind == "linear":
            stacked += [col("bias").unsqueeze(1), col("input"), col("weight").transpose(1, 2).contiguous()]
        elif g.kind == "layer_norm":
            stacked += [col("input"), col("weight").unsqueeze(1), col("bias").unsqueeze(1)]
        else:
            stacked += [col("input")]
    assert [tuple(t.shape) for t in stacked] == [s.shape for s in bat_specs]
    got = bat(*stacked)
    i = 0
    for g, out in zip(plan.groups, got, strict=True):
        expect = torch.stack(list(outs[i : i + len(g.members)]))
        i += len(g.members)
        torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("train", [False, True])
def test_measure_with_injected_timings(train: bool) -> None:
    model, example = one_group()
    plan = plan_of(model, example, train=train)
    timer = FakeTimer({"whole": 0.45, "cut": 0.05, "batched": 0.1})
    rec = limit.measure(plan, 0.5, example, train=train, compiled=False, timer=timer)
    assert timer.calls == 1
    assert rec["groups"] == 1 and rec["members"] == G and rec["kinds"] == {"linear": 1}
    assert rec["members_ms"] == pytest.approx(0.4) and rec["batched_ms"] == 0.1
    assert rec["untouched_ms"] == pytest.approx(0.1)
    assert rec["ideal_ms"] == pytest.approx(0.5 - 0.4 + 0.1)  # the untouched remainder + the kernel
    assert rec["ideal_speedup"] == pytest.approx(0.5 / 0.2)
    assert rec["method"].endswith("fwd+bwd") == train


def test_no_group_means_ideal_is_the_reference() -> None:
    plan = plan_of(*no_group())
    timer = FakeTimer({})
    rec = limit.measure(plan, 0.7, (), train=False, compiled=True, timer=timer)
    assert timer.calls == 0  # nothing to time, nothing compiled
    assert rec["ideal_ms"] == 0.7 and rec["ideal_speedup"] == 1.0 and rec["groups"] == 0
    assert limit.captured(0.7, 0.6, rec["ideal_ms"]) is None


@pytest.mark.parametrize("train", [False, True])
def test_one_group_model_measured_for_real_keeps_the_identities(train: bool) -> None:
    """Real (eager) timing, structural checks only: the figures satisfy the formula exactly."""
    model, example = one_group()
    plan = plan_of(model, example, train=train)
    rec = limit.measure(plan, 1.0, example, train=train, compiled=False)
    assert rec["whole_ms"] > 0 and rec["cut_ms"] > 0 and rec["batched_ms"] > 0
    assert rec["members_ms"] == pytest.approx(rec["whole_ms"] - rec["cut_ms"])
    expect = max(1.0 - max(0.0, rec["members_ms"] - rec["batched_ms"]), min(rec["batched_ms"], 1.0))
    assert rec["ideal_ms"] == pytest.approx(expect)
    assert rec["ideal_ms"] <= 1.0


# -- the report --------------------------------------------------------------------------------
def _cell(
    mode: str, ms: float, lim: dict[str, object] | None = None, phase: str = "infer"
) -> dict[str, object]:
    c: dict[str, object] = {
        "model": "towers", "scale": "tiny", "mode": mode, "phase": phase, "status": "ok", "error": None,
        "latency_ms": {"median": ms, "iqr": 0.0, "q1": ms, "q3": ms, "n": 3, "samples": [ms] * 3},
        "peak_mem_bytes": None, "compile_s": 1.0, "optimus_s": None, "nodes_before": None,
        "nodes_after": None, "max_abs_err": 0.0,
    }  # fmt: skip
    if lim is not None:
        c["limit"] = lim
    return c


def _doc(cells: list[dict[str, object]]) -> dict[str, object]:
    return {"schema": 1, "kind": "optimus-bench-results", "env": {}, "config": {}, "cells": cells}


def test_summary_and_tables() -> None:
    lim = {**limit.derive(10.0, 5.0, 1.0), "groups": 2, "members": 8, "method": "m", "unpriced": {}}
    doc = _doc([_cell("compile", 10.0, lim), _cell("compile+optimus", 8.0), _cell("compile+peer", 9.0)])
    (row,) = limit.rows(doc)
    assert row["ideal_ms"] == 6.0 and row["achieved"] == pytest.approx(1.25)
    assert row["captured"] == pytest.approx(0.5)
    table = limit.format_table(doc)
    assert (
        "| towers | tiny | infer | compile | 10.000 | 6.000 | 8.000 | 1.67x | 1.25x | 50% | 2 (8) | - |"
        in table
    )
    ptable = paper.format_paper_table(paper.paper_rows(doc))
    assert "ideal speedup vs compile | headroom captured |" in ptable and "| 1.67x | 50% |" in ptable
    md = markdown.render(doc, "t", [])
    assert "## The limit" in md


def test_no_limit_no_columns_and_no_headroom_text() -> None:
    doc = _doc([_cell("compile", 10.0), _cell("compile+optimus", 8.0)])
    assert limit.format_table(doc) == ""
    assert "ideal speedup" not in paper.format_paper_table(paper.paper_rows(doc))
    lim = {**limit.derive(10.0, 0.0, 0.0), "groups": 0, "members": 0, "method": "m", "unpriced": {}}
    doc = _doc([_cell("compile", 10.0, lim), _cell("compile+optimus", 8.0)])
    (row,) = limit.rows(doc)
    assert row["captured"] is None and "no headroom" in limit.format_table(doc)


def test_failed_limit_is_not_shown() -> None:
    doc = _doc(
        [
            _cell("compile", 10.0, {"error": "RuntimeError: x", "ideal_ms": None}),
            _cell("compile+optimus", 8.0),
        ]
    )
    assert limit.rows(doc) == []


# -- in a cell ---------------------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["infer", "train"])
def test_measure_cell_on_the_towers_family(phase: str) -> None:
    """The harness's own towers model at tiny, eager programs (no compile): groups of every kind."""
    import models
    from harness.run.cell import input_requires_grad

    train = phase == "train"
    b = models.build("towers", scale="tiny", device="cpu", seed=0)
    b.module.train(train)
    batches = list(b.batches)
    example = tuple(t.detach() for t in b.dense_inputs(batches[0]))
    grads = input_requires_grad(b.module, batches[0]) if train else None
    assert grads is None or grads == [False, True]  # (dense features, pooled embeddings)
    lim = limit.measure_cell(b.module.dense, example, 1.0, train=train, compiled=False, device="cpu",
                             input_grads=grads)  # fmt: skip
    assert lim["groups"] > 0 and lim["members"] >= 2 * lim["groups"]
    assert set(lim["kinds"]) >= {"linear", "layer_norm", "unary"}
    assert lim["members_ms"] == pytest.approx(lim["whole_ms"] - lim["cut_ms"])
    assert lim["method"].startswith("members in context") and lim["method"].endswith("fwd+bwd") == train


def test_limit_must_be_a_bool() -> None:
    from harness.spec import RunConfig

    with pytest.raises(ValueError, match="limit"):
        RunConfig(["towers"], limit="yes").validate(check_models=False)  # type: ignore[arg-type]


@pytest.mark.compile
@pytest.mark.slow
def test_compile_cell_records_its_limit() -> None:
    """One compile cell at tiny with --limit, in its own process: the two standalone programs are
    compiled by Inductor (tens of seconds on a 2-core CPU)."""
    from harness.run.runner import run_one
    from harness.spec import CellKey, RunConfig

    cfg = RunConfig(["towers"], "tiny", ["compile"], ["infer"], warmup=1, min_iters=2, max_iters=3,
                    budget_s=0.05, limit=True).validate()  # fmt: skip
    cell = run_one(CellKey("towers", "tiny", "compile", "infer"), cfg.as_dict(), cfg.timeout_s)
    assert cell["status"] == "ok", cell.get("error")
    lim = cell["limit"]
    assert "error" not in lim, lim.get("error")
    assert lim["method"] == "members in context (whole - cut graph), Inductor" and lim["groups"] > 0
    assert lim["reference_ms"] == cell["latency_ms"]["median"]
    assert cell["recompiles"] == 0  # the limit's compiles come after the cell's own counts
