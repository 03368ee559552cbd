"""The public API: optimize() capture paths, errors, the 32-tower acceptance model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import assert_parity, count_calls
from torch import nn

import optimus
from models.synthetic_towers import Towers


@pytest.fixture(scope="module")
def towers32() -> tuple[nn.Module, torch.Tensor, torch.fx.GraphModule]:
    torch.manual_seed(0)
    mod = Towers(32, 16, 16)
    x = torch.randn(8, 32 * 16)
    return mod, x, optimus.optimize(mod, (x,))


def test_32_towers_become_one_batched_op(towers32) -> None:  # type: ignore[no-untyped-def]
    """Acceptance: Linear -> LayerNorm -> tanh x32 over a split input (Python loop over split
    outputs, ModuleList): the 32 linears become one batched matmul."""
    mod, x, gm = towers32
    rep = gm.optimus_report
    assert rep.capture == "export"
    assert rep.rules_fired["batch_linear"] == 1
    assert rep.rules_fired["batch_layer_norm"] == 1
    assert rep.rules_fired["batch_unary"] == 1
    assert count_calls(gm, F.linear) == 0
    assert count_calls(gm, torch.baddbmm) == 1
    assert count_calls(gm, F.layer_norm) == 1
    assert count_calls(gm, torch.split) == 0  # the stacked input is a view of x, not a copy of its pieces
    assert rep.nodes_after < rep.nodes_before
    assert_parity(mod, gm, [x])


def test_gradients_land_on_the_modules_own_parameters(towers32) -> None:  # type: ignore[no-untyped-def]
    mod, x, gm = towers32
    mod.zero_grad()
    gm(x).square().sum().backward()
    got = {n: p.grad.clone() for n, p in mod.named_parameters()}
    mod.zero_grad()
    mod(x).square().sum().backward()
    for name, p in mod.named_parameters():
        torch.testing.assert_close(got[name], p.grad)
    mod.zero_grad()
    own = {id(p) for p in mod.parameters()}
    assert all(id(p) in own for p in gm.parameters())


def test_graph_break_falls_back_to_dynamo_subgraphs() -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lins = nn.ModuleList([nn.Linear(4, 4) for _ in range(8)])

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            hs = [lin(x[i]) for i, lin in enumerate(self.lins)]
            torch._dynamo.graph_break()
            return [torch.tanh(h) for h in hs]

    torch.manual_seed(0)
    mod, x = Broken(), torch.randn(8, 2, 4)
    gm = optimus.optimize(mod, (x,), cost_model=optimus.AnalyticCostModel())
    rep = gm.optimus_report
    assert isinstance(gm, torch.fx.GraphModule)
    assert rep.capture == "dynamo-subgraphs" and rep.graphs == 2
    assert rep.rules_fired == {"batch_linear": 1, "batch_unary": 1}  # one per graph, aggregated
    assert_parity(mod, gm, [x])


def test_keyed_jagged_tensor_inputs() -> None:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            tables = [
                EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=10, feature_names=[f"f{i}"])
                for i in range(8)
            ]
            self.sparse = EmbeddingBagCollection(tables=tables)
            self.towers = nn.ModuleList([nn.Linear(4, 4) for _ in range(8)])
            self.top = nn.Linear(3 + 32, 1)

        def forward(self, x: torch.Tensor, kjt: KeyedJaggedTensor) -> torch.Tensor:
            parts = self.sparse(kjt).values().split(4, dim=1)
            h = torch.cat([torch.relu(t(p)) for t, p in zip(self.towers, parts, strict=True)], 1)
            return self.top(torch.cat([x, h], 1))

    torch.manual_seed(0)
    mod = Tiny()
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(8)],
        values=torch.randint(0, 10, (36,)),
        lengths=torch.tensor([1, 2] * 12),
    )
    x = torch.randn(3, 3)
    gm = optimus.optimize(mod, (x, kjt))
    rep = gm.optimus_report
    assert rep.rules_fired.get("batch_linear") == 1
    torch.testing.assert_close(gm(x, kjt), mod(x, kjt))
    mod.zero_grad()
    gm(x, kjt).sum().backward()
    got = {n: p.grad.clone() for n, p in mod.named_parameters() if p.grad is not None}
    mod.zero_grad()
    mod(x, kjt).sum().backward()
    want = {n: p.grad.clone() for n, p in mod.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys() and len(want) == len(list(mod.parameters()))
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_unknown_rule_name_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown rule name.*'nope'.*valid rules.*batch_linear"):
        optimus.optimize(nn.Linear(2, 2), (torch.randn(1, 2),), rules=["nope"])
    with pytest.raises(ValueError, match="rules must be"):
        optimus.optimize(nn.Linear(2, 2), (torch.randn(1, 2),), rules="batch_linear")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        ((torch.randn(2, 3), torch.randn(2, 3)), "do not match Linear.forward"),
        ((torch.randn(2, 5),), "do not match Linear: running it raised"),
        ("not a tuple", "example_inputs must be a tuple"),
    ],
)
def test_inputs_that_do_not_match_the_module(inputs, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        optimus.optimize(nn.Linear(3, 2), inputs)


def test_bad_config_values() -> None:
    with pytest.raises(ValueError, match="max_iterations"):
        optimus.OptimusConfig(max_iterations=0)
    with pytest.raises(ValueError, match="cost_model must provide"):
        optimus.OptimusConfig(cost_model=object())  # type: ignore[arg-type]
    assert tuple(optimus.rules.REGISTRY) == optimus.RULES
    assert {
        "batch_linear",
        "batch_layer_norm",
        "batch_unary",
        "batch_binary",
        "merge_shared_linear",
        "dce",
        "cse",
    } <= set(optimus.RULES)


def test_verify_passes_on_a_correct_optimization(towers32) -> None:  # type: ignore[no-untyped-def]
    mod, x, _ = towers32
    gm = optimus.optimize(mod, (x,), verify=True)
    rep = gm.optimus_report
    assert rep.rolled_back == {}
    assert rep.rules_fired["batch_linear"] == 1
    assert_parity(mod, gm, [x])


def test_mixed_fused_and_unfused_branches_under_dynamo() -> None:
    """Towers of two widths plus branches no rule touches: each width is its own group, the
    other branches stay, all in one Dynamo graph that iterates over split outputs."""

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wide = nn.ModuleList([nn.Linear(8, 8) for _ in range(8)])
            self.narrow = nn.ModuleList([nn.Linear(4, 4) for _ in range(8)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = torch.split(x, [64, 32], dim=1)
            outs = [torch.relu(lin(p)) for lin, p in zip(self.wide, a.split(8, dim=1), strict=True)]
            outs += [torch.sigmoid(lin(p)) for lin, p in zip(self.narrow, b.chunk(8, dim=1), strict=True)]
            outs.append(torch.logsumexp(x, dim=1, keepdim=True))  # unknown to the rules
            return torch.cat(outs, dim=1)

    torch.manual_seed(0)
    mod, x = Mixed(), torch.randn(5, 96)
    gm = optimus.optimize(mod, (x,))
    rep = gm.optimus_report
    assert rep.capture == "export"
    assert rep.rules_fired["batch_linear"] == 2
    assert rep.rules_fired["batch_unary"] == 2
    assert count_calls(gm, torch.logsumexp) == 1
    assert_parity(mod, gm, [x])


def test_a_model_dynamo_cannot_run_comes_back_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """If neither export nor torch.compile can capture the model, optimize() still returns a
    GraphModule that runs it, with the reason in the report (it never raises for the model)."""
    import optimus.api as api
    import optimus.capture.export as capture

    def no_export(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("export unavailable")

    def failing_compile(*args, **kwargs):  # type: ignore[no-untyped-def]
        def run(*a, **k):  # type: ignore[no-untyped-def]
            raise RuntimeError("dynamo unavailable")

        return run

    monkeypatch.setattr(capture, "export", no_export)
    monkeypatch.setattr(api.torch, "compile", failing_compile)
    torch.manual_seed(0)
    mod, x = nn.Linear(4, 3), torch.randn(2, 4)
    gm = optimus.optimize(mod, (x,))
    assert str(gm.optimus_report.stop_reason) == "unchanged"
    assert "dynamo unavailable" in gm.optimus_report.notes[-1]
    torch.testing.assert_close(gm(x), mod(x))
