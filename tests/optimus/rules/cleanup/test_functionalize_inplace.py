"""functionalize_inplace: an in-place write on a fresh, unseen value becomes the out-of-place op,
which unpins the linears before it; and every case where the write is observable stays.

Each firing case checks forward values, layouts, aliasing and gradients against eager, and that a
batching rule now fires on what the write used to pin. Each must-not-fire case checks that the
in-place node is still in the graph and that results (or eager's error) are unchanged.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND, Fn, assert_parity
from torch import fx, nn

import optimus
from optimus.config import OptimusConfig
from optimus.cost.analytic import AnalyticCostModel, DeviceConstants
from optimus.params.relayout import RelayoutParams

N = 6


def optimize_dynamo(module: nn.Module, inputs: list[torch.Tensor], **kw: object) -> fx.GraphModule:
    """optimize() through Dynamo: symbolic_trace turns ``out += y`` into ``out = out + y``, so
    only a Dynamo graph has the in-place nodes user code writes."""
    kw.setdefault("cost_model", LAUNCH_BOUND)
    return optimus.optimize(module, tuple(inputs), **kw)  # type: ignore[arg-type]


def _in_place_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    from optimus.semantics.normalize import canonicalize

    modules = dict(gm.named_modules())
    return [n for n in gm.graph.nodes if (c := canonicalize(n, modules)) is not None and c.inplace]


def _weights(n: int = N, d: int = 8) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    for i in range(n):
        out[f"w{i}"] = torch.randn(d, d) * 0.3
        out[f"b{i}"] = torch.randn(d) * 0.1
    return out


def _towers_relu_method(self, x):  # type: ignore[no-untyped-def]
    outs = []
    for i in range(N):
        y = F.linear(x, getattr(self, f"w{i}"), getattr(self, f"b{i}"))
        y.relu_()  # the statement form: later readers read ``y`` itself
        outs.append(y)
    return torch.cat(outs, 1)


def _towers_relu_inplace_kw(self, x):  # type: ignore[no-untyped-def]
    outs = [
        F.relu(F.linear(x, getattr(self, f"w{i}"), getattr(self, f"b{i}")), inplace=True) for i in range(N)
    ]
    return torch.cat(outs, 1)


def _accumulate(self, x):  # type: ignore[no-untyped-def]
    out = x.new_zeros(x.shape[0], 8)
    for i in range(N):
        out += F.linear(x[:, i * 8 : (i + 1) * 8], getattr(self, f"w{i}"), getattr(self, f"b{i}"))
    return out


@pytest.mark.parametrize(
    ("fn", "width", "unpinned"),
    [
        (_towers_relu_method, 8, "merge_shared_linear"),
        (_towers_relu_inplace_kw, 8, "merge_shared_linear"),
        (_accumulate, 8 * N, "batch_linear"),
    ],
    ids=["relu_-statement", "relu-inplace-kw", "new_zeros-iadd"],
)
def test_fresh_writes_become_out_of_place_and_unpin_the_linears(fn, width, unpinned) -> None:  # type: ignore[no-untyped-def]
    mod = Fn(fn, **_weights())
    xs = [torch.randn(4, width)]
    gm = optimize_dynamo(mod, xs)
    fired = gm.optimus_report.rules_fired
    assert fired.get("functionalize_inplace") == N
    assert fired.get(unpinned, 0) >= 1, fired
    assert _in_place_nodes(gm) == []
    assert_parity(mod, gm, xs)
    x = xs[0].clone()
    assert_same_results(mod(x), gm(x), sources=[x, *mod.parameters()])


def test_without_the_rule_the_write_pins_the_linears() -> None:
    """The baseline the rule changes: same graph, rule left out, nothing is batched."""
    mod = Fn(_towers_relu_method, **_weights())
    xs = [torch.randn(4, 8)]
    rules = [r for r in optimus.RULES if r != "functionalize_inplace"]
    gm = optimize_dynamo(mod, xs, rules=rules)
    assert "merge_shared_linear" not in gm.optimus_report.rules_fired
    assert len(_in_place_nodes(gm)) == N


class _Experts(nn.Module):
    """A model-zoo MMoE expert block: Linear -> BatchNorm1d -> ReLU(inplace=True) -> Dropout."""

    def __init__(self, bn: bool) -> None:
        super().__init__()

        def block() -> nn.Sequential:
            norm = [nn.BatchNorm1d(16)] if bn else []
            return nn.Sequential(nn.Linear(8, 16), *norm, nn.ReLU(inplace=True), nn.Dropout(0.2))

        self.experts = nn.ModuleList([block() for _ in range(N)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([e(x) for e in self.experts], 1)


@pytest.mark.parametrize("bn", [False, True], ids=["linear-relu_", "linear-bn-relu_"])
@pytest.mark.parametrize("relayout", [False, True], ids=["default", "relayout"])
def test_zoo_expert_blocks_through_dynamo_train_mode(bn: bool, relayout: bool) -> None:
    torch.manual_seed(0)
    model = _Experts(bn).train()
    ref = copy.deepcopy(model)
    x = torch.randn(8, 8)
    config = OptimusConfig(layout=RelayoutParams()) if relayout else OptimusConfig()
    gm = optimus.optimize(model, (x,), config=config)
    assert gm.optimus_report.rules_fired.get("functionalize_inplace") == N
    assert gm.optimus_report.rules_fired.get("merge_shared_linear", 0) >= 1
    torch.manual_seed(3)
    want = ref(x)
    torch.manual_seed(3)
    got = gm(x)  # dropout draws the same stream: the RNG order is kept
    assert_same_results(want, got, sources=[x])
    want.square().sum().backward()
    got.square().sum().backward()
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    for (name, b), c in zip(ref.named_buffers(), model.buffers(), strict=True):
        torch.testing.assert_close(c, b, msg=name)  # BN running stats and num_batches_tracked


# --- must not fire -----------------------------------------------------------------------------


def _read_before_write(self, x):  # type: ignore[no-untyped-def]
    y = F.linear(x, self.w0, self.b0)
    v = y[0]  # a view taken before the write sees it
    y.relu_()
    return v, y


def _writes_input(self, x):  # type: ignore[no-untyped-def]
    x.relu_()
    return F.linear(x, self.w0, self.b0)


def _writes_a_view(self, x):  # type: ignore[no-untyped-def]
    y = F.linear(x, self.w0, self.b0)
    z = y.view(-1)
    z.relu_()  # writes y through a view: z is not fresh
    return y


def _promotes(self, x):  # type: ignore[no-untyped-def]
    y = F.linear(x, self.w0, self.b0)
    y += x.double()  # in place keeps float32; y + x.double() would be float64
    return y


def _other_region(self, x):  # type: ignore[no-untyped-def]
    y = F.linear(x, self.w0, self.b0)
    with torch.no_grad():
        y.relu_()  # untracked by autograd: y keeps linear's grad_fn
    return y


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (_read_before_write, "value read before the write"),
        (_writes_a_view, "written value not provably fresh"),
        (_promotes, "out-of-place result has another dtype or layout"),
        (_writes_input, None),
    ],
    ids=["read-before", "through-a-view", "type-promotion", "caller-input"],
)
def test_observable_writes_stay(fn, reason) -> None:  # type: ignore[no-untyped-def]
    mod = Fn(fn, **_weights(1))
    x = torch.randn(4, 8)
    gm = optimize_dynamo(mod, [x.clone()])
    report = gm.optimus_report
    assert "functionalize_inplace" not in report.rules_fired
    assert len(_in_place_nodes(gm)) == 1
    if reason is not None:
        assert report.declined_reasons.get(f"functionalize_inplace: {reason}", 0) >= 1, (
            report.declined_reasons
        )
    a, b = x.clone(), x.clone()
    assert_same_results(mod(a), gm(b), sources=[*mod.parameters()])
    torch.testing.assert_close(b, a)  # the caller's input written alike


def test_write_in_a_no_grad_region_stays_through_dynamo() -> None:
    """Dynamo keeps the region's context nodes; the write under no_grad is left as is, so the
    output keeps requiring grad with linear's gradient, as in eager."""
    mod = Fn(_other_region, **_weights(1))
    x = torch.randn(4, 8)
    gm = optimus.optimize(mod, (x,))
    assert "functionalize_inplace" not in gm.optimus_report.rules_fired
    want, got = mod(x), gm(x)
    assert got.requires_grad == want.requires_grad
    assert_parity(mod, gm, [x])


def test_producer_that_saves_its_result_stays_and_eager_error_is_kept() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = torch.tanh(F.linear(x, self.w0, self.b0))
        y.add_(1.0)  # tanh's backward reads y: eager raises in backward
        return y

    mod = Fn(f, **_weights(1))
    x = torch.randn(4, 8)
    gm = optimize_dynamo(mod, [x])
    assert "functionalize_inplace" not in gm.optimus_report.rules_fired
    for fn in (mod, gm):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            fn(x).sum().backward()


def test_cost_model_declines_the_batching_it_unpins() -> None:
    """The rule itself is a cleanup (an out-of-place op costs one allocation, no kernel): it still
    runs, but on a device where launches are free the merge it unpins is declined."""
    mod = Fn(_towers_relu_method, **_weights())
    xs = [torch.randn(4, 8)]
    free_launches = AnalyticCostModel(cpu=DeviceConstants(launch_s=0.0, bytes_per_s=1e9, flops_per_s=1e9))
    gm = optimize_dynamo(mod, xs, cost_model=free_launches)
    report = gm.optimus_report
    assert report.rules_fired.get("functionalize_inplace") == N
    assert "merge_shared_linear" not in report.rules_fired
    assert report.declined.get("merge_shared_linear", 0) >= 1, report.declined
    assert_parity(mod, gm, xs)


def test_functionalized_values_keep_their_requires_grad_for_the_batching_rules() -> None:
    """Found by the fuzzer: the out-of-place ops must carry the write's captured value, or the
    batching rules see an unknown requires_grad and stack a value that requires grad with one that
    does not (the caller would then get a grad-requiring result where eager's does not)."""

    def f(self, x, z):  # type: ignore[no-untyped-def]
        a = F.linear(z, self.w0, self.b0)  # requires grad (parameters)
        a += 1.0
        b = torch.cat(torch.split(z.view(4, 8), 4, dim=1), dim=1)  # z does not require grad
        b += 1.0
        c = x * 1.5
        c += 1.0
        return a, b, c

    mod = Fn(f, **_weights(1))
    x, z = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    gm = optimize_dynamo(mod, [x, z])
    assert gm.optimus_report.rules_fired.get("functionalize_inplace") == 3
    want, got = mod(x, z), gm(x, z)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want] == [True, False, True]
    assert_same_results(want, got, sources=[x, z, *mod.parameters()])
