"""Copies of a graph that keep its codegen (pytree in/out specs).

WHY: every rewrite that may be undone (the driver's rollbacks, verification, the chunked
post-pass) takes a copy first, and a copy without the codegen would change the calling
convention of the GraphModule it is restored into.
"""

from __future__ import annotations

import copy

from torch import fx


def copy_graph(graph: fx.Graph) -> fx.Graph:
    """A copy of a graph (nodes and meta), keeping its codegen (pytree in/out specs)."""
    new = fx.Graph(owning_module=graph.owning_module)
    out = new.graph_copy(graph, {})
    new.output(out)
    new._codegen = copy.deepcopy(graph._codegen)
    return new


def copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule with a copy of the graph, sharing parameters and submodules."""
    return fx.GraphModule(gm, copy_graph(gm.graph))
