"""RelayoutParams: a one-time parameter re-layout, the zero-runtime-cost ParamLayout (opt-in).

WHY: :class:`~optimus.engine.param_layout.RuntimeStack` copies every fused weight into a stacked tensor on each
forward (and scatters the gradient back on each backward). Here the copy is made once, when
``optimize()`` fuses: the G parameters are stored in ONE contiguous ``nn.Parameter`` laid out the way
the batched op wants it, and the graph reads it with a ``get_attr``.
The user's original ``nn.Parameter`` objects are kept (same Python objects) but their ``.data`` is
re-pointed to views into that storage, so:

* each parameter keeps its eager strides: the storage is the members stacked (or concatenated)
  as they are, each member a contiguous block, so ``parameters_to_vector``, ``p.view(-1)``, EMA
  and flat-buffer optimizers work as on the unfused model. Linear weights are stored
  ``[G, N, K]`` and ``baddbmm`` reads the ``[G, K, N]`` operand it wants as a transposed view of
  it (no copy: BLAS takes a transposed operand), not a ``[G, K, N]`` storage whose members would
  be transposed views with strides ``(1, N)``;

* ``module.state_dict()`` / ``load_state_dict`` / checkpoints keep their keys and shapes (loading
  writes through the views into the stacked storage); the output GraphModule's ``state_dict`` hides
  the internal stacked tensors, so it has exactly the keys of the unfused model;
* optimizers hold the original parameters: one built BEFORE ``optimize()`` keeps working (its state
  is keyed by the same objects), and so does one built after, from ``module.parameters()`` or from
  the GraphModule's ``parameters()``;
* gradients reach each original parameter's ``.grad`` through hooks on the stacked parameter,
  as views of one gradient tensor per group; ``requires_grad`` flags and the members' own gradient
  hooks are honoured (:mod:`optimus.params.group`). For groups of small members
  (``REUSE_MAX_MEMBER_BYTES`` per member on average: tower weights, biases, LayerNorm affines) the
  gradient tensor is kept between steps (its views are made once; about 0.45 us per member saved
  per backward); ``retained_gradient_buffers`` lists it, so a memory benchmark can count it;
* ``.to()``, ``load_state_dict(..., assign=True)``, ``deepcopy`` and ``requires_grad_`` after
  ``optimize()``: a per-call check re-establishes the views from the parameters' current values
  (:mod:`optimus.params.contract`; docs/optimus.md, "The re-layout and PyTorch's parameter
  contract").

When it declines (falls back to ``RuntimeStack``): the parameters are not ``get_attr`` of a
GraphModule that ``optimize()`` owns (the torch.compile backend and Inductor's pre-grad pass see
parameters as graph inputs or as another module's attributes: re-pointing them there is not safe);
``verify=True``; a parameter repeats, is not a leaf ``nn.Parameter``, or already lives in another
re-laid-out group in a different order; the parameters differ in dtype, device, shape or
``requires_grad``; a parameter is not contiguous (a view into the storage would change its
strides: ``report.declined_reasons`` counts it under ``STRIDES_REASON``); a new group of fewer than ``MIN_TRAINABLE_MEMBERS`` parameters that require
grad (the backward's gradient hand-off costs more than it saves).

Under a process group (``optimize()`` after ``init_process_group``), or with
``RelayoutParams(gradients="autograd")``, the members themselves are the autograd leaves instead:
the graph reads the storage through :func:`optimus.params.attach.attach_members`, so
DistributedDataParallel (and DMP's dense DDP) all-reduces every member's gradient.

Why opt-in, not the default: with the gradient hooks ``torch.autograd.grad(loss,
model.parameters())`` (and torch.func transforms) differentiate w.r.t. the original parameter
objects, which are no longer in the autograd graph (the stacked parameter is): they get ``None``. Only ``.backward()``-style training
sees the gradients (through the hooks). The core's parity helper uses ``autograd.grad`` and fails
with this layout as the default, so a default switch would silently change that API's results.

The re-layout is made outside ``torch.inference_mode()`` even when ``optimize()`` runs inside it,
so the stacked storage and the views are normal tensors that can be trained afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import fx, nn

from optimus.engine.builder import free_attr_name
from optimus.engine.param_layout import RuntimeStack
from optimus.params import contract as relayout_contract
from optimus.params.attach import attach_members
from optimus.params.group import (
    GROUP_ATTR,
    STACKED_GROUP_ATTR,
    _Group,
    _Kind,
    keeps_strides,
    new_group,
    still_views,
)

if TYPE_CHECKING:
    import torch

    from optimus.engine.builder import Builder
    from optimus.engine.context import RewriteContext

OWNED_FLAG = "_optimus_relayout_ok"  # set on GraphModules that optimize() owns (see api.py)
PREFIX = "_optimus_stacked_"
__all__ = [
    "GRADIENTS",
    "GROUP_ATTR",
    "OWNED_FLAG",
    "PREFIX",
    "STACKED_GROUP_ATTR",
    "STRIDES_REASON",
    "RelayoutParams",
    "retained_gradient_buffers",
]
# Copying a member's gradient into the kept buffer costs about 0.03 ns/byte on this CPU; making
# its view costs about 450 ns. Below this size per member the copy is the cheaper of the two.
REUSE_MAX_MEMBER_BYTES = 8192
# Fewest members of a new group of trainable parameters (requires_grad) worth re-laying out. Each
# backward hands the stacked gradient to the members through a Python hook, a fixed cost per
# group that the forward-only cost model does not see. Measured (results/outside-corpus/README.md,
# G parallel Linear(72, 24) -> relu -> Linear(24, 32) branches, training steps, re-laid out and
# fused vs separate): G = 2 0.76x, G = 3 1.02x, G = 4 1.24x, G = 8 1.76x. Smaller trainable groups
# fall back to the per-call stack, which the cost model prices (and declines where it does not pay).
MIN_TRAINABLE_MEMBERS = 3
# report.declined_reasons key of a group left to the per-call stack because a member is not
# contiguous: a view into the stacked storage would change its strides
STRIDES_REASON = (
    "relayout: a parameter is not contiguous, a view of the stacked storage would change its strides"
)
_STACK = _Kind("stack")
_CAT = _Kind("cat")


def _hide_from_state_dict(gm: fx.GraphModule) -> None:
    """The GraphModule's state_dict has exactly the unfused model's keys (stacked storage hidden)."""
    if getattr(gm, "_optimus_state_hooks", False):
        return

    def drop(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
        for key in [k for k in state if k.startswith(prefix + PREFIX)]:
            del state[key]

    def ignore_missing(module: nn.Module, incompatible: Any) -> None:
        incompatible.missing_keys[:] = [
            k for k in incompatible.missing_keys if not k.split(".")[-1].startswith(PREFIX)
        ]

    gm._register_state_dict_hook(drop)
    gm.register_load_state_dict_post_hook(ignore_missing)
    object.__setattr__(gm, "_optimus_state_hooks", True)


GRADIENTS = ("auto", "hooks", "autograd")
# an attached group's forward is one autograd node (a Python autograd.Function) and its backward
# one AccumulateGrad per member, priced as one launch (optimus.params.attach)
ATTACH_LAUNCHES = 1.0


def process_group_size() -> int:
    """Ranks of the default process group, 1 when there is none."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


class RelayoutParams:
    """ParamLayout that re-lays fused parameters out once (see module docstring). Opt-in:
    ``optimus.optimize(m, x, config=OptimusConfig(layout=RelayoutParams()))``.

    ``gradients`` says how a new group's gradient reaches its members:

    * ``"hooks"``: the stacked parameter is the autograd leaf and a hook hands its gradient to the
      members (:mod:`optimus.params.group`), the fastest in a single process;
    * ``"autograd"``: the members are the leaves, read through ``attach_members``
      (:mod:`optimus.params.attach`): what DistributedDataParallel, DMP's dense DDP,
      ``no_sync()`` and ``torch.autograd.grad`` with respect to the members need;
    * ``"auto"`` (default): ``"autograd"`` when ``optimize()`` runs under a process group of two
      or more ranks, else ``"hooks"``.

    A group keeps the way it was made with (a parameter lives in one group).

    ``keep_gradient_buffers`` (default True): groups of small members keep their gradient tensor
    between steps (``REUSE_MAX_MEMBER_BYTES``; about 0.45 us per member saved per backward).
    False: every backward hands its fresh gradient to the members, as the unfused model's
    autograd does. WHY the choice: a kept buffer is memory the unfused model frees at
    ``zero_grad(set_to_none=True)``, and each backward writes the new gradient into it while the
    new one is alive, so in training the peak rises by about the kept bytes where it falls in the
    backward (mmoe tiny: 51,240 B against compile's 46,160, +11%; kept off: 46,160). The
    benchmark's Optimus modes, held to a memory ceiling, turn it off."""

    def __init__(self, gradients: str = "auto", keep_gradient_buffers: bool = True) -> None:
        if gradients not in GRADIENTS:
            raise ValueError(f"RelayoutParams: gradients={gradients!r}; allowed: {', '.join(GRADIENTS)}")
        if not isinstance(keep_gradient_buffers, bool):
            raise ValueError(
                f"RelayoutParams: keep_gradient_buffers must be a bool, got {keep_gradient_buffers!r}"
            )
        self.fallback = RuntimeStack()
        self.gradients = gradients
        self.reuse_limit = REUSE_MAX_MEMBER_BYTES if keep_gradient_buffers else 0

    def attaches(self) -> bool:
        """Whether a group made now has its members as the autograd leaves."""
        if self.gradients == "auto":
            return process_group_size() > 1
        return self.gradients == "autograd"

    def gradients_in_use(self) -> str:
        """How new groups' gradients reach their members, and why (for reports and cells)."""
        ranks = process_group_size()
        if self.gradients != "auto":
            return f"{self.gradients} (asked for)"
        if ranks > 1:
            return f"autograd (a process group of {ranks} ranks: DDP reduces the members)"
        return "hooks (no process group)"

    @staticmethod
    def _group_of(p: nn.Parameter) -> tuple[_Group, int] | None:
        """(group, index) of a parameter already re-laid out (by any RelayoutParams), else None."""
        entry = getattr(p, GROUP_ATTR, None)
        return entry if isinstance(entry, tuple) else None

    # -- can we? ---------------------------------------------------------------------------------
    def _members(
        self, params: Sequence[fx.Node], kind: _Kind, two_d: bool = False, ctx: RewriteContext | None = None
    ) -> list[nn.Parameter] | None:
        """The parameters behind ``params`` if they can be (or already are) laid out as ``kind``
        (2-D ones when ``two_d``: the graph reads them transposed). ``ctx`` counts a refusal for
        the members' strides in ``report.declined_reasons``."""
        if len(params) < 2 or any(p.op != "get_attr" for p in params):
            return None
        gm = params[0].graph.owning_module
        if gm is None or not getattr(gm, OWNED_FLAG, False):
            return None
        found: list[nn.Parameter] = []
        for node in params:
            try:
                value = gm.get_parameter(str(node.target))
            except AttributeError:
                return None
            if not isinstance(value, nn.Parameter) or not value.is_leaf:
                return None
            found.append(value)
        first = found[0]
        if first.requires_grad and len(found) < MIN_TRAINABLE_MEMBERS and self._group_of(first) is None:
            return None  # the gradient hand-off costs more than the group saves (see the constant)
        if len({id(p) for p in found}) != len(found):
            return None  # a repeated parameter: RuntimeStack's broadcast view is already free
        for p in found:
            if p.dtype != first.dtype or p.device != first.device or p.requires_grad != first.requires_grad:
                return None
            if kind.op == "stack" and p.shape != first.shape:
                return None
            if kind.op == "cat" and (p.dim() < 1 or p.shape[1:] != first.shape[1:]):
                return None
            if two_d and p.dim() != 2:
                return None
        placed = [self._group_of(p) for p in found]
        if any(entry is not None for entry in placed) and not self._same_group(found, placed, kind):
            return None
        if not all(map(keeps_strides, found)):
            if ctx is not None:
                ctx.decline(STRIDES_REASON)
            return None
        return found

    @staticmethod
    def _same_group(found: list[nn.Parameter], placed: list[Any], kind: _Kind) -> bool:
        group = placed[0][0] if placed[0] is not None else None
        if group is None or group.kind != kind or len(group.members) != len(found):
            return False
        return all(e is not None and e[0] is group and e[1] == i for i, e in enumerate(placed)) and (
            still_views(group)
        )

    def _stack_of(
        self, params: Sequence[fx.Node], transpose: bool, ctx: RewriteContext | None = None
    ) -> tuple[Sequence[fx.Node], bool] | None:
        """``(parameters, transposed)``: ``stack(params)`` (each transposed when ``transpose``) is
        the plain stack of ``parameters`` (one group's storage), transposed in its last two dims
        when ``transposed``; None when the parameters cannot be laid out."""
        if self._members(params, _STACK, transpose, ctx) is not None:
            return params, transpose
        base = _transposed_params(params)  # stack of W_i.t() = W_i stacked, read the other way
        if base is not None and self._members(base, _STACK, not transpose, ctx) is not None:
            return base, not transpose
        return None

    # -- ParamLayout ---------------------------------------------------------------------------
    def _get(self, params: Sequence[fx.Node], b: Builder, kind: _Kind) -> fx.Node:
        """A ``get_attr`` of the storage of ``params`` (laid out now if they are not yet)."""
        members = self._members(params, kind)
        assert members is not None
        gm = b.ctx.gm
        entry = self._group_of(members[0])
        if entry is not None:
            group = entry[0]
        else:
            group = new_group(members, kind, self.reuse_limit, attached=self.attaches())
        name = next((n for n, p in gm._parameters.items() if p is group.stacked), None)
        if name is None:
            name = free_attr_name(gm, PREFIX)
            gm.register_parameter(name, group.stacked)
            _hide_from_state_dict(gm)
            relayout_contract.bind(gm, name, group, [str(p.target) for p in params], self.reuse_limit)
        with b.graph.inserting_before(b.anchor):
            node = b._add(b.graph.get_attr(name))
        if not group.attached:
            return node
        sizes = [int(p.shape[0]) for p in members] if kind.op == "cat" else None
        return b.call(attach_members, node, sizes, *params)

    def stacked(self, params: Sequence[fx.Node], b: Builder, transpose: bool = False) -> fx.Node:
        found = self._stack_of(params, transpose, b.ctx)
        if found is None:
            return self.fallback.stacked(params, b, transpose)
        base, transposed = found
        node = self._get(base, b, _STACK)
        # [G, N, K] storage read as [G, K, N]: a view, which baddbmm/bmm take without a copy
        return b.method("transpose", node, 1, 2) if transposed else node

    def concatenated(self, params: Sequence[fx.Node], b: Builder) -> fx.Node:
        if self._members(params, _CAT, ctx=b.ctx) is None:
            return self.fallback.concatenated(params, b)
        return self._get(params, b, _CAT)

    def concatenation_is_free(self, weights: Sequence[fx.Node]) -> bool:
        """Whether ``concatenated`` of these weights (and so of their biases, which follow them
        into a group the same way) is a ``get_attr`` (asked by merge_shared_linear's cost)."""
        return self._members(weights, _CAT) is not None

    def launches(self, params: Sequence[fx.Node], transpose: bool = False) -> float:
        found = self._stack_of(params, transpose)
        if found is not None:
            attach = ATTACH_LAUNCHES if self._attached(found[0], _STACK) else 0.0
            return attach + (0.1 if found[1] else 0.0)  # a get_attr, and a transposed view of it
        return self.fallback.launches(params, transpose)

    def bytes_moved(self, params: Sequence[fx.Node], ctx: RewriteContext) -> float:
        # the transposed and plain layouts accept the same parameters (2-D weights checked in
        # launches, which batch_linear always asks with transpose=True)
        if self._stack_of(params, False) is not None:
            return 0.0
        return self.fallback.bytes_moved(params, ctx)

    def _attached(self, params: Sequence[fx.Node], kind: _Kind) -> bool:
        """Whether the graph reads these parameters' storage through ``attach_members``: their
        group's way when they are laid out already, else this layout's."""
        members = self._members(params, kind)
        entry = self._group_of(members[0]) if members else None
        return entry[0].attached if entry is not None else self.attaches()


def _transposed_params(params: Sequence[fx.Node]) -> list[fx.Node] | None:
    """The parameters behind ``[W_1.t(), ...]`` (as ``matmul_as_linear`` writes weights), else None."""
    base = []
    for p in params:
        if p.op != "call_method" or p.target != "t" or len(p.args) != 1 or not isinstance(p.args[0], fx.Node):
            return None
        base.append(p.args[0])
    return base


def retained_gradient_buffers(module: nn.Module) -> list[torch.Tensor]:
    """Gradient buffers re-laid-out groups keep between steps (see the module docstring): memory
    the unfused model would have freed at ``zero_grad(set_to_none=True)``. For memory
    accounting; one tensor per group that currently keeps one."""
    found: list[torch.Tensor] = []
    for p in module.parameters():
        group = getattr(p, STACKED_GROUP_ATTR, None)
        if isinstance(group, _Group) and group.grad_buf is not None:
            found.append(group.grad_buf)
    return found
