"""Vertical chains (optimus/engine/vertical.py): with the memory gate on, a fused group
and the per-member chain after it are applied together and judged as one rewrite. Cases: a chain
that fits under the peak although its links alone look peak-raising (taken whole, no seams), a
chain that lifts the peak (taken above the margin, refused under it, refused over a budget), a
cost decline, and the chains that must not form (a branch, an external reader in the middle, a
mutated value, a grad-mode boundary); forward and backward parity, layout and aliasing each
time."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND, assert_parity, count_calls, optimize_traced
from torch import fx, nn

import optimus
import optimus.engine.driver
from models.synthetic_towers import Towers
from optimus.cost.analytic import AnalyticCostModel, DeviceConstants

CHAIN = "vertical chain (batch_linear > batch_layer_norm > batch_unary)"


def _fits() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """32 towers Linear(4, 4) -> LayerNorm -> tanh over [64, 128], then a head of width 256: the
    graph's estimated peak is at the head, and the fused chain fits under it."""
    torch.manual_seed(0)
    return Towers(32, 4, 4, slices="narrow", head=256), (torch.randn(64, 128),)


def _check(module: nn.Module, gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> None:
    """Values, dtypes, strides, contiguity and aliasing of the outputs; gradients."""
    sources = [*inputs, *module.parameters()]
    assert_same_results(module(*inputs), gm(*inputs), sources)
    assert_parity(module, gm, inputs)


def _margin(margin: float, **more: object) -> optimus.OptimusConfig:
    return optimus.OptimusConfig(memory_margin=margin, **more)  # type: ignore[arg-type]


def test_chain_that_fits_is_taken_whole_without_seams() -> None:
    module, inputs = _fits()
    gm = optimize_traced(module, inputs, config=_margin(1.0))
    rep = gm.optimus_report
    assert rep.chains == {CHAIN: 1}
    for rule in ("batch_linear", "batch_layer_norm", "batch_unary"):
        assert rep.rules_fired[rule] == 1
    assert "stack_unbind" not in rep.rules_fired  # no seam was made, so none had to be removed
    assert count_calls(gm, torch.stack) == 4  # weights, biases, norm weights, norm biases: no seam
    assert count_calls(gm, F.linear) == 1  # only the head
    (norm,) = [n for n in gm.graph.nodes if n.target is F.layer_norm]
    assert norm.args[0].target is torch.baddbmm  # reads the stacked linear output directly
    assert rep.live_peak_after <= rep.live_peak_before
    _check(module, gm, inputs)


def test_the_same_links_judged_one_by_one_stay_unfused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without chains (the gate that judges links one by one) the linear and the norm are declined."""
    monkeypatch.setattr(optimus.engine.driver, "chains", lambda *a: {})
    module, inputs = _fits()
    gm = optimize_traced(module, inputs, config=_margin(1.0))
    rep = gm.optimus_report
    assert "batch_linear" not in rep.rules_fired and "batch_layer_norm" not in rep.rules_fired
    assert rep.declined_reasons["batch_linear: raises peak memory, gain within memory_margin"] >= 1
    _check(module, gm, inputs)


def _lifts() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The README's towers (32 x Linear(16, 16) -> LayerNorm -> tanh, batch 64, joined by a cat),
    over the pieces of one unbind (stacked for free, as the README's split): fused whole, the
    chain's peak is the cat's plus the norms' affine parameters stacked per call, alive while the
    affine step writes its output (2 x 32 x 16 float32 = 4,096 bytes)."""
    torch.manual_seed(0)
    return Towers(32, 16, 16, slices="unbind"), (torch.randn(32, 64, 16),)


ANALYTIC = AnalyticCostModel()


def test_chain_that_lifts_the_peak_is_taken_above_the_margin_only() -> None:
    module, inputs = _lifts()
    strict = optimize_traced(module, inputs, cost_model=ANALYTIC, config=_margin(1.0))
    rep = strict.optimus_report
    assert rep.chains == {}
    assert rep.declined_reasons[f"{CHAIN}: raises peak memory, gain within memory_margin"] >= 1
    assert rep.live_peak_after == rep.live_peak_before
    _check(module, strict, inputs)
    loose = optimize_traced(module, inputs, cost_model=ANALYTIC, config=_margin(0.5))
    rep = loose.optimus_report
    assert rep.chains == {CHAIN: 1}  # the chain saves more than half of its time
    assert rep.live_peak_after - rep.live_peak_before == 2 * 32 * 16 * 4
    _check(module, loose, inputs)


def test_budget_declines_the_whole_chain() -> None:
    module, inputs = _lifts()
    peak = optimize_traced(module, inputs, cost_model=ANALYTIC).optimus_report.live_peak_before
    tight = optimize_traced(
        module, inputs, cost_model=ANALYTIC, config=_margin(0.0, memory_budget_bytes=int(peak))
    )
    rep = tight.optimus_report
    assert rep.chains == {} and "batch_linear" not in rep.rules_fired
    assert rep.declined_reasons[f"{CHAIN}: over memory_budget_bytes"] >= 1
    assert rep.live_peak_after <= peak
    _check(module, tight, inputs)
    room = optimize_traced(
        module,
        inputs,
        cost_model=ANALYTIC,
        config=_margin(0.0, memory_budget_bytes=int(peak) + 2 * 32 * 16 * 4),
    )
    assert room.optimus_report.chains == {CHAIN: 1}
    _check(module, room, inputs)


def test_links_the_cost_model_declines_form_no_chain() -> None:
    """Copies cost everything and launches nothing: no link is faster, so no chain is judged."""
    module, inputs = _fits()
    copy_bound = AnalyticCostModel(cpu=DeviceConstants(launch_s=0.0, bytes_per_s=1e6, flops_per_s=1e14))
    gm = optimize_traced(module, inputs, cost_model=copy_bound, config=_margin(1.0))
    rep = gm.optimus_report
    assert rep.chains == {}
    assert not any(r.startswith("batch_") for r in rep.rules_fired)
    assert rep.declined.get("batch_linear", 0) >= 1
    assert not any("vertical chain" in r for r in rep.declined_reasons)
    _check(module, gm, inputs)


class _Cut(nn.Module):
    """The towers of ``_fits`` with one construct at the linear's output that must end the chain
    there: ``"branch"`` (a second per-member reader), ``"reader"`` (the linear outputs also meet in
    a sum outside the chain), ``"mutated"`` (written in place through a view before the norm
    reads it), ``"no_grad"`` (the linears under ``torch.no_grad()``, traced with Dynamo)."""

    def __init__(self, cut: str, n: int = 32, w: int = 4, head: int = 256) -> None:
        super().__init__()
        self.cut, self.n, self.w = cut, n, w
        self.lin = nn.ModuleList(nn.Linear(w, w) for _ in range(n))
        self.norm = nn.ModuleList(nn.LayerNorm(w) for _ in range(n))
        self.head = nn.Linear(n * w, head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x[:, i * self.w : (i + 1) * self.w] for i in range(self.n)]
        if self.cut == "no_grad":
            with torch.no_grad():
                hs = [lin(p) for lin, p in zip(self.lin, parts, strict=True)]
        else:
            hs = [lin(p) for lin, p in zip(self.lin, parts, strict=True)]
        outs = []
        for h, norm in zip(hs, self.norm, strict=True):
            if self.cut == "mutated":
                h.narrow(1, 0, 1).mul_(2)
            y = torch.tanh(norm(h))
            if self.cut == "branch":
                y = y + torch.sigmoid(h)
            outs.append(y)
        out = self.head(torch.cat(outs, 1))
        if self.cut == "reader":
            out = out + torch.stack(hs).sum()
        return out


@pytest.mark.parametrize("cut", ["branch", "reader", "mutated", "no_grad"])
def test_chain_ends_where_the_linear_output_is_read_elsewhere(cut: str) -> None:
    torch.manual_seed(0)
    module, inputs = _Cut(cut), (torch.randn(64, 128),)
    if cut == "no_grad":  # Dynamo records the grad-mode switch (symbolic_trace does not)
        gm = optimus.optimize(module, inputs, cost_model=LAUNCH_BOUND, config=_margin(1.0))
    else:
        gm = optimize_traced(module, inputs, config=_margin(1.0))
    rep = gm.optimus_report
    assert not any("batch_linear" in name for name in rep.chains), rep.chains
    _check(module, gm, inputs)


def test_control_without_a_cut_chains_the_linear() -> None:
    """The model of the cut cases without its cut: the chain from the linear is taken, so the
    cases above test the cut, not a model where no chain could form."""
    torch.manual_seed(0)
    module, inputs = _Cut("none"), (torch.randn(64, 128),)
    gm = optimize_traced(module, inputs, config=_margin(1.0))
    assert gm.optimus_report.chains == {CHAIN: 1}
    _check(module, gm, inputs)
    dynamo = optimus.optimize(module, inputs, cost_model=LAUNCH_BOUND, config=_margin(1.0))
    assert dynamo.optimus_report.chains == {CHAIN: 1}


def test_default_settings_judge_no_chain() -> None:
    """At the default margin (0.0, no budget) the gate is inert and chains are never formed: the
    graph is what the per-link driver makes."""
    module, inputs = _fits()
    gm = optimize_traced(module, inputs)
    assert gm.optimus_report.chains == {}
    assert gm.optimus_report.rules_fired["batch_linear"] == 1
    _check(module, gm, inputs)


class _Gated(nn.Module):
    """Towers gated per member: ``tanh(tower_i(x_i)) * sigmoid(gate_i(x_i))``, then a wide head:
    two links (the activations) feed one (the gating multiply)."""

    def __init__(self, n: int = 32, w: int = 4, head: int = 512) -> None:
        super().__init__()
        self.n, self.w = n, w
        self.tower = nn.ModuleList(nn.Linear(w, w) for _ in range(n))
        self.gate = nn.ModuleList(nn.Linear(w, w) for _ in range(n))
        self.head = nn.Linear(n * w, head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for i in range(self.n):
            p = x[i]
            outs.append(torch.tanh(self.tower[i](p)) * torch.sigmoid(self.gate[i](p)))
        return self.head(torch.cat(outs, 1))


def test_gating_multiply_joins_the_chain() -> None:
    torch.manual_seed(0)
    module, inputs = _Gated(), (torch.randn(32, 64, 4),)
    gm = optimize_traced(module, inputs, config=_margin(1.0))
    rep = gm.optimus_report
    (name,) = rep.chains
    assert "batch_binary" in name and "batch_unary" in name, name
    assert rep.live_peak_after <= rep.live_peak_before
    _check(module, gm, inputs)


def test_verify_keeps_a_chain_that_keeps_results() -> None:
    module, inputs = _fits()
    gm = optimize_traced(module, inputs, config=_margin(1.0, verify=True))
    rep = gm.optimus_report
    assert rep.chains == {CHAIN: 1} and not rep.rolled_back
    _check(module, gm, inputs)


class _Reduced(nn.Module):
    """Towers Linear -> LayerNorm -> tanh, each summed over the batch as soon as it is made: one
    member's activations alive at a time, so the fused chain (G at once) lifts the peak."""

    def __init__(self, n: int = 8, w: int = 16) -> None:
        super().__init__()
        self.n, self.w = n, w
        self.lin = nn.ModuleList(nn.Linear(w, w) for _ in range(n))
        self.norm = nn.ModuleList(nn.LayerNorm(w) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.tanh(self.norm[i](self.lin[i](x[i]))).sum(0) for i in range(self.n)])


def _assert_same_grads(want: list[torch.Tensor | None], got: list[torch.Tensor | None], **tol: float) -> None:
    """Each parameter's gradient: None where eager's is None, else close to eager's."""
    for a, b in zip(want, got, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, **tol)  # type: ignore[arg-type]


def _backward_grads(module: nn.Module, fn: object, x: torch.Tensor) -> list[torch.Tensor | None]:
    """Gradients by ``.backward()`` (the re-laid-out layout's contract: autograd.grad w.r.t. the
    original parameters is not supported there, see optimus/params/relayout.py)."""
    module.zero_grad(set_to_none=True)
    out = fn(x)  # type: ignore[operator]
    (out * torch.arange(out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def test_a_refused_chain_leaves_re_laid_out_parameters_alone() -> None:
    """With ``RelayoutParams`` the trial of a chain must not re-lay the parameters out (that is a
    change to the module, which undoing the graph edit would not revert): a refused chain leaves
    every parameter as it was, and no stacked storage in the result that its graph does not read."""
    from optimus.params.group import GROUP_ATTR
    from optimus.params.relayout import PREFIX, RelayoutParams

    torch.manual_seed(0)
    module, x = _Reduced(), torch.randn(8, 64, 16)
    want_out = module(x).detach()
    want = _backward_grads(module, module, x)
    config = _margin(1.0, layout=RelayoutParams())
    gm = optimize_traced(module, (x,), config=config)
    rep = gm.optimus_report
    assert rep.declined_reasons[f"{CHAIN}: raises peak memory, gain within memory_margin"] >= 1
    assert rep.chains == {}
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    stacked = [name for name, _ in gm.named_parameters() if name.startswith(PREFIX)]
    assert all(name in read for name in stacked), (stacked, sorted(t for t in read if PREFIX in t))
    grouped = [name for name, p in module.named_parameters() if getattr(p, GROUP_ATTR, None) is not None]
    assert grouped == [] or stacked, grouped  # a parameter grouped only by a refused trial
    torch.testing.assert_close(gm(x), want_out)
    got = _backward_grads(module, gm, x)
    _assert_same_grads(want, got)


def test_a_chain_taken_with_re_laid_out_parameters_reads_them_free() -> None:
    """A chain that fits is applied again with the real layout: its weights are get_attr reads of
    the re-laid-out storage, not stacks per call (the trial's stand-ins are gone)."""
    from optimus.params.relayout import RelayoutParams

    module, inputs = _fits()
    want_out = module(*inputs).detach()
    want = _backward_grads(module, module, inputs[0])
    gm = optimize_traced(module, inputs, config=_margin(1.0, layout=RelayoutParams()))
    assert gm.optimus_report.chains == {CHAIN: 1}
    assert count_calls(gm, torch.stack) == 0 and count_calls(gm, torch.as_strided) == 0
    torch.testing.assert_close(gm(*inputs), want_out)
    got = _backward_grads(module, gm, inputs[0])
    _assert_same_grads(want, got, rtol=1e-3, atol=1e-4)  # sums over a batch of 64, reordered


def test_readme_towers_with_re_laid_out_parameters_fuse_whole_at_margin_one() -> None:
    """The README's towers at the strictest margin: with the weights stacked per call the chain
    lifts the estimated peak and is declined (above); re-laid out once (as the harness prepares
    its Optimus modes) nothing is stacked per call, the whole chain lifts nothing, and it is
    taken whole."""
    from optimus.params.relayout import RelayoutParams

    module, inputs = _lifts()
    want_out = module(*inputs).detach()
    want = _backward_grads(module, module, inputs[0])
    gm = optimize_traced(module, inputs, cost_model=ANALYTIC, config=_margin(1.0, layout=RelayoutParams()))
    rep = gm.optimus_report
    assert rep.chains == {CHAIN: 1}
    assert rep.live_peak_after <= rep.live_peak_before
    assert count_calls(gm, F.linear) == 0 and count_calls(gm, F.layer_norm) == 1
    torch.testing.assert_close(gm(*inputs), want_out)
    got = _backward_grads(module, gm, inputs[0])
    _assert_same_grads(want, got, rtol=1e-3, atol=1e-4)
