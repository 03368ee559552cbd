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

Reentrant checkpointing (``use_reentrant=True``) decides from the *explicit* inputs alone whether
anything is differentiated: when none requires grad, eager's output does not require grad and the
block's parameters get no gradient (PyTorch warns "None of the inputs have requires_grad=True").
The op passes the block's parameters as inputs beside the explicit ones (Dynamo lifts what the
block reads), so :func:`keep_rng` records which inputs are the module's parameters (``get_attr``
nodes, or a Dynamo graph's parameter inputs) and :func:`checkpointed` lets the block read those
as eager's block does, from outside. Known limit: an intermediate tensor the block reads from an
enclosing scope (a closure) is lifted the same way and taken for an explicit input.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

_HOP_NAME = "tag_activation_checkpoint"


def _is_checkpoint(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__name__", "") == _HOP_NAME


def checkpointed(body: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint(body, *args)`` with eager's RNG handling; with
    ``use_reentrant``, the inputs at the positions ``params`` are read by the block, not passed
    to the checkpoint (see the module docstring)."""
    reentrant = bool(kwargs.get("use_reentrant", False))
    preserve = bool(kwargs.get("preserve_rng_state", True))
    params = frozenset(kwargs.get("params", ()))
    if not (reentrant and params):
        return torch.utils.checkpoint.checkpoint(
            body, *args, use_reentrant=reentrant, preserve_rng_state=preserve
        )
    explicit = [a for i, a in enumerate(args) if i not in params]

    def block(*given: Any) -> Any:
        it = iter(given)
        return body(*(a if i in params else next(it) for i, a in enumerate(args)))

    return torch.utils.checkpoint.checkpoint(
        block, *explicit, use_reentrant=True, preserve_rng_state=preserve
    )


def _is_parameter(node: Any, gm: fx.GraphModule) -> bool:
    """``node`` is one of the module's parameters: a ``get_attr`` of one (an exported graph) or a
    Dynamo graph's input whose example is one."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "get_attr":
        try:
            return isinstance(gm.get_parameter(str(node.target)), torch.nn.Parameter)
        except AttributeError:
            return False
    grapharg = node.meta.get("grapharg") if node.op == "placeholder" else None
    return isinstance(getattr(grapharg, "example", None), torch.nn.Parameter)


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
        if node.kwargs.get("use_reentrant"):
            params = tuple(i for i, a in enumerate(node.args[1:]) if _is_parameter(a, gm))
            node.kwargs = {**node.kwargs, "params": params}
        changed += 1
    if changed:
        gm.recompile()
    return changed


__all__ = ["checkpointed", "keep_rng"]
