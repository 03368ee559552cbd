"""What split/cat/stack/unbind and the views that replace them cost, in the cost model's units.

WHY separate numbers: the analytic model prices a "launch" (~8 us of CPU dispatch) and bytes;
view ops and per-input cat overhead are much cheaper than a kernel launch, and pricing them as
full launches would make every rewrite that trades a copy for a view look like a loss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import fx

from optimus.engine.rule import Cost

if TYPE_CHECKING:
    from optimus.engine.context import RewriteContext

# In the cost model's unit (one kernel launch ~ 8 us of CPU dispatch), measured on this
# project's CPU with torch 2.13 eager by scripts/measure_split_cat_costs.py (since deleted; see
# docs/perf.md, "Deleted scripts"): a view op (split, unbind, narrow) costs ~1.6 us -> 0.2
# launch; torch.cat costs ~2.7 us for two inputs plus ~0.3 us per further input -> 0.04 launch
# per input. Getitems on a tuple are free.
VIEW_LAUNCHES = 0.2
CAT_INPUT_LAUNCHES = 0.04
VIEW = Cost(launches=VIEW_LAUNCHES)


def scaled(cost: Cost, factor: float) -> Cost:
    """A share of a cost (a rewrite that is one of several which together remove a node)."""
    return Cost(cost.launches * factor, cost.bytes * factor, cost.flops * factor)


def views(n: int) -> Cost:
    return Cost(launches=VIEW_LAUNCHES * n)


def copy_cost(node: fx.Node, ctx: RewriteContext, inputs: int | None = None) -> Cost:
    """cat / stack with ``inputs`` inputs (default: as the node has): one launch plus a little per
    input; reads and writes the output once."""
    if inputs is None:
        listed = node.args[0] if node.args else node.kwargs.get("tensors")
        inputs = len(listed) if isinstance(listed, (list, tuple)) else 1
    meta = ctx.meta(node)
    return Cost(launches=1.0 + CAT_INPUT_LAUNCHES * inputs, bytes=0.0 if meta is None else 2.0 * meta.nbytes)
