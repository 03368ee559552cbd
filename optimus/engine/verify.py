"""verify=True: run the original and the rewritten graph on the same seeded inputs and compare
outputs and gradients with dtype-aware tolerances.

WHY per rewrite: a rewrite that changes results must be found and undone individually, so the
rest of the optimization still applies. The reference is computed once; each check runs the
rewritten graph forward and backward once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

# (rtol, atol) per dtype: batched kernels accumulate in a different order than per-member ones.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


def tolerance(
    dtype: torch.dtype, rtol: float | None = None, atol: float | None = None
) -> tuple[float, float]:
    base = TOLERANCES.get(dtype, (0.0, 0.0))
    return (base[0] if rtol is None else rtol, base[1] if atol is None else atol)


def _clone(value: Any) -> tuple[Any, torch.Tensor | None]:
    """A fresh copy of one input, and the leaf that gradients are taken against (None: none).

    A float input is passed as a non-leaf copy of a grad-requiring leaf, so a model that writes
    its input in place (``x.add_(1)``) runs as it does for the caller instead of raising on "a leaf
    Variable that requires grad is used in an in-place operation"."""
    if isinstance(value, torch.nn.Parameter):
        return value, None  # parameters passed as graph inputs (Dynamo backend graphs): use as is
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            leaf = value.detach().clone().requires_grad_(True)
            return leaf.clone(), leaf
        return value.detach().clone(), None
    return value, None


def run_with_grads(
    gm: fx.GraphModule, inputs: Sequence[Any], seed: int
) -> tuple[list[torch.Tensor], list[Any]]:
    """Outputs and gradients (w.r.t. float inputs and parameters) of a seeded forward/backward."""
    cloned = [_clone(x) for x in inputs]
    args = [arg for arg, _leaf in cloned]
    leaves = [leaf for _arg, leaf in cloned if leaf is not None]
    leaves += [a for a in args if isinstance(a, torch.nn.Parameter) and a.requires_grad]
    leaves += [p for p in gm.parameters() if p.requires_grad and all(p is not a for a in leaves)]
    torch.manual_seed(seed)
    with torch.enable_grad():
        out = gm(*args)
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        loss = None
        gen = torch.Generator().manual_seed(seed + 1)
        for o in outs:
            if o.requires_grad and o.is_floating_point():
                weight = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device, o.dtype)
                term = (o * weight).sum()
                loss = term if loss is None else loss + term
        grads: list[Any] = []
        if loss is not None and leaves:
            grads = list(torch.autograd.grad(loss, leaves, allow_unused=True))
    return [o.detach() for o in outs], grads


def compare(
    ref: tuple[list[torch.Tensor], list[Any]],
    new: tuple[list[torch.Tensor], list[Any]],
    rtol: float | None = None,
    atol: float | None = None,
) -> str | None:
    """None if equal within tolerance, else what differs."""
    for kind, a_list, b_list in (("output", ref[0], new[0]), ("gradient", ref[1], new[1])):
        if len(a_list) != len(b_list):
            return f"{kind} count differs: {len(a_list)} vs {len(b_list)}"
        for i, (a, b) in enumerate(zip(a_list, b_list, strict=True)):
            if a is None or b is None:
                if (a is None) != (b is None):
                    return f"{kind} {i}: one side has no gradient"
                continue
            if a.shape != b.shape or a.dtype != b.dtype:
                return f"{kind} {i}: shape/dtype {tuple(a.shape)}/{a.dtype} vs {tuple(b.shape)}/{b.dtype}"
            r, t = tolerance(a.dtype, rtol, atol)
            if not torch.allclose(a, b, rtol=r, atol=t, equal_nan=True):
                err = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "n/a"
                return f"{kind} {i} differs (max abs err {err})"
    return None


class Verifier:
    def __init__(
        self,
        reference: fx.GraphModule,
        inputs: Sequence[Any],
        seed: int = 0,
        rtol: float | None = None,
        atol: float | None = None,
    ) -> None:
        self.inputs = list(inputs)
        self.seed = seed
        self.rtol, self.atol = rtol, atol
        self.expected = run_with_grads(reference, self.inputs, seed)

    def check(self, gm: fx.GraphModule) -> str | None:
        gm.recompile()
        try:
            got = run_with_grads(gm, self.inputs, self.seed)
        except Exception as exc:  # the rewritten graph does not even run
            return f"rewritten graph raised {type(exc).__name__}: {exc}"
        return compare(self.expected, got, self.rtol, self.atol)
