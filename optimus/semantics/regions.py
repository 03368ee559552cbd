"""Regions: the grad mode / autocast / context-manager state each node runs under.

WHY: Dynamo records ``with torch.no_grad():``, ``torch.set_grad_enabled``, ``torch.autocast``
and ``torch.inference_mode`` as state-changing call nodes (``torch._C._set_grad_enabled(False)``,
``_enter_autocast(...)`` / ``_exit_autocast(...)``, ``_enter_inference_mode`` /
``_exit_inference_mode``), not as structure. The same ``linear`` computes a value without a
gradient under ``no_grad`` and a bfloat16 value under ``autocast``. So two ops may be computed
together only if they run under the same state, and a computation may not move across a
state change.

We cut the graph (in node order) into *segments* at every context node: a known one (above) or
any call that looks like a context manager's enter/exit/set (an unknown one: we cannot say what
it changes, so it is a boundary all the same and the report says so). Rules:

* horizontal groups take members from one segment only (the segment is part of the group key);
* every node of a rewrite (members, consumed nodes) lies in one segment, the rewrite runs there,
  and it reads only values that segment's computation of those nodes already read (it may not
  look *through* a node of another segment, e.g. ``cat`` of ``split`` pieces computed under
  ``no_grad`` must not become the ``split``'s input, which requires grad);
* an existing node that replaces another must lie in the same segment;
* context nodes are ordered (:mod:`optimus.semantics.effects`) and act as barriers in the depth labels and
  in the topological sort: every node of a segment stays between the segment's boundaries.

Placeholders and ``get_attr`` nodes belong to no segment (their values do not depend on the
state); as replacements they count as segment 0, the state the graph is entered with.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx

_KNOWN: dict[Any, str] = {
    torch._C._set_grad_enabled: "grad",
    torch.amp.autocast_mode._enter_autocast: "autocast",
    torch.amp.autocast_mode._exit_autocast: "autocast",
    torch.autograd.grad_mode._enter_inference_mode: "inference_mode",
    torch.autograd.grad_mode._exit_inference_mode: "inference_mode",
}
# names of calls that enter, leave or set some mode (unknown ones are boundaries too)
_CONTEXT_NAME = re.compile(
    r"^_?(enter|exit|set|push|pop)_|_(enter|exit)(_new)?$|(increment|decrement)_nesting|_record_function_"
    r"|^_sdpa_kernel|^_saved_tensors_hooks_(disable|enable)$"
)


def context_kind(node: fx.Node) -> str | None:
    """ "grad" / "autocast" / "inference_mode" for a known context node, "unknown" for a call that
    looks like a context manager's enter/exit/set, None for an ordinary node."""
    if node.op != "call_function":
        return None
    try:
        known = _KNOWN.get(node.target)
    except TypeError:
        known = None
    if known is not None:
        return known
    target = node.target
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        name = str(target).split("::")[-1].split(".")[0]
        module = "torch"
    else:
        name = getattr(target, "__name__", "")
        module = getattr(target, "__module__", None) or ""
    if not isinstance(name, str) or not (module.startswith("torch") or module == ""):
        return None
    return "unknown" if _CONTEXT_NAME.search(name) else None


def describe(node: fx.Node) -> str:
    """One line naming a context node (for reports)."""
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    args = ", ".join(str(a) for a in node.args if not isinstance(a, fx.Node))
    return f"{name}({args})"


def is_free(node: fx.Node) -> bool:
    """Placeholders, get_attr and output belong to no segment."""
    return node.op in ("placeholder", "get_attr", "output")


def segments(nodes: Iterable[fx.Node]) -> tuple[dict[fx.Node, int], list[fx.Node]]:
    """Segment number of every non-free node, in node order, and the context nodes (boundaries).
    A context node gets a segment of its own; the nodes after it the next one."""
    seg: dict[fx.Node, int] = {}
    boundaries: list[fx.Node] = []
    current = 0
    for node in nodes:
        if is_free(node):
            continue
        if context_kind(node) is not None:
            boundaries.append(node)
            seg[node] = current + 1
            current += 2
            continue
        seg[node] = current
    return seg, boundaries


class Regions:
    """Segments of one graph as indexed (built once per driver round, with the GraphIndex)."""

    def __init__(self, nodes: Sequence[fx.Node]) -> None:
        self.segment, self.boundaries = segments(nodes)
        self.boundaries_set = set(self.boundaries)
        self.indexed = set(nodes)
        self.unknown = [b for b in self.boundaries if context_kind(b) == "unknown"]
        self._disabled: set[int] | None = None  # segments run with grad mode off (made on demand)
        self._inference: set[int] | None = None  # segments inside inference_mode (made on demand)

    def grad_disabled(self, node: fx.Node) -> bool:
        """Whether ``node`` runs with grad mode known to be off (after a ``_set_grad_enabled(False)``
        or inside ``inference_mode``): its result then never requires grad, recorded or not.

        WHY: nodes a rule created carry no example value, so their ``requires_grad`` is unknown
        (:func:`optimus.semantics.meta.output_requires_grad` is None) and was taken as True; a batched
        pooling under ``no_grad`` then made the experts it reads look reached by a gradient, and
        their linears were batched with towers the loss reaches: the experts' parameters got zero
        gradients where eager leaves ``.grad`` None (fuzz seed 46)."""
        seg = self.segment.get(node)
        return seg is not None and seg in self._disabled_segments()

    def _disabled_segments(self) -> set[int]:
        if self._disabled is not None:
            return self._disabled
        disabled: set[int] = set()
        mode: bool | None = None  # the mode the graph is entered with: not known here
        saved: list[bool | None] = []
        for b in self.boundaries:
            kind = context_kind(b)
            if kind == "grad":
                arg = b.args[0] if b.args else None
                mode = arg if isinstance(arg, bool) else None
            elif kind == "inference_mode":
                if b.target is torch.autograd.grad_mode._enter_inference_mode:
                    saved.append(mode)
                    arg = b.args[0] if b.args else True
                    mode = False if arg is True else (mode if arg is False else None)
                else:
                    mode = saved.pop() if saved else None
            elif kind == "unknown":
                mode = None
            if mode is False:
                disabled.add(self.segment[b] + 1)  # the nodes after this boundary
        self._disabled = disabled
        return disabled

    def in_inference_mode(self, node: fx.Node) -> bool:
        """Whether ``node`` runs inside ``torch.inference_mode()``: its result is an inference
        tensor, and so is every view of it, wherever the view is taken. A copy made outside (eager's
        ``cat`` of such values) is a normal tensor that autograd may save; a view is not."""
        seg = self.segment.get(node)
        return seg is not None and seg in self._inference_segments()

    def _inference_segments(self) -> set[int]:
        if self._inference is not None:
            return self._inference
        inside: set[int] = set()
        depth: list[bool] = []
        for b in self.boundaries:
            if b.target is torch.autograd.grad_mode._enter_inference_mode:
                arg = b.args[0] if b.args else True
                depth.append(arg is not False)
            elif b.target is torch.autograd.grad_mode._exit_inference_mode and depth:
                depth.pop()
            if depth and depth[-1]:
                inside.add(self.segment[b] + 1)
        self._inference = inside
        return inside

    @property
    def trivial(self) -> bool:
        """No context node: every rewrite is within one region."""
        return not self.boundaries

    def of(self, node: fx.Node) -> int | None:
        """Segment of a node (None: free, or created after indexing)."""
        return self.segment.get(node)

    def as_replacement(self, node: fx.Node) -> int | None:
        return 0 if is_free(node) else self.segment.get(node)

    def one_segment(self, nodes: Iterable[fx.Node]) -> int | bool | None:
        """The segment all (non-free) nodes share; False if they span several."""
        found: set[int] = {s for n in nodes if (s := self.segment.get(n)) is not None}
        if len(found) > 1:
            return False
        return next(iter(found), None)

    def readable(self, cand_nodes: Sequence[fx.Node], seg: int) -> set[fx.Node]:
        """Values a rewrite of ``cand_nodes`` (all in segment ``seg``) may read: the nodes of the
        segment that the candidates' computation goes through, and what those read."""
        allowed: set[fx.Node] = set()
        stack = list(cand_nodes)
        seen: set[fx.Node] = set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            allowed.add(node)
            for inp in node.all_input_nodes:
                allowed.add(inp)
                if self.segment.get(inp) == seg:
                    stack.append(inp)
        return allowed
