"""functionalize_inplace: ``y = linear(x); y.relu_()`` -> ``y2 = relu(y)``, when no one but the
in-place op and what runs after it can see ``y``.

WHY: user code writes in-place activations and accumulations everywhere
(``nn.ReLU(inplace=True)`` after ``Linear``/``BatchNorm1d``, ``out = X.new_zeros(...); out += f(X)``).
An in-place write makes its value's whole alias class *ordered* (see :mod:`optimus.semantics.effects`), so
the linear that produced it can no longer be batched or merged: one ``relu_`` pins every MLP
block of a model zoo. When the written value is *fresh* (a new tensor no input, parameter or view
shares) and nothing read it before the write, the write is unobservable: replacing it by the
out-of-place op and pointing every later reader at the new value computes the same values,
dtype, shape, strides, grad mode and gradients. What it does not keep is an error: eager raises in
backward when the op that made ``y`` saved ``y`` for its own backward (``tanh``, ``sigmoid``,
``relu``, ``exp`` ...); such producers are never functionalized, so that error stays.

Declines (counted in the report): the value is read before the write (a reader before it may be a
view, or have saved it for backward), it is not provably fresh, the write is in another grad /
autocast region than the value, or the out-of-place op's meta (dtype after type promotion, shape,
strides) differs from the in-place result's.
"""

from __future__ import annotations

from torch import fx

from optimus.engine.context import RewriteContext
from optimus.engine.rule import CleanupRule
from optimus.semantics.effects import may_alias_output
from optimus.semantics.meta import tensor_meta
from optimus.semantics.normalize import BINARY_POINTWISE, EMIT, UNARY_POINTWISE, VIEW_OPS, Canon, emit_kwargs
from optimus.semantics.op_schema import aten_name, op_facts

# canonical ops whose backward reads their own result: writing that result breaks eager's backward
SAVES_RESULT = frozenset(
    {"tanh", "sigmoid", "exp", "expm1", "relu", "sqrt", "rsqrt", "reciprocal", "pow", "dropout", "softsign"}
)
# non-canonical producers known to return a new tensor whose backward does not read it
FRESH_PRODUCERS = frozenset(
    {
        "batch_norm",
        "instance_norm",
        "group_norm",
        "embedding",
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "conv1d",
        "conv2d",
        "sum",
        "mean",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_empty",
        "zeros_like",
        "ones_like",
        "full_like",
        "empty_like",
        "zeros",
        "ones",
        "full",
        "empty",
    }
)
WRITES = (UNARY_POINTWISE | BINARY_POINTWISE) - {"dropout"}


def _fresh(node: fx.Node, canon: Canon | None) -> bool:
    """``node`` returns a new tensor (no input's memory) and its backward does not read it."""
    if node.op not in ("call_function", "call_method"):
        return False
    if canon is not None:
        return (
            not canon.inplace
            and canon.op not in VIEW_OPS
            and canon.op not in SAVES_RESULT
            and not may_alias_output(node, canon)
        )
    facts = op_facts(node)
    return (
        facts is not None and not facts.may_alias and not facts.random and aten_name(node) in FRESH_PRODUCERS
    )


def _same_meta(a: fx.Node, b: fx.Node) -> bool:
    ma, mb = tensor_meta(a), tensor_meta(b)
    return ma is not None and mb is not None and ma.stride is not None and ma == mb


class FunctionalizeInplace(CleanupRule):
    name = "functionalize_inplace"

    def run(self, ctx: RewriteContext) -> int:
        graph = ctx.graph
        pos = {n: i for i, n in enumerate(graph.nodes)}
        region = {n: ctx.index.regions.of(n) for n in pos}  # new nodes: the region of what they replace
        changed = 0
        for node in list(graph.nodes):
            canon = ctx.canon(node)
            if canon is None or not canon.inplace or canon.op not in WRITES:
                continue
            value = canon["input"]
            if not isinstance(value, fx.Node) or value.op in ("placeholder", "get_attr"):
                continue  # a write into the caller's tensor or a buffer: a real effect
            if not _fresh(value, ctx.canon(value)):
                ctx.decline("functionalize_inplace: written value not provably fresh")
                continue
            if any(pos.get(u, -1) < pos[node] for u in value.users if u is not node):
                ctx.decline("functionalize_inplace: value read before the write")
                continue
            if region.get(value) != region.get(node):
                ctx.decline("functionalize_inplace: write in another grad/autocast region")
                continue
            kwargs = dict(canon.kwargs)
            if "inplace" in kwargs:
                kwargs["inplace"] = False
            args, kw = emit_kwargs(canon.op, kwargs)
            with graph.inserting_before(node):
                new = graph.call_function(EMIT[canon.op], args, kw)
            if not _same_meta(new, node):
                graph.erase_node(new)
                ctx.decline("functionalize_inplace: out-of-place result has another dtype or layout")
                continue
            new.meta.update(node.meta)  # the same tensor as the write's result: its captured
            # example value carries requires_grad, which the batching rules group by
            later = [u for u in value.users if u is not node and u is not new]
            for user in later:
                user.replace_input_with(value, new)
            readers = [*later, *node.users]
            node.replace_all_uses_with(new)
            ctx.forget_canon(readers)  # their canonical forms named the value or the write
            graph.erase_node(node)
            pos[new], region[new] = pos.pop(node), region.pop(node)
            changed += 1
        return changed


__all__ = ["FRESH_PRODUCERS", "SAVES_RESULT", "FunctionalizeInplace"]
