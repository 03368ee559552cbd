"""The read-only view of a graph that the semantics helpers need (:class:`GraphView`).

WHY a protocol: the helpers here (view recognizers, observable layouts, freshness) answer
questions about a graph; typing them against the engine's ``RewriteContext`` would tie this
layer to the one above it. The engine's context satisfies this protocol, and so can anything
that indexes a graph the same way (a dry run, a test).
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import fx

from optimus.semantics.graph_index import GraphIndex
from optimus.semantics.meta import TensorMeta
from optimus.semantics.normalize import Canon


class GraphView(Protocol):
    """One graph, indexed: canonical forms, tensor metadata and the topological index."""

    index: GraphIndex

    def canon(self, node: Any) -> Canon | None: ...

    def meta(self, node: Any) -> TensorMeta | None: ...

    def value_meta(self, node: fx.Node) -> Any: ...

    def movable(self, node: fx.Node) -> bool: ...
