"""Activation checkpointing in a graph that runs eagerly recomputes with the forward's random
numbers, as ``torch.utils.checkpoint`` does in eager.

WHY: Dynamo turns ``torch.utils.checkpoint.checkpoint(fn, ...)`` into the higher-order op
``tag_activation_checkpoint``. Run eagerly (the graph ``optimize`` returns, and the Dynamo path's
subgraphs), that op calls ``checkpoint(..., preserve_rng_state=False)``: it leaves the RNG to
Inductor's RNG functionalization, which an eager run never gets. The backward's recomputation then
draws fresh random numbers, so a dropout inside a checkpointed block gets another mask in the
backward than in the forward, and the gradients are silently wrong (with dropout 0.3 in three
checkpointed towers, every parameter of those towers; plain ``torch.compile(backend="eager")``
does the same). :func:`keep_rng` points each such call at :func:`checkpointed`, which calls
``torch.utils.checkpoint.checkpoint`` with the user's own ``use_reentrant`` and
``preserve_rng_state`` (True unless the user said otherwise), as eager does. Compiled again by
``torch.compile``, that call becomes the same higher-order op, for Inductor to handle as before.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

_HOP_NAME = "tag_activation_checkpoint"


def _is_checkpoint(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__name__", "") == _HOP_NAME


def checkpointed(body: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint(body, *args)`` with eager's RNG handling."""
    return torch.utils.checkpoint.checkpoint(
        body,
        *args,
        use_reentrant=bool(kwargs.get("use_reentrant", False)),
        preserve_rng_state=bool(kwargs.get("preserve_rng_state", True)),
    )


def keep_rng(gm: fx.GraphModule) -> int:
    """Point every ``tag_activation_checkpoint`` call of ``gm`` at :func:`checkpointed` (keyword
    arguments it does not know, such as a ``context_fn`` of selective checkpointing, leave the
    call as it is); return how many were changed."""
    changed = 0
    for node in gm.graph.nodes:
        if not _is_checkpoint(node):
            continue
        if set(node.kwargs) - {"use_reentrant", "preserve_rng_state"}:
            continue
        node.target = checkpointed
        changed += 1
    if changed:
        gm.recompile()
    return changed


__all__ = ["checkpointed", "keep_rng"]
