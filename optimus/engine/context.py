"""RewriteContext: what rules see during one driver round, and the engine's shared machinery
(grouping candidates, placing them, committing and undoing rewrites).

WHY here and not in each rule: grouping independent nodes, choosing where a fused computation may
sit without creating a cycle, rewiring users and undoing a rewrite are the same for every rule.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.candidate import Candidate
from optimus.engine.param_layout import ParamLayout, RuntimeStack
from optimus.memory.live import LiveEstimate, estimate, scheduled_peak
from optimus.semantics.effects import mutated_args
from optimus.semantics.graph_index import GraphIndex, group_by_key, stab_groups
from optimus.semantics.meta import TensorMeta, output_requires_grad, tensor_meta, value_meta
from optimus.semantics.normalize import Canon, canonicalize
from optimus.semantics.regions import context_kind

if TYPE_CHECKING:
    from optimus.cost.analytic import CostModel
    from optimus.engine.rule import HorizontalRule


@dataclass
class Applied:
    """A committed rewrite, enough to undo it."""

    cand: Candidate
    created: list[fx.Node]
    rewired: list[tuple[fx.Node, fx.Node, fx.Node]]  # (user, old, new)


class RewriteContext:
    def __init__(self, gm: fx.GraphModule, cost_model: CostModel, layout: ParamLayout | None = None) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.cost_model = cost_model
        self.layout: ParamLayout = layout or RuntimeStack()
        self.modules = dict(gm.named_modules()) if gm is not None else {}
        self.index = GraphIndex(self.graph, self.modules)
        self._canon: dict[fx.Node, Canon | None] = dict(self.index.canons)
        self.leftovers: list[fx.Node] = []
        self.declines: dict[str, int] = {}  # reason -> count: rewrites refused for safety
        self._live: LiveEstimate | None = None
        self._grad_reaching: set[fx.Node] | None = None
        self._grad_cut: set[fx.Node] = set()  # values this round's rewrites left no gradient path

    @property
    def live(self) -> LiveEstimate:
        """Live bytes of the graph as this round found it (``optimus.memory.live``), computed once."""
        if self._live is None:
            self._live = estimate(self.index.nodes, self.index.canons, self.inductor)
        return self._live

    @property
    def scheduled_peak(self) -> float:
        """The live peak in the order the graph's runtime would run it (``live.scheduled_peak``:
        Inductor reorders for peak memory; eager keeps the graph's order)."""
        return scheduled_peak(self.index.nodes, self.index.canons, self.inductor)

    def decline(self, reason: str) -> None:
        """Count a rewrite the engine refused (``report.declined_reasons``)."""
        self.declines[reason] = self.declines.get(reason, 0) + 1

    def region_name(self, nodes: Iterable[fx.Node]) -> str:
        """Kind of the boundaries between the given nodes' segments, for a decline reason."""
        regions = self.index.regions
        segs = sorted({s for n in nodes if (s := regions.as_replacement(n)) is not None})
        kinds = sorted(
            {
                context_kind(b) or "unknown"
                for b in regions.boundaries
                if segs and segs[0] < regions.segment[b] < segs[-1]
            }
        )
        return "/".join(kinds) or "context"

    # -- what rules read ---------------------------------------------------------------------
    @property
    def inductor(self) -> bool:
        """Whether Inductor compiles the result (the cost model says so; see ``optimus.cost.analytic``):
        rules price its fusions, and the live estimate models where it places buffers."""
        return getattr(self.cost_model, "inductor", False) is True

    def canon(self, node: Any) -> Canon | None:
        if not isinstance(node, fx.Node):
            return None
        if node not in self._canon:
            self._canon[node] = canonicalize(node, self.modules)
        return self._canon[node]

    def forget_canon(self, nodes: Iterable[fx.Node]) -> None:
        """Drop the cached canonical forms of ``nodes`` (their inputs were rewired)."""
        for node in nodes:
            self._canon.pop(node, None)

    def must_canon(self, node: Any) -> Canon:
        """The canonical form of a node a rule's ``key`` accepted (so it has one)."""
        canon = self.canon(node)
        if canon is None:
            raise ValueError(f"{node} has no canonical form")
        return canon

    def meta(self, node: Any) -> TensorMeta | None:
        return tensor_meta(node) if isinstance(node, fx.Node) else None

    def value_meta(self, node: fx.Node) -> Any:
        return value_meta(node)

    def movable(self, node: fx.Node) -> bool:
        return node not in self.index.pos or self.index.movable(node)

    def stack_bytes(self, values: Sequence[Any]) -> float:
        """Bytes ``Builder.stack(values)`` moves: 0 if it can reuse an unbound tensor."""
        probe = Builder.__new__(Builder)
        probe.ctx = self
        if all(isinstance(v, fx.Node) for v in values) and (
            probe.unstacked_source(values) is not None or probe.split_source(values) is not None
        ):
            return 0.0
        return float(sum(2 * m.nbytes for m in (self.meta(v) for v in values) if m is not None))

    def device_of(self, nodes: Iterable[fx.Node]) -> torch.device:
        for node in nodes:
            meta = self.meta(node)
            if meta is not None:
                return meta.device
        return torch.device("cpu")

    # -- candidate finding (shared by all rules of a kind) -------------------------------------------
    def _interval(self, node: fx.Node) -> tuple[float, float, float]:
        return self.index.input_label(node), self.index.depth[node], self.index.user_label(node)

    def horizontal_candidates(self, rule: HorizontalRule) -> list[Candidate]:
        def key(node: fx.Node) -> Hashable | None:
            if node.op not in ("call_function", "call_method", "call_module") or not self.movable(node):
                return None
            if not node.users:  # a value nobody reads: batching it only adds work to the group
                return None
            return rule.key(node, self)

        out: list[Candidate] = []
        buckets = group_by_key(self.index.nodes, key)
        regions = self.index.regions
        if not regions.trivial:  # never group across a grad-mode / autocast / context boundary
            split: dict[Hashable, list[fx.Node]] = {}
            for k, members in buckets.items():
                for node in members:
                    split.setdefault((regions.of(node), k), []).append(node)
                if len({regions.of(n) for n in members}) > 1:
                    self.decline(f"{rule.name}: grouping across {self.region_name(members)} region")
            buckets = split
        buckets = self._split_by_requires_grad(rule.name, buckets)
        for members in buckets.values():
            if len(members) < self.cost_model.min_group:
                continue
            for label, group in stab_groups(
                members, self._interval, self.cost_model.min_group, self.cost_model.max_group
            ):
                before, after = rule.cost(group, self)
                live = getattr(rule, "live", None)
                if live is not None and not (before.live_bytes or after.live_bytes):
                    held, holds = live(group, self)
                    before, after = replace(before, live_bytes=held), replace(after, live_bytes=holds)
                out.append(Candidate(rule.name, tuple(group), before, after, label=label))
        return out

    def _split_by_requires_grad(
        self, rule_name: str, buckets: dict[Hashable, list[fx.Node]]
    ) -> dict[Hashable, list[fx.Node]]:
        """Members whose eager outputs differ in ``requires_grad`` are never batched: one stacked
        result would require grad for all of them, and a caller sees the flag (``.numpy()`` raises,
        ``.grad_fn`` is set). Unknown flags group only with unknown ones.

        Nor are members a gradient can reach (:attr:`grad_reaching`) batched with members that
        require grad but that no gradient reaches (read only under ``no_grad`` or through
        ``.detach()``): in eager the latter's parameters and inputs keep ``.grad`` None, while the
        backward of one stacked or concatenated weight or input hands them zeros."""
        out: dict[Hashable, list[fx.Node]] = {}
        reaching = self.grad_reaching
        for k, members in buckets.items():
            flags = [output_requires_grad(n) for n in members]
            if len(set(flags)) > 1:
                self.decline(f"{rule_name}: grouping values with and without requires_grad")
            reached = [flag is not False and n in reaching for n, flag in zip(members, flags, strict=True)]
            if len(set(flags)) == 1 and len(set(reached)) > 1:
                self.decline(f"{rule_name}: grouping values a gradient reaches with values it does not")
            for node, flag, hit in zip(members, flags, reached, strict=True):
                out.setdefault((flag, hit, k), []).append(node)
        return out

    @property
    def grad_reaching(self) -> set[fx.Node]:
        """Nodes a gradient from what the caller sees can reach: those read by the graph's output
        or by an op that writes in place (the written value may be read later), or by a node in
        this set whose output requires grad (or is not known to be a single tensor) and that does
        not run with grad mode off (:meth:`Regions.grad_disabled`: a node a rule made records no
        flag). A value whose every reader records no autograd (runs under ``no_grad``,
        ``.detach()``) is not in it.
        Computed once per round, walking the graph backwards."""
        if self._grad_reaching is None:
            reaching: set[fx.Node] = set()
            for node in reversed(self.index.nodes):
                for user in node.users:
                    if (
                        user.op == "output"
                        or (
                            user in reaching
                            and output_requires_grad(user) is not False
                            and not self.index.regions.grad_disabled(user)
                        )
                        or mutated_args(user, self.index.canons.get(user))
                    ):
                        reaching.add(node)
                        break
            self._grad_reaching = reaching
        return self._grad_reaching

    # -- committing / undoing ------------------------------------------------------------------------
    def _label(self, node: fx.Node) -> float:
        return self.index.depth.get(node, 0.0)

    def placeable(self, cand: Candidate, horizontal: bool) -> bool:
        """Re-check, against the graph as it is now, that the rewrite can sit at ``cand.label``:
        every member (horizontal) or the anchor (local) strictly between its inputs and users,
        and all nodes of the rewrite in one region (see :mod:`optimus.semantics.regions`)."""
        if self.index.regions.one_segment(cand.nodes) is False:
            self.decline(f"{cand.rule}: rewrite across {self.region_name(cand.nodes)} region")
            return False
        for node in cand.nodes if horizontal else cand.nodes[:1]:
            if getattr(node, "_erased", False) or not self.movable(node):
                return False
            lo = max((self._label(i) for i in node.all_input_nodes), default=-1.0)
            hi = min((self._label(u) for u in node.users), default=math.inf)
            if not lo < cand.label < hi and not (not horizontal and lo < cand.label):
                return False
        return True

    def commit(self, cand: Candidate, replacements: Sequence[fx.Node], b: Builder) -> Applied | None:
        """Rewire users of each replaced node to its replacement. Refuses (and returns None) if the
        replacement would break the labelling, i.e. could create a cycle."""
        created = set(b.created)
        label = cand.label
        self.index.set_label(b.created, label)
        for node in b.created:
            for inp in node.all_input_nodes:
                if inp not in created and self._label(inp) >= label:
                    return None
        for old, new in zip(cand.nodes, replacements, strict=False):
            if new is old:
                continue
            if new not in created and self._label(new) >= min(
                (self._label(u) for u in old.users), default=math.inf
            ):
                return None
        if (
            not self._stays_in_region(cand, replacements, created)
            or not self._keeps_requires_grad(cand, replacements, created)
            or not self._keeps_gradient_paths(cand, replacements, created)
        ):
            return None
        rewired: list[tuple[fx.Node, fx.Node, fx.Node]] = []
        for old, new in zip(cand.nodes, replacements, strict=False):
            if new is old:
                continue
            for user in list(old.users):
                if user in created:
                    continue
                user.replace_input_with(old, new)
                self._canon.pop(user, None)
                rewired.append((user, old, new))
            self.leftovers.append(old)
        return Applied(cand, list(b.created), rewired)

    def _stays_in_region(
        self, cand: Candidate, replacements: Sequence[fx.Node], created: set[fx.Node]
    ) -> bool:
        """The rewrite computes in its candidates' region from values that region's computation
        of them already read, and replaces a node only by one of the same region."""
        regions = self.index.regions
        if regions.trivial:
            return True
        seg = regions.one_segment(cand.nodes)
        if seg is False or seg is None:
            return seg is None
        allowed = regions.readable(cand.nodes, seg)
        inference_here = any(regions.in_inference_mode(n) for n in cand.nodes)
        for node in created:
            for inp in node.all_input_nodes:
                if not inference_here and inp not in created and regions.in_inference_mode(inp):
                    # a view of an inference tensor stays one outside inference mode, where the
                    # copy it replaces (eager's cat) was a normal tensor autograd may save
                    self.decline(f"{cand.rule}: reads an inference-mode value outside inference mode")
                    return False
                if inp in created or inp in allowed or regions.of(inp) == seg:
                    continue
                if inp.op == "get_attr" and inp not in regions.indexed:
                    continue  # a parameter view the engine made this round
                self.decline(f"{cand.rule}: reads through a {self.region_name([inp, *cand.nodes])} region")
                return False
        for old, new in zip(cand.nodes, replacements, strict=False):
            if new is old or new in created:
                continue
            if new in regions.indexed and regions.as_replacement(new) != regions.as_replacement(old):
                self.decline(f"{cand.rule}: replacement from another {self.region_name([new, old])} region")
                return False
        return True

    def _keeps_requires_grad(
        self, cand: Candidate, replacements: Sequence[fx.Node], created: set[fx.Node]
    ) -> bool:
        """An existing value replaces another only if both required grad alike at capture
        (``cat(split(h.contiguous()))`` under ``no_grad`` does not require grad; ``h`` does)."""
        for old, new in zip(cand.nodes, replacements, strict=False):
            if new is old or new in created:
                continue
            a, b = output_requires_grad(old), output_requires_grad(new)
            if a is not None and b is not None and a != b:
                self.decline(f"{cand.rule}: replacement with a different requires_grad")
                return False
        return True

    def _keeps_gradient_paths(
        self, cand: Candidate, replacements: Sequence[fx.Node], created: set[fx.Node]
    ) -> bool:
        """No value that may require grad loses its last gradient path to the output.

        WHY: a rewrite keeps values, so the gradient it removes is always zero, but a zero
        gradient is not None. ``cat(a, b)[:, :D] -> a`` leaves ``b`` unused: in eager the
        parameters behind ``b`` receive zeros from the cat's backward, after the rewrite they
        keep ``.grad`` None, and optimizers skip None (AdamW's weight decay and momentum would
        stop moving them). Any rule can do this (every rewire goes through here; DCE and CSE
        only drop unused values or merge equal ones, which cuts no path). We walk back from the
        replaced nodes through every value whose last gradient-carrying reader goes away; a
        parameter, a float graph input or a requires-grad value so reached is declined. A value
        that still has another reader a gradient reaches, or that no gradient reached before
        (read under ``no_grad``, a buffer, an integer), does not stop the rewrite."""
        moved = {old for old, new in zip(cand.nodes, replacements, strict=False) if new is not old}
        if not moved:
            return True
        takers = {new for old, new in zip(cand.nodes, replacements, strict=False) if new is not old}
        # a rewrite reading re-laid-out storage (``RelayoutParams``) reads its members' parameters
        # through it: the originals are views whose gradients the layout fills
        # (a chain on trial reads them through stand-ins: it is applied again with the real layout)
        layout_reads = getattr(self.layout, "stands_in", False) or any(n.op == "get_attr" for n in created)
        reaching, regions = self.grad_reaching, self.index.regions
        indexed = regions.indexed

        def carries(user: fx.Node) -> bool:
            """Did a gradient flow from ``user`` to its inputs (before this rewrite)?"""
            if user.op == "output" or mutated_args(user, self._canon.get(user)):
                return True
            if user not in indexed:  # made this round: no recorded flag, assume it does
                return True
            return (
                user in reaching
                and output_requires_grad(user) is not False
                and not regions.grad_disabled(user)
            )

        cut: set[fx.Node] = set()
        stack = [old for old in moved if not any(u in created for u in old.users) and carries(old)]
        while stack:
            node = stack.pop()
            if node in cut:
                continue
            cut.add(node)
            module = self.modules.get(str(node.target)) if node.op == "call_module" else None
            if module is not None and any(p.requires_grad for p in module.parameters()):
                self.decline(
                    f"{cand.rule}: would cut the parameters of {node.target!s} off from the gradient "
                    "(eager gives them zero gradients, the rewrite None)"
                )
                return False
            for inp in node.all_input_nodes:
                if inp in cut or inp in created or inp in takers:
                    continue  # a replacement takes over the replaced node's readers
                if any(
                    u not in cut and u not in self._grad_cut and u not in moved and carries(u)
                    for u in inp.users
                ):
                    continue  # still read on a gradient path
                if inp.op == "get_attr" and (layout_reads or self._attr_still_read(inp, cut, moved)):
                    continue  # read elsewhere, or through the layout's stacked storage
                if self._may_want_grad(inp):
                    if inp.op in ("placeholder", "get_attr"):
                        self.decline(
                            f"{cand.rule}: would cut {inp.op} {inp.target!s} off from the gradient "
                            "(eager gives it a zero gradient, the rewrite None)"
                        )
                        return False
                    stack.append(inp)
        self._grad_cut |= cut
        return True

    def _attr_still_read(self, node: fx.Node, cut: set[fx.Node], moved: set[fx.Node]) -> bool:
        """Another ``get_attr`` of the same parameter still has a reader (a traced graph reads a
        shared weight once per call; the rewrite may keep one of the reads)."""
        for other in self.graph.find_nodes(op="get_attr", target=node.target):
            if other is not node and any(
                u not in cut and u not in self._grad_cut and u not in moved for u in other.users
            ):
                return True
        return False

    def _may_want_grad(self, node: fx.Node) -> bool:
        """Whether ``node``'s value may require grad: a parameter, a floating-point graph input
        (the caller may pass one that requires grad), or a value recorded as requiring it."""
        if node.op == "get_attr":
            value = _fetch(self.gm, str(node.target))
            return isinstance(value, torch.Tensor) and value.requires_grad
        if node.op == "placeholder":
            meta = self.meta(node)
            return meta is None or meta.dtype.is_floating_point or meta.dtype.is_complex
        return output_requires_grad(node) is not False and not self.index.regions.grad_disabled(node)

    def undo(self, applied: Applied) -> None:
        for user, old, new in reversed(applied.rewired):
            user.replace_input_with(new, old)
            self._canon.pop(user, None)
        self.discard(applied.created)

    def discard(self, created: Sequence[fx.Node]) -> None:
        for node in reversed(created):
            if not node.users:
                self.graph.erase_node(node)

    def erase_leftovers(self) -> None:
        """Erase replaced nodes (and what only they read) once nothing uses them."""
        stack = list(self.leftovers)
        self.leftovers = []
        while stack:
            node = stack.pop()
            if getattr(node, "_erased", False) or node.users or node.op in ("placeholder", "output"):
                continue
            if node in self.index.ordered and node not in self.index.private:
                continue  # an effect stays; a private state update was computed by its replacement
            inputs = node.all_input_nodes
            try:
                self.graph.erase_node(node)
            except Exception:
                continue
            stack.extend(i for i in inputs if i.op not in ("placeholder", "get_attr"))


def _fetch(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value
