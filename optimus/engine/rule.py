"""The rule interface: what a rewrite rule is, and the two base classes most rules use.

A rule finds candidates (``match``) and rewrites one (``apply``). It declines by returning
nothing: ``None`` from a hook, or no candidates. Rules never edit existing nodes: they build new
ones through a :class:`~optimus.engine.builder.Builder` and return what replaces what; the engine rewires
users, keeps ``node.meta`` right, checks the cost, and can undo the rewrite (verify/rollback).

Each candidate (:class:`~optimus.engine.candidate.Candidate`, imported here for rule files) carries
its cost *before* and *after* (:class:`~optimus.cost.price.Cost`: launches, bytes, FLOPs) so the
cost model can rate it; the driver applies the best-rated candidates first and skips any it rates
no faster.

Writing a horizontal rule (independent same-signature nodes -> one batched op) takes two hooks:
``key(node, ctx)`` says which nodes may be batched together (None: not this node), and
``fuse(nodes, b)`` builds the batched form and returns one replacement per member. The engine
groups nodes by key, keeps only groups that can be placed without a cycle (see graph_index),
splits them by the cost model's min/max group size, and does the bookkeeping. Example, complete
(the same file is in docs/optimus.md, "Adding a rule", and tests/foundation/test_howto_rule.py
adds it to a scratch copy of the repository and runs it)::

    import torch

    from optimus.engine.rule import Cost, HorizontalRule

    class BatchExp(HorizontalRule):
        '''exp(x_1) .. exp(x_n) -> unbind(exp(stack(x_i))), when the x_i share shape and dtype.'''
        name = "batch_exp"

        def key(self, node, ctx):
            canon = ctx.canon(node)
            if canon is None or canon.op != "exp" or canon.inplace:
                return None
            meta = ctx.meta(canon["input"])
            return None if meta is None else (meta.shape, meta.dtype, meta.device)

        def fuse(self, nodes, b):
            stacked = b.stack([b.ctx.canon(n)["input"] for n in nodes])
            return b.unbind(b.call(torch.exp, stacked), len(nodes))

        def cost(self, nodes, ctx):
            nbytes = 2 * sum(ctx.meta(n).nbytes for n in nodes)
            return Cost(launches=len(nodes), bytes=nbytes), Cost(launches=2, bytes=2 * nbytes)

as ``optimus/rules/batch/batch_exp.py``, then add two lines to ``optimus/rules/__init__.py``:
``from optimus.rules.batch.batch_exp import BatchExp`` and the entry ``"batch_exp": BatchExp,`` in
``REGISTRY``.

A cleanup rule (dead code, CSE) is a whole-graph pass run each round, ``run(ctx) -> changes``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from torch import fx

from optimus.cost.price import Cost
from optimus.engine.candidate import Candidate

if TYPE_CHECKING:
    from optimus.engine.builder import Builder
    from optimus.engine.context import RewriteContext


@runtime_checkable
class Rule(Protocol):
    """The protocol every rule meets. Most rules subclass one of the bases below instead."""

    name: ClassVar[str]
    kind: ClassVar[str]  # "horizontal" | "cleanup"

    def match(self, ctx: RewriteContext) -> Iterable[Candidate]: ...

    def apply(self, cand: Candidate, b: Builder) -> Sequence[fx.Node] | None: ...


class HorizontalRule:
    """Batch independent nodes with equal ``key`` into one op. Override ``key``, ``fuse``, ``cost``."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "horizontal"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        raise NotImplementedError

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node] | None:
        raise NotImplementedError

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        raise NotImplementedError

    def live(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[float, float]:
        """(before, after) live bytes of fusing ``nodes`` (``optimus.memory.live.horizontal_live``):
        by default the member outputs only; a rule whose fused form copies its inputs into a
        stack, or stacks weights per call, adds those bytes (see batch_linear). The engine asks
        only when ``cost`` left ``live_bytes`` unset."""
        from optimus.memory.live import horizontal_live

        return horizontal_live(nodes, ctx.live)

    def match(self, ctx: RewriteContext) -> Iterable[Candidate]:
        return ctx.horizontal_candidates(self)

    def apply(self, cand: Candidate, b: Builder) -> Sequence[fx.Node] | None:
        built = self.fuse(cand.nodes, b)
        return None if built is None else keep_layouts(cand.nodes, built, b)


def keep_layouts(members: Sequence[fx.Node], built: Sequence[fx.Node], b: Builder) -> list[fx.Node] | None:
    """Each fused result laid out as eager laid out the member it replaces, where a consumer can
    tell (see ``_split_cat_layout.observed_level``): a result whose strides differ from eager's
    contiguous ones gets a ``.contiguous()`` copy; one that would differ from a strided eager
    layout declines the rewrite (None). Rules lay their results out right by construction and
    price the copies they know they need; this is the check that nothing slips through."""
    from optimus.semantics.layouts import compatible, observed_level
    from optimus.semantics.meta import tensor_meta

    out: list[fx.Node] = []
    for member, new in zip(members, built, strict=False):
        level = observed_level(member, b.ctx) if new is not member else 0
        if level:
            eager, got = tensor_meta(member), tensor_meta(new)
            if not compatible(eager, got, level):
                if eager is None or not eager.is_contiguous:
                    return None
                new = b.method("contiguous", new)
        out.append(new)
    out.extend(built[len(members) :])
    return out


class CleanupRule:
    """A whole-graph cleanup run every round (always a win, not cost-checked)."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "cleanup"

    def run(self, ctx: RewriteContext) -> int:
        raise NotImplementedError


__all__ = ["Candidate", "CleanupRule", "Cost", "HorizontalRule", "Rule", "keep_layouts"]
