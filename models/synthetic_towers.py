"""The one small synthetic towers model: `n` parallel towers over the `n` slices of one input.

Why here, once: the optimizer's tests, the headroom micro-benchmark (`optimus-bench headroom`),
the asv optimizer-speed suite and the pytest optimizer benchmark all need the bare shape Optimus
was built for (many independent same-shape Linear/LayerNorm/pointwise ops between a split and a
cat), small enough to reason about and sized by one or two numbers. Each used to carry its own
copy; the options below are exactly the differences between those copies. It is not a family
(no presets, no sparse arch): the recommendation models are `models.build` (models/towers.py is
the industrial-scale towers family).

    Towers(32, 16)                                      # split -> Linear -> LayerNorm -> tanh -> cat
    Towers(4, 3, 5, slices="index", body=("linear", "tanh"))   # [4, B, 3] input, one tower per x[i]
    Towers(64, 8, 16, body=("linear", "relu", "linear", "relu", "norm"), head=1)

Only torch is imported, so optimus's tests and the GPU machine (no torchrec) can use it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

SLICES = ("split", "narrow", "index", "unbind")
STEPS = ("linear", "norm", "tanh", "relu")
JOINS = ("cat", "tuple")


class Towers(nn.Module):
    """Tower i reads slice i of the input, runs ``body``, and the outputs are joined.

    - ``slices``: how tower i gets its slice. ``"split"``: x is [B, n*width], ``torch.split``
      (Dynamo and export unroll the loop); ``"narrow"``: ``x[:, i*width:(i+1)*width]`` (plain
      ``torch.fx.symbolic_trace`` can trace it); ``"index"``: x is [n, B, width], ``x[i]``;
      ``"unbind"``: x is [n, B, width], ``x.unbind(0)``.
    - ``body``: steps in order, from ``STEPS``: ``"linear"`` (the first is Linear(width, hidden),
      later ones Linear(hidden, hidden)), ``"norm"`` (LayerNorm(hidden)), ``"tanh"``, ``"relu"``.
    - ``join``: ``"cat"`` (``torch.cat`` on dim 1) or ``"tuple"`` (the outputs as they are).
    - ``head``: a Linear(n*hidden, head) after the cat (``join="cat"`` only), or None.

    Parameters are created step by step for all towers (every tower's first Linear, then every
    tower's second, then the norms, then the head), so a seed gives the same weights as the copies
    this replaced. The first Linear of each tower is ``linears[i]``, a second ``linears2[i]``,
    the norms ``norms[i]``.
    """

    def __init__(
        self,
        n: int = 32,
        width: int = 16,
        hidden: int | None = None,
        *,
        bias: bool = True,
        body: Sequence[str] = ("linear", "norm", "tanh"),
        slices: str = "split",
        join: str = "cat",
        head: int | None = None,
    ) -> None:
        super().__init__()
        hidden = width if hidden is None else hidden
        bad = [s for s in body if s not in STEPS]
        if n < 1 or slices not in SLICES or join not in JOINS or bad or body.count("linear") not in (1, 2):
            raise ValueError(
                f"Towers(n={n}, slices={slices!r}, join={join!r}, body={tuple(body)!r}): allowed: n >= 1, "
                f"slices in {SLICES}, join in {JOINS}, body steps in {STEPS} with one or two 'linear'"
            )
        if body[0] != "linear" or (head is not None and join != "cat"):
            raise ValueError("Towers: body must start with 'linear', and a head needs join='cat'")
        self.width, self.slices, self.join, self.body = width, slices, join, tuple(body)
        self.linears = nn.ModuleList([nn.Linear(width, hidden, bias=bias) for _ in range(n)])
        if body.count("linear") == 2:
            self.linears2 = nn.ModuleList([nn.Linear(hidden, hidden, bias=bias) for _ in range(n)])
        if "norm" in body:
            self.norms = nn.ModuleList([nn.LayerNorm(hidden) for _ in range(n)])
        self.head = nn.Linear(n * hidden, head) if head is not None else None

    def _tower(self, i: int, h: Tensor) -> Tensor:
        seen = 0  # linears applied so far in this tower
        for step in self.body:
            if step == "linear":
                h = (self.linears if seen == 0 else self.linears2)[i](h)
                seen += 1
            elif step == "norm":
                h = self.norms[i](h)
            elif step == "tanh":
                h = torch.tanh(h)
            else:
                h = torch.relu(h)
        return h

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, ...]:
        n, w = len(self.linears), self.width
        pieces: Sequence[Tensor] | None = None  # narrow / index: slice i is taken at tower i
        if self.slices == "split":
            pieces = torch.split(x, w, dim=1)
        elif self.slices == "unbind":
            pieces = x.unbind(0)
        outs = []
        for i in range(n):
            if pieces is not None:
                piece = pieces[i]
            elif self.slices == "narrow":
                piece = x[:, i * w : (i + 1) * w]
            else:
                piece = x[i]
            outs.append(self._tower(i, piece))
        if self.join == "tuple":
            return tuple(outs)
        h = torch.cat(outs, dim=1)
        return h if self.head is None else self.head(h)
