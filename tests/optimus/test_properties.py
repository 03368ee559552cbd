"""Property test: random DAGs of the supported ops go through optimize() with identical outputs
and gradients.

A DAG is a small program over a pool of [B, D] tensors: linear, layer_norm, unary and binary
pointwise ops, split, cat, stack, unbind and reshape. Ops are often applied to several pool
entries at once ("parallel" steps), so the horizontal rules have groups to fuse. The cost model
is launch-bound, so every rule that can fire does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import event, given, settings
from hypothesis import strategies as st
from optimus_helpers import LAUNCH_BOUND, assert_parity
from torch import fx, nn

import optimus

B = 3
UNARY = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": lambda x: x.sigmoid(),
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "clamp": lambda x: torch.clamp(x, -0.5, 0.75),
    "leaky": lambda x: F.leaky_relu(x, 0.1),
    "silu": F.silu,
}
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": lambda a, b: a * b,
    "scale": lambda a, b: a * 0.5,
    "rsub": lambda a, b: 1.0 - a,
}
KINDS = ["linear", "layer_norm", "unary", "binary", "split", "cat", "stack", "unbind", "reshape"]


class Program(nn.Module):
    """Interprets a list of steps with static widths (so plain symbolic_trace can trace it);
    parameters are created per step and member, so each linear/layer_norm is its own module."""

    def __init__(self, steps: list[tuple[Any, ...]], widths: list[int]) -> None:
        super().__init__()
        self.steps = steps
        self.inputs = list(widths)
        self.params = nn.ParameterDict()
        pool = list(widths)
        for i, step in enumerate(steps):
            kind, srcs = step[0], step[1]
            if kind == "linear":
                for j, s in enumerate(srcs):
                    self.params[f"w{i}_{j}"] = nn.Parameter(torch.randn(step[2], pool[s]) / pool[s] ** 0.5)
                    self.params[f"b{i}_{j}"] = nn.Parameter(torch.randn(step[2]))
            elif kind == "layer_norm":
                for j, s in enumerate(srcs):
                    self.params[f"g{i}_{j}"] = nn.Parameter(torch.randn(pool[s]))
                    self.params[f"h{i}_{j}"] = nn.Parameter(torch.randn(pool[s]))
            pool.extend(_out_widths(step, pool))
        self.widths = pool

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        parts = torch.split(x, self.inputs, dim=1)
        pool: list[torch.Tensor] = [parts[k] for k in range(len(self.inputs))]
        used: set[int] = set()
        for i, step in enumerate(self.steps):
            kind, srcs = step[0], step[1]
            used.update(srcs)
            ins = [pool[s] for s in srcs]
            ws = [self.widths[s] for s in srcs]
            if kind == "linear":
                pool += [
                    F.linear(t, self.params[f"w{i}_{j}"], self.params[f"b{i}_{j}"]) for j, t in enumerate(ins)
                ]
            elif kind == "layer_norm":
                pool += [
                    F.layer_norm(t, (w,), self.params[f"g{i}_{j}"], self.params[f"h{i}_{j}"])
                    for j, (t, w) in enumerate(zip(ins, ws, strict=True))
                ]
            elif kind == "unary":
                pool += [UNARY[step[2]](t) for t in ins]
            elif kind == "binary":
                pool += [BINARY[step[2]](ins[k], ins[k + 1]) for k in range(0, len(ins) - 1, 2)]
            elif kind == "split":
                for t, w in zip(ins, ws, strict=True):
                    pieces = torch.split(t, w // 2, dim=1)
                    pool += [pieces[0], pieces[1]]
            elif kind == "cat":
                pool.append(torch.cat(ins, dim=1))
            elif kind == "stack":
                pool.append(torch.stack(ins, dim=1).reshape(B, -1))
            elif kind == "unbind":
                for t, w in zip(ins, ws, strict=True):
                    pieces = t.reshape(B, 2, w // 2).unbind(1)
                    pool += [pieces[0], pieces[1]]
            elif kind == "reshape":
                pool += [t.reshape(B, 2, -1).reshape(B, -1) for t in ins]
        return [t for k, t in enumerate(pool) if k not in used]


def _out_widths(step: tuple[Any, ...], pool: list[int]) -> list[int]:
    kind, srcs = step[0], step[1]
    ws = [pool[s] for s in srcs]
    if kind == "linear":
        return [step[2]] * len(srcs)
    if kind in ("unary", "reshape", "layer_norm"):
        return ws
    if kind == "binary":
        return [ws[k] for k in range(0, len(ws) - 1, 2)]
    if kind == "split":
        return [w // 2 for w in ws for _ in range(2)]
    if kind in ("cat", "stack"):
        return [sum(ws)]
    if kind == "unbind":
        return [w // 2 for w in ws for _ in range(2)]
    raise AssertionError(kind)


@st.composite
def programs(draw: Any) -> tuple[list[tuple[Any, ...]], list[int]]:
    widths = draw(st.lists(st.sampled_from([4, 8]), min_size=1, max_size=3))
    pool = list(widths)
    steps: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(2, 9))):
        kind = draw(st.sampled_from(KINDS))
        choices = sorted(
            {w for w in pool if w % 2 == 0} if kind in ("split", "unbind", "reshape") else set(pool)
        )
        if not choices:
            continue
        width = draw(st.sampled_from(choices))
        same = [k for k, w in enumerate(pool) if w == width]
        many = draw(st.lists(st.sampled_from(same), min_size=1, max_size=10))
        if kind == "linear":
            step: tuple[Any, ...] = (kind, many, draw(st.sampled_from([4, 8])))
        elif kind == "layer_norm":
            step = (kind, many)
        elif kind == "unary":
            step = (kind, many, draw(st.sampled_from(sorted(UNARY))))
        elif kind == "binary":
            pairs = many + many[:1] if len(many) % 2 else many
            step = (kind, pairs, draw(st.sampled_from(sorted(BINARY))))
        elif kind in ("split", "unbind", "reshape"):
            step = (kind, many)
        else:  # cat / stack: two to four tensors (stack needs equal widths, cat does not)
            if kind == "cat":
                many = draw(st.lists(st.integers(0, len(pool) - 1), min_size=2, max_size=4))
                if sum(pool[k] for k in many) > 32:
                    continue
            elif len(many) < 2 or width * len(many) > 32:
                continue
            step = (kind, many)
        steps.append(step)
        pool.extend(_out_widths(step, pool))
    return steps, widths


@given(programs(), st.integers(0, 2**16))
def test_random_dags_keep_outputs_and_gradients(
    program: tuple[list[tuple[Any, ...]], list[int]], seed: int
) -> None:
    steps, widths = program
    torch.manual_seed(seed)
    mod = Program(steps, widths)
    x = torch.randn(B, sum(widths))
    gm = optimus.optimize(fx.symbolic_trace(mod), (x,), cost_model=LAUNCH_BOUND)
    for rule in sorted(gm.optimus_report.rules_fired):
        event(f"fired {rule}")
    assert str(gm.optimus_report.stop_reason) == "saturated"
    assert gm.optimus_report.rolled_back == {}
    assert_parity(mod, gm, [x], rtol=1e-4, atol=1e-4)


@settings(max_examples=25)
@given(programs(), st.integers(0, 2**16))
def test_random_dags_float64_exact(program: tuple[list[tuple[Any, ...]], list[int]], seed: int) -> None:
    """The same DAGs in float64 with tolerance 1e-9: a reordered sum rounds at about 1e-15 there,
    so only a real change of the computation can fail (the float32 test needs 1e-4)."""
    steps, widths = program
    torch.manual_seed(seed)
    mod = Program(steps, widths).double()
    x = torch.randn(B, sum(widths), dtype=torch.float64)
    gm = optimus.optimize(fx.symbolic_trace(mod), (x,), cost_model=LAUNCH_BOUND)
    assert_parity(mod, gm, [x], rtol=1e-9, atol=1e-9)
