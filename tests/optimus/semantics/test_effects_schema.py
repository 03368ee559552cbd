"""Effects from the op schema: random draws, state updates and outputs that alias an input.

CSE must never merge (and DCE never drop) BatchNorm in train mode or a random op; a dropout that
returns its input (eval mode, ``p == 0``) is an alias of it, so an in-place op on its result is an
in-place op on the input. Checked against eager: outputs, BatchNorm buffers, and the RNG state
after the call.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import LAUNCH_BOUND
from torch import fx, nn

import optimus
from optimus.backend import OptimusPreGradPass
from optimus.params.relayout import RelayoutParams
from optimus.semantics.op_schema import op_facts

CONFIGS = {
    "default": lambda: optimus.OptimusConfig(),
    "launch_bound": lambda: optimus.OptimusConfig(cost_model=LAUNCH_BOUND),
    "relayout": lambda: optimus.OptimusConfig(layout=RelayoutParams()),
}


# -- the schema reader ----------------------------------------------------------------------------


def _node(fn: Callable[[fx.Graph, fx.Node, fx.Node], fx.Node]) -> fx.Node:
    g = fx.Graph()
    x, stat = g.placeholder("x"), g.placeholder("stat")
    return fn(g, x, stat)


@pytest.mark.parametrize(
    ("build", "random", "writes_stat", "alias"),
    [
        (lambda g, x, s: g.call_function(torch.rrelu, (x,), {"training": True}), True, False, False),
        (lambda g, x, s: g.call_function(torch.rrelu, (x,)), False, False, False),
        (lambda g, x, s: g.call_function(torch.native_dropout, (x, 0.5, True)), True, False, False),
        (lambda g, x, s: g.call_function(torch.feature_dropout, (x, 0.5, True)), True, False, True),
        (lambda g, x, s: g.call_function(F.alpha_dropout, (x, 0.5, True)), True, False, True),
        (lambda g, x, s: g.call_function(F.dropout, (x, 0.5), {"training": False}), False, False, True),
        (lambda g, x, s: g.call_function(F.dropout, (x, 0.0, True)), False, False, True),
        (lambda g, x, s: g.call_method("bernoulli_", (x, 0.5)), True, False, True),
        (lambda g, x, s: g.call_function(torch.randn_like, (x,)), True, False, False),
        (lambda g, x, s: g.call_function(F.batch_norm, (x, s, s), {"training": True}), False, True, False),
        (lambda g, x, s: g.call_function(F.batch_norm, (x, s, s), {"training": False}), False, False, False),
        (
            lambda g, x, s: g.call_function(torch.batch_norm, (x, None, None, s, s, True, 0.1, 1e-5, False)),
            False,
            True,
            False,
        ),
        (lambda g, x, s: g.call_function(torch.nan_to_num, (x,)), False, False, False),
        (lambda g, x, s: g.call_function(F.embedding, (x, s), {"max_norm": 1.0}), False, True, False),
        (lambda g, x, s: g.call_method("contiguous", (x,)), False, False, True),
        (lambda g, x, s: g.call_method("type_as", (x, s)), False, False, True),
        # factory methods with trailing sizes bind to the schema: new memory, nothing written
        (lambda g, x, s: g.call_method("new_zeros", (x, 4, 8)), False, False, False),
        (lambda g, x, s: g.call_method("new_ones", (x, 4, 8)), False, False, False),
        (lambda g, x, s: g.call_method("new_empty", (x, 4, 8)), False, False, False),
        (lambda g, x, s: g.call_method("new_full", (x, (4, 8), 1.0)), False, False, False),
        (lambda g, x, s: g.call_function(torch.zeros_like, (x,)), False, False, False),
        (lambda g, x, s: g.call_method("view", (x, 4, 8)), False, False, True),  # still a view
        (lambda g, x, s: g.call_method("expand", (x, 4, 8)), False, False, True),
    ],
)
def test_facts_come_from_the_schema(build, random: bool, writes_stat: bool, alias: bool) -> None:  # type: ignore[no-untyped-def]
    node = _node(build)
    facts = op_facts(node)
    assert facts is not None, node.format_node()
    assert facts.random is random, node.format_node()
    assert any(w.name == "stat" for w in facts.writes) is writes_stat, node.format_node()
    assert facts.may_alias is alias, node.format_node()


# -- BatchNorm in train mode -----------------------------------------------------------------------


class TwiceBN(nn.Module):
    """``bn(x) + bn(x)`` plus an unused ``bn(x)``: three running-stat updates in eager."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.bn(x)
        return self.bn(x) + self.bn(x)


class FunctionalBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(8))
        self.register_buffer("var", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        F.batch_norm(x, self.mean, self.var, training=True)
        a = F.batch_norm(x, self.mean, self.var, training=True)
        b = F.batch_norm(x, self.mean, self.var, training=True)
        return a * b


@pytest.mark.parametrize("model", [TwiceBN, FunctionalBN])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_batch_norm_train_is_neither_merged_nor_dropped(model: type[nn.Module], config: str) -> None:
    torch.manual_seed(0)
    module = model().train()
    x = torch.randn(6, 8) * 3 + 1
    gm = optimus.optimize(module, (x,), config=CONFIGS[config]())
    eager = copy.deepcopy(module)  # same buffers as the optimized model's owner, now
    got, want = gm(x), eager(x)
    torch.testing.assert_close(got, want)
    for (name, a), (_, b) in zip(module.named_buffers(), eager.named_buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=f"buffer {name} diverged from eager")
    reasons = gm.optimus_report.declined_reasons
    assert any(r.startswith("cse: state-updating op") for r in reasons), reasons


# -- random ops --------------------------------------------------------------------------------------

RANDOM_PAIRS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "rrelu": lambda x: torch.rrelu(x, training=True),
    "alpha_dropout": lambda x: F.alpha_dropout(x, 0.5, True),
    "feature_dropout": lambda x: torch.feature_dropout(x, 0.5, True),
    "native_dropout": lambda x: torch.native_dropout(x, 0.5, True)[0],
    "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)),
    "rand_like": lambda x: torch.rand_like(x) + x,
    "dropout": lambda x: F.dropout(x, 0.5, True),
}


class Draws(nn.Module):
    """Two independent draws of the same call (a - b must not be 0), plus an unused one."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fn(x)  # unused: still advances the RNG in eager
        return self.fn(x) - self.fn(x)


@pytest.mark.parametrize("op", sorted(RANDOM_PAIRS))
@pytest.mark.parametrize("config", ["default", "launch_bound"])
def test_random_ops_are_neither_merged_nor_dropped(op: str, config: str) -> None:
    module = Draws(RANDOM_PAIRS[op])
    x = torch.randn(16, 32)
    gm = optimus.optimize(module, (x,), config=CONFIGS[config]())
    torch.manual_seed(123)
    got = gm(x)
    got_state = torch.get_rng_state()
    torch.manual_seed(123)
    want = module(x)
    want_state = torch.get_rng_state()
    assert got.abs().max() > 0, "two independent draws were merged into one"
    torch.testing.assert_close(got, want)  # same draws in the same order
    assert torch.equal(got_state, want_state), "the RNG stream moved differently from eager"


# -- dropout that returns its input ----------------------------------------------------------------


class DropoutAlias(nn.Module):
    """``d = dropout(x)`` is ``x`` itself here; ``d.add_`` changes ``x``; a later ``tanh(x)`` must
    see the change even when it is batched with tanh calls placed before the mutation."""

    def __init__(self, p: float, training: bool) -> None:
        super().__init__()
        self.p, self.training_flag = p, training

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        early = [torch.tanh(y + float(i)) for i in range(4)]
        d = F.dropout(x, self.p, training=self.training_flag)
        d.add_(1.0)
        return (*early, torch.tanh(x), d)


@pytest.mark.parametrize(("p", "training"), [(0.5, False), (0.0, True)])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_dropout_returning_its_input_is_an_alias(p: float, training: bool, config: str) -> None:
    torch.manual_seed(0)
    module = DropoutAlias(p, training)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    gm = optimus.optimize(module, (x.clone(), y), config=CONFIGS[config]().with_(cost_model=LAUNCH_BOUND))
    got = gm(x.clone(), y)
    want = module(x.clone(), y)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


# -- torch.compile (Inductor): few and tiny ---------------------------------------------------------


@pytest.mark.compile
def test_backend_keeps_batch_norm_updates_and_random_draws() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = TwiceBN().train()
    eager = copy.deepcopy(module)
    x = torch.randn(6, 8)
    compiled = torch.compile(module, backend=optimus.backend(optimus.OptimusConfig(cost_model=LAUNCH_BOUND)))
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
    for (name, a), (_, b) in zip(module.named_buffers(), eager.named_buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=f"buffer {name} diverged from eager")
    draws = torch.compile(Draws(RANDOM_PAIRS["rrelu"]), backend="optimus")
    assert draws(torch.randn(16, 32)).abs().max() > 0
    # The dropout alias through the backend's graph, run eagerly after Optimus: Inductor (and
    # aot_eager) alone already return tanh(x) of the unmutated x here (AOTAutograd takes the
    # eval-mode dropout's output for a fresh tensor), so Inductor cannot be the judge of it.
    alias = DropoutAlias(0.5, False)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    as_is = optimus.backend(optimus.OptimusConfig(cost_model=LAUNCH_BOUND), inner=lambda gm, example: gm)
    got = torch.compile(alias, backend=as_is)(x.clone(), y)
    for a, b in zip(got, alias(x.clone(), y), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.compile
def test_pre_grad_pass_keeps_batch_norm_updates() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = TwiceBN().train()
    eager = copy.deepcopy(module)
    x = torch.randn(6, 8)
    tuned = OptimusPreGradPass(optimus.OptimusConfig(cost_model=LAUNCH_BOUND))
    with torch._inductor.config.patch(pre_grad_custom_pass=tuned, force_disable_caches=True):
        torch.testing.assert_close(torch.compile(module)(x), eager(x), rtol=1e-4, atol=1e-5)
    for (name, a), (_, b) in zip(module.named_buffers(), eager.named_buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=f"buffer {name} diverged from eager")


def test_dtype_conversions_alias_only_when_the_dtype_is_kept() -> None:
    """``x.long()`` of a float is a new tensor; ``i.long()`` of an int64 is ``i`` itself."""
    from optimus.capture import export as capture
    from optimus.semantics.meta import tensor_meta

    class Converts(nn.Module):
        def forward(self, x: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x.long() * 1, i.float() * 1, x.to(torch.float64) * 1, x.to(torch.float32) * 1, i.long() * 1

    gm = capture.export(Converts(), (torch.randn(3), torch.arange(3)))
    seen: dict[tuple[str, str, torch.dtype], bool] = {}
    for n in gm.graph.nodes:
        facts = op_facts(n) if n.op == "call_method" else None
        meta = tensor_meta(n)
        if facts is not None and meta is not None:
            seen[(str(n.target), n.args[0].name, meta.dtype)] = facts.may_alias
    x, i = (p.name for p in gm.graph.nodes if p.op == "placeholder")
    want = {
        ("long", x, torch.int64): False,
        ("float", i, torch.float32): False,
        ("to", x, torch.float64): False,
    }
    assert {k: seen.get(k) for k in want} == want, seen
    kept = [
        v
        for (target, src, dtype), v in seen.items()
        if (src, dtype) in ((x, torch.float32), (i, torch.int64))
    ]
    assert kept and all(kept), seen  # same dtype: may be the input itself (Dynamo may drop these)
