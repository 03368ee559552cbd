"""group_linear: declines on CPU with the default cost model; fires where a cost model rates the
grouped form faster (the Triton form, run here by Triton's interpreter, and the padded form),
with forward+backward parity, gradients on the original parameters and an unchanged state_dict;
works under the parameter re-layout; must-not-fire cases."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import LAUNCH_BOUND, Fn, assert_parity, count_calls, optimize_traced, rule_keys
from torch import fx, nn

import optimus
from optimus.cost.analytic import CUDA, AnalyticCostModel
from optimus.kernels.grouped_linear import triton_installed
from optimus.params.relayout import RelayoutParams

RULES = ["group_linear"]
WIDTHS = [(8, 16), (32, 4), (16, 64), (4, 8), (64, 32), (8, 8)]  # (K, N) of each projection
GROUPED = torch.ops.optimus.grouped_linear.default


class TritonLikeCUDA(AnalyticCostModel):
    """Prices the CPU like a CUDA device and offers the Triton form there: what the rule decides
    on a GPU, run on CPU through Triton's interpreter. It prices the kernel alone (no host time
    per call), so these tests see the form fire at G = 6."""

    grouped_kernel_host_launches = 0.0

    def grouped_linear_backends(self, device: torch.device) -> tuple[str, ...]:
        return ("triton",)


TRITON_AS_GPU = TritonLikeCUDA(cpu=CUDA)


@pytest.fixture
def interpret() -> Iterator[None]:
    if not triton_installed():
        pytest.skip("triton is not installed")
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if old is None:
        os.environ.pop("TRITON_INTERPRET")
    else:
        os.environ["TRITON_INTERPRET"] = old


class Projections(nn.Module):
    """Per-feature projections of different widths (a ranking model's dense arch in small)."""

    def __init__(self, widths: list[tuple[int, int]] = WIDTHS, bias: bool = True) -> None:
        super().__init__()
        self.widths = widths
        self.proj = nn.ModuleList([nn.Linear(k, n, bias=bias) for k, n in widths])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = torch.split(x, [k for k, _ in self.widths], dim=1)
        return torch.cat([p(feats[i] * 1.0) for i, p in enumerate(self.proj)], dim=1)


def _x(batch: int = 5) -> torch.Tensor:
    return torch.randn(batch, sum(k for k, _ in WIDTHS))


def test_declines_on_cpu_with_the_default_cost_model() -> None:
    torch.manual_seed(0)
    mod, xs = Projections(), [_x()]
    gm = optimus.optimize(fx.symbolic_trace(mod), tuple(xs), rules=RULES)
    assert gm.optimus_report.rules_fired == {}
    assert gm.optimus_report.declined == {"group_linear": 1}
    assert count_calls(gm, F.linear) == len(WIDTHS)


def test_eager_padded_form_never_pays_even_when_launches_dominate() -> None:
    """In eager the padded form is ~4G launches (pad, stack, copy back): never below G."""
    mod, xs = Projections(), [_x()]
    gm = optimize_traced(mod, xs, rules=RULES)  # LAUNCH_BOUND
    assert gm.optimus_report.rules_fired == {}
    assert gm.optimus_report.declined == {"group_linear": 1}


def test_padded_form_fires_when_inductor_fuses_the_pads() -> None:
    torch.manual_seed(0)
    mod, xs = Projections(), [_x()]
    model = AnalyticCostModel(cpu=LAUNCH_BOUND.cpu, inductor=True)
    gm = optimize_traced(mod, xs, rules=RULES, cost_model=model)
    assert gm.optimus_report.rules_fired == {"group_linear": 1}
    assert count_calls(gm, F.linear) == 0
    assert count_calls(gm, torch.baddbmm) == 1
    assert_parity(mod, gm, xs)


@pytest.mark.parametrize("bias", [True, False])
def test_triton_form_fires_with_parity_grads_on_params_and_same_state_dict(
    interpret: None, bias: bool
) -> None:
    torch.manual_seed(0)
    mod, xs = Projections(bias=bias), [_x()]
    before = {k: v.clone() for k, v in mod.state_dict().items()}
    gm = optimize_traced(mod, xs, rules=RULES, cost_model=TRITON_AS_GPU)
    assert gm.optimus_report.rules_fired == {"group_linear": 1}
    assert count_calls(gm, F.linear) == 0
    assert count_calls(gm, GROUPED) == 1
    assert_parity(mod, gm, xs)  # outputs, and gradients on mod's own parameters
    assert gm.state_dict().keys() == before.keys()
    for k, v in mod.state_dict().items():
        assert torch.equal(v, before[k])
    # the graph's parameters are the module's: a backward through gm fills mod's .grad
    mod.zero_grad()
    gm(*xs).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mod.parameters())


def test_triton_form_under_the_parameter_relayout(interpret: None) -> None:
    """The rule takes the parameters as they are (no stacking), so the re-layout has nothing to do
    for it: it fires, results and gradients match, the state_dict keeps its keys."""
    torch.manual_seed(0)
    mod, xs = Projections(), [_x()]
    ref = copy.deepcopy(mod)
    config = optimus.OptimusConfig(rules=tuple(RULES), cost_model=TRITON_AS_GPU, layout=RelayoutParams())
    gm = optimus.optimize(fx.symbolic_trace(mod), tuple(xs), config=config)
    assert gm.optimus_report.rules_fired == {"group_linear": 1}
    assert gm.state_dict().keys() == ref.state_dict().keys()
    assert_parity(mod, gm, xs)  # gradients land on mod's own parameters
    for k, v in ref.state_dict().items():
        assert torch.equal(mod.state_dict()[k], v) and torch.equal(gm.state_dict()[k], v)


def test_same_shapes_are_left_to_batch_linear() -> None:
    mod, xs = Projections([(8, 8)] * 4), [torch.randn(3, 32)]
    model = AnalyticCostModel(cpu=LAUNCH_BOUND.cpu, inductor=True)
    gm = optimize_traced(mod, xs, rules=RULES, cost_model=model)
    assert gm.optimus_report.rules_fired == {}
    assert gm.optimus_report.declined == {}


def test_dependent_linears_do_not_group() -> None:
    torch.manual_seed(0)

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(4, 12)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.b(self.a(x)))

    mod, xs = Chain(), [torch.randn(3, 8)]
    model = AnalyticCostModel(cpu=LAUNCH_BOUND.cpu, inductor=True)
    gm = optimize_traced(mod, xs, rules=RULES, cost_model=model)
    assert gm.optimus_report.rules_fired == {}


def test_different_dtypes_get_different_keys() -> None:
    def f(m, x):  # type: ignore[no-untyped-def]
        return F.linear(x, m.w1), F.linear(x.double(), m.w2.double())

    mod = Fn(f, w1=torch.randn(4, 8), w2=torch.randn(6, 8))
    keys = rule_keys(mod, [torch.randn(3, 8)], "group_linear")
    assert len(keys) == 2 and keys[0] != keys[1]


MUTATION_WIDTHS = [(8, 4), (4, 16), (2, 3), (6, 5)]


def _sliced(m: nn.Module, x: torch.Tensor, mutate: bool) -> list[torch.Tensor]:
    starts = [0, 8, 12, 14]
    ys = [
        x[:, s : s + k] * float(i + 1)
        for i, (s, (k, _)) in enumerate(zip(starts, MUTATION_WIDTHS, strict=True))
    ]
    outs = [F.linear(y, getattr(m, f"w{i}")) for i, y in enumerate(ys)]
    if mutate:
        for y in ys:
            y.add_(1.0)  # every input is written after the linear read it
    return outs


@pytest.mark.parametrize("mutate", [False, True])
def test_inputs_mutated_later_block_it(interpret: None, mutate: bool) -> None:
    params = {f"w{i}": torch.randn(n, k) for i, (k, n) in enumerate(MUTATION_WIDTHS)}
    mod, xs = Fn(lambda m, x: _sliced(m, x, mutate), **params), [torch.randn(3, 20)]
    gm = optimize_traced(mod, xs, rules=RULES, cost_model=TRITON_AS_GPU)
    # without the writes it groups: the block is the mutation's doing
    assert gm.optimus_report.rules_fired == ({} if mutate else {"group_linear": 1})


def _grad_mode_graph(switch: bool) -> fx.GraphModule:
    """Six linears of different shapes; with ``switch`` the last three run under no_grad."""
    root = nn.Module()
    g = fx.Graph()
    x = g.placeholder("x")
    outs = []
    for i in range(6):
        setattr(root, f"w{i}", nn.Parameter(torch.randn(i + 2, 8)))
        if switch and i == 3:
            g.call_function(torch._C._set_grad_enabled, (False,))
        outs.append(g.call_function(F.linear, (x, g.get_attr(f"w{i}"))))
    if switch:
        g.call_function(torch._C._set_grad_enabled, (True,))
    g.output(tuple(outs))
    return fx.GraphModule(root, g)


@pytest.mark.parametrize("switch", [False, True])
def test_linears_under_different_grad_modes_do_not_group(interpret: None, switch: bool) -> None:
    gm = _grad_mode_graph(switch)
    xs = (torch.randn(2, 8),)
    out = optimus.optimize(gm, xs, rules=RULES, cost_model=TRITON_AS_GPU)
    # one group of six, or one group per grad mode (three each): never one mixing the modes
    assert out.optimus_report.rules_fired == {"group_linear": 2 if switch else 1}
    sizes = sorted(len(n.args[0]) for n in out.graph.nodes if n.target is GROUPED)
    assert sizes == ([3, 3] if switch else [6])
    got = out(*xs)
    assert [t.requires_grad for t in got] == [True] * 3 + [not switch] * 3


def test_no_triton_form_for_a_dtype_the_kernel_lacks() -> None:
    """float64: the kernel has no fp64 dot, so with only the Triton form offered nothing fires."""
    mod, xs = Projections().double(), [_x().double()]
    gm = optimize_traced(mod, xs, rules=RULES, cost_model=TRITON_AS_GPU)
    assert gm.optimus_report.rules_fired == {}
    assert count_calls(gm, F.linear) == len(WIDTHS)


@pytest.mark.compile
def test_inductor_places_the_grouped_op(interpret: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile with the optimus backend: the rule fires in the pre-Inductor graph, Inductor
    keeps the op (one extern call: the Triton kernel, interpreted here), results and gradients
    match and land on the module's parameters."""
    from optimus.kernels import grouped_linear_triton

    calls: list[int] = []
    forward = grouped_linear_triton.linear_forward
    monkeypatch.setattr(grouped_linear_triton, "linear_forward", lambda *a: calls.append(1) or forward(*a))
    torch.manual_seed(0)
    mod, x = Projections(), _x()
    compiled = torch.compile(mod, backend=optimus.backend(optimus.OptimusConfig(cost_model=TRITON_AS_GPU)))
    out = compiled(x)
    assert calls == [1]
    torch.testing.assert_close(out, mod(x))
    out.sum().backward()
    assert all(p.grad is not None for p in mod.parameters())


def test_gpu_pricing_keeps_small_groups_apart_for_the_kernels_host_time(interpret: None) -> None:
    """Priced with the Triton form's measured host time per call (group_linear
    TRITON_HOST_LAUNCHES), three different-width linears on a CUDA-priced device stay separate:
    on the H200 that group made a compiled dlrm step slower. Priced without it they group."""

    class WithHostTime(AnalyticCostModel):
        def grouped_linear_backends(self, device: torch.device) -> tuple[str, ...]:
            return ("triton",)

    torch.manual_seed(0)
    widths = WIDTHS[:3]
    mod, xs = Projections(widths), [torch.randn(5, sum(k for k, _ in widths))]
    gm = optimus.optimize(fx.symbolic_trace(mod), tuple(xs), rules=RULES, cost_model=WithHostTime(cpu=CUDA))
    assert gm.optimus_report.rules_fired == {}
    assert gm.optimus_report.declined == {"group_linear": 1}
    assert count_calls(gm, F.linear) == 3
    gm = optimus.optimize(fx.symbolic_trace(mod), tuple(xs), rules=RULES, cost_model=TritonLikeCUDA(cpu=CUDA))
    assert gm.optimus_report.rules_fired == {"group_linear": 1}
    assert_parity(mod, gm, xs)
