"""``torch.ops.optimus.grouped_linear``: G linears of different shapes as one op, with autograd.

    ys = grouped_linear(xs, ws, bs, activation, backend)
    ys[g] = act(F.linear(xs[g], ws[g], bs[g]))   for every group g (bs empty: no bias)

WHY a custom op: the ``group_linear`` rule puts one node in the graph for the whole group, and
``torch.compile``/Inductor must be able to trace through it (FakeTensor shapes from the fake
impl, backward from ``register_autograd``) and place it as one extern kernel. It is a
``custom_op``, not a ``triton_op``: the Triton launch reads every group's ``data_ptr`` into a
table, which a FakeTensor trace cannot do, so Inductor keeps the op opaque.

Backends (the rule picks one with the cost model and writes it into the node):

* ``"triton"``: the grouped kernel (:mod:`.grouped_linear_triton`): forward, dX and dW are one
  launch each. CUDA; CPU only under ``TRITON_INTERPRET=1`` (tests).
* ``"loop"``: ``F.linear`` per group, exactly what the unfused graph ran.
* ``"padded"``: zero-pad every group to the largest (M, K, N), one ``baddbmm``, slice. Pays
  when the shapes are close (little padding) and launches are dear.

The backward of every backend is the ``grouped_linear_backward`` op (a second custom op, so
compiled graphs trace it too): two grouped launches with ``"triton"``, else a loop.
Inputs are 2-D ([M_g, K_g]); the rule only groups such linears.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

BACKENDS = ("triton", "loop", "padded")
ACTIVATIONS = ("none", "relu")


def triton_installed() -> bool:
    """Whether the ``triton`` package can be imported (no import is done)."""
    return importlib.util.find_spec("triton") is not None


def _triton() -> Any:
    from optimus.kernels import grouped_linear_triton

    return grouped_linear_triton


def _check(
    xs: Sequence[Tensor], ws: Sequence[Tensor], bs: Sequence[Tensor], activation: str, backend: str
) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"grouped_linear backend must be one of {BACKENDS}, got {backend!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"grouped_linear activation must be one of {ACTIVATIONS}, got {activation!r}")
    if not xs or len(xs) != len(ws) or (bs and len(bs) != len(xs)):
        raise ValueError(
            f"grouped_linear needs G >= 1 inputs, G weights and 0 or G biases; got {len(xs)}, {len(ws)}, {len(bs)}"
        )
    for i, (x, w) in enumerate(zip(xs, ws, strict=True)):
        if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
            raise ValueError(
                f"grouped_linear group {i}: input {tuple(x.shape)} does not fit weight {tuple(w.shape)}"
            )


def _activate(y: Tensor, activation: str) -> Tensor:
    return torch.relu(y) if activation == "relu" else y


def loop_forward(
    xs: Sequence[Tensor], ws: Sequence[Tensor], bs: Sequence[Tensor], activation: str
) -> list[Tensor]:
    """One ``F.linear`` per group (the unfused computation, bit for bit)."""
    biases: Sequence[Tensor | None] = bs if bs else [None] * len(xs)
    return [_activate(F.linear(x, w, b), activation) for x, w, b in zip(xs, ws, biases, strict=True)]


def padded_forward(
    xs: Sequence[Tensor], ws: Sequence[Tensor], bs: Sequence[Tensor], activation: str
) -> list[Tensor]:
    """Zero-pad each group to the largest (M, K, N), one batched matmul, slice each group out.
    Zero rows/columns add exact zeros, so only the summation order differs from ``F.linear``."""
    m = max(x.shape[0] for x in xs)
    k = max(x.shape[1] for x in xs)
    n = max(w.shape[0] for w in ws)
    xp = torch.stack([F.pad(x, (0, k - x.shape[1], 0, m - x.shape[0])) for x in xs])  # [G, M, K]
    wp = torch.stack([F.pad(w, (0, k - w.shape[1], 0, n - w.shape[0])) for w in ws])  # [G, N, K]
    if bs:
        bp = torch.stack([F.pad(b, (0, n - b.shape[0])) for b in bs]).unsqueeze(1)  # [G, 1, N]
        out = torch.baddbmm(bp, xp, wp.transpose(1, 2))
    else:
        out = torch.bmm(xp, wp.transpose(1, 2))
    out = _activate(out, activation)
    # a fresh contiguous tensor per group, as F.linear gives (``contiguous()`` could return a view)
    return [
        out[g, : x.shape[0], : w.shape[0]].clone(memory_format=torch.contiguous_format)
        for g, (x, w) in enumerate(zip(xs, ws, strict=True))
    ]


@torch.library.custom_op("optimus::grouped_linear", mutates_args=())
def grouped_linear(
    xs: list[Tensor], ws: list[Tensor], bs: list[Tensor], activation: str, backend: str
) -> list[Tensor]:
    """``[act(F.linear(xs[g], ws[g], bs[g])) for g]`` (``bs`` empty: no bias) with ``backend``."""
    _check(xs, ws, bs, activation, backend)
    if backend == "triton":
        return _triton().linear_forward(xs, ws, bs, activation)
    if backend == "padded":
        return padded_forward(xs, ws, bs, activation)
    return loop_forward(xs, ws, bs, activation)


@grouped_linear.register_fake
def _grouped_linear_fake(
    xs: list[Tensor], ws: list[Tensor], bs: list[Tensor], activation: str, backend: str
) -> list[Tensor]:
    _check(xs, ws, bs, activation, backend)
    return [x.new_empty((x.shape[0], w.shape[0])) for x, w in zip(xs, ws, strict=True)]


@torch.library.custom_op("optimus::grouped_linear_backward", mutates_args=())
def grouped_linear_backward(
    grads: list[Tensor],
    xs: list[Tensor],
    ws: list[Tensor],
    ys: list[Tensor],
    has_bias: bool,
    activation: str,
    backend: str,
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """(dX, dW, db) of :func:`grouped_linear`; ``ys`` are its outputs when ``activation`` needs
    them (relu: the gradient passes where y > 0), else empty. db is empty without a bias."""
    if activation == "relu":
        grads = [torch.where(y > 0, dy, torch.zeros_like(dy)) for dy, y in zip(grads, ys, strict=True)]
    if backend == "triton":
        dx, dw, sums = _triton().linear_backward(grads, xs, ws)
        return dx, dw, sums if has_bias else []
    dx = [dy @ w for dy, w in zip(grads, ws, strict=True)]
    dw = [dy.t() @ x for dy, x in zip(grads, xs, strict=True)]
    db = [dy.sum(0) for dy in grads] if has_bias else []
    return dx, dw, db


@grouped_linear_backward.register_fake
def _grouped_linear_backward_fake(
    grads: list[Tensor],
    xs: list[Tensor],
    ws: list[Tensor],
    ys: list[Tensor],
    has_bias: bool,
    activation: str,
    backend: str,
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    db = [w.new_empty((w.shape[0],)) for w in ws] if has_bias else []
    return [torch.empty_like(x) for x in xs], [torch.empty_like(w) for w in ws], db


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    xs, ws, bs, activation, backend = inputs
    ctx.activation, ctx.backend, ctx.has_bias = activation, backend, bool(bs)
    ys = list(output) if activation != "none" else []
    ctx.save_for_backward(*xs, *ws, *ys)
    ctx.groups = len(xs)


def _backward(ctx: Any, grads: list[Tensor | None]) -> tuple[Any, ...]:
    g = ctx.groups
    saved = ctx.saved_tensors
    xs, ws, ys = list(saved[:g]), list(saved[g : 2 * g]), list(saved[2 * g :])
    dys = [
        torch.zeros((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
        if dy is None
        else dy.contiguous()
        for dy, x, w in zip(grads, xs, ws, strict=True)
    ]
    dx, dw, db = torch.ops.optimus.grouped_linear_backward(
        dys, xs, ws, ys, ctx.has_bias, ctx.activation, ctx.backend
    )
    return list(dx), list(dw), list(db), None, None


grouped_linear.register_autograd(_backward, setup_context=_setup_context)


def _autocast_kernel(device_type: str) -> Any:
    """Under autocast, ``F.linear`` runs in the autocast dtype (it is on autocast's lower-precision
    list); the grouped op must too, or a rewritten graph would compute in another dtype. Cast the
    floating inputs to ``torch.get_autocast_dtype(device_type)`` and run the op with autocast off,
    as autocast does for ``linear``."""

    def kernel(
        xs: list[Tensor], ws: list[Tensor], bs: list[Tensor], activation: str, backend: str
    ) -> list[Tensor]:
        dtype = torch.get_autocast_dtype(device_type)

        def cast(ts: list[Tensor]) -> list[Tensor]:
            return [t.to(dtype) if t.is_floating_point() else t for t in ts]

        with torch.autocast(device_type, enabled=False):
            return torch.ops.optimus.grouped_linear(cast(xs), cast(ws), cast(bs), activation, backend)

    return kernel


_LIB = torch.library.Library("optimus", "IMPL")  # registered once, on import
_LIB.impl("grouped_linear", _autocast_kernel("cpu"), "AutocastCPU")
_LIB.impl("grouped_linear", _autocast_kernel("cuda"), "AutocastCUDA")
