"""The members of a re-laid-out group as the leaves of the autograd graph.

WHY: in the default hand-off (:mod:`optimus.params.group`) the stacked parameter is the graph's
leaf and a hook turns its gradient into each member's ``.grad``. DistributedDataParallel
all-reduces from hooks on each parameter's gradient accumulator, so it never sees a member's
gradient arrive: the ranks keep rank-local gradients, and DDP raises at the next step because the
members it waits for were "not used in producing loss". Here the graph reads the stacked storage
through :func:`attach_members`, an autograd function whose inputs are the members themselves and
whose output is the storage, unchanged (a view: no copy in the forward). Its backward returns each
member's slice of the incoming gradient, so autograd's own ``AccumulateGrad`` of every member
runs: DDP's and DMP's reducers, ``no_sync()``, the members' own tensor and post-accumulate hooks,
``requires_grad`` and ``torch.autograd.grad`` with respect to the members all behave as in the
unfused model. The stacked parameter then does not require grad, so DDP neither reduces it nor
waits for it, and an optimizer that also holds it skips it (its ``.grad`` stays None).

The price is one autograd node per group in the forward and one ``AccumulateGrad`` per member in
the backward, where the hook costs one Python call per group: the hooks stay the default in a
single process, this is the layout under a process group (``RelayoutParams(gradients=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class _AttachMembers(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, storage: torch.Tensor, sizes: Sequence[int] | None, *members: torch.Tensor) -> torch.Tensor:  # type: ignore[override]  # fmt: skip
        ctx.sizes = None if sizes is None else list(sizes)
        return storage.view_as(storage)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        parts = grad.unbind(0) if ctx.sizes is None else grad.split(ctx.sizes, 0)
        wanted = ctx.needs_input_grad[2:]
        return (None, None, *(p if w else None for p, w in zip(parts, wanted, strict=True)))


def attach_members(
    storage: torch.Tensor, sizes: Sequence[int] | None, *members: torch.Tensor
) -> torch.Tensor:
    """``storage`` (the members stacked along a new dim 0 when ``sizes`` is None, else
    concatenated along dim 0 in blocks of ``sizes``) as a tensor whose gradient flows to
    ``members``: each member gets its slice, through its own gradient accumulator."""
    return _AttachMembers.apply(storage, sizes, *members)
