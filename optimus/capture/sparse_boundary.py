"""Keep a torchrec ``EmbeddingBagCollection`` outside the captured graph, so that a model called
with a ``KeyedJaggedTensor`` is still captured as one whole graph.

WHY: torchrec's own models (DLRM, DLRM_DCN, DLRM_Projection, SimpleDeepFMNN, ...) take
``forward(dense, kjt)``. Exporting them fails: the lookup fills the KJT's lazy caches (a Python
side effect on an input, which a graph would drop), so they took the per-call Dynamo path, where
the parameter re-layout does nothing and every batch with another number of ids recompiled.
The jagged part is the lookup's business, not the rules': the rules rewrite what the pooled
embeddings feed. So the lookup stays eager, outside the graph, and the graph's input is its
pooled output, whose shape ``[B, sum of dims]`` is the same for every batch of B samples:

    outer(dense, kjt) = inner(dense, ebc(kjt).values())

``inner`` is the model exported with the collection swapped for :class:`PooledStub`, which
rebuilds the ``KeyedTensor`` (same keys, lengths per key and key dim) from the pooled tensor.
At the KJT's argument position the model receives a :class:`PooledFeatures`, a type with none
of the KJT's methods, so a model that reads the KJT anywhere but through the collection fails
to export and takes the usual fallback (it is never handed a stand-in that answers like a KJT).

Applies only when it is unambiguous: exactly one ``KeyedJaggedTensor`` among the positional
inputs, exactly one unsharded ``EmbeddingBagCollection`` in the module, and its output on the
example is a ``KeyedTensor``. torchrec is never imported here (classes are recognised by name).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

KJT_NAME = "KeyedJaggedTensor"
EBC_NAME = "EmbeddingBagCollection"


@dataclass
class PooledFeatures:
    """What the model receives in place of its ``KeyedJaggedTensor`` inside the captured graph."""

    pooled: torch.Tensor


class PooledStub(nn.Module):
    """Stands in for the collection while the model is captured: the same ``KeyedTensor`` as the
    collection returned on the example, with the pooled values taken from the graph's input."""

    def __init__(self, keys: list[str], length_per_key: list[int], key_dim: int) -> None:
        super().__init__()
        self.keys_, self.length_per_key, self.key_dim = list(keys), list(length_per_key), key_dim

    def forward(self, features: PooledFeatures) -> Any:
        from torchrec.sparse.jagged_tensor import KeyedTensor

        return KeyedTensor(
            keys=self.keys_, length_per_key=self.length_per_key, values=features.pooled, key_dim=self.key_dim
        )


@dataclass
class Boundary:
    """Where the lookup sits: the KJT's argument position and the collection's parent attribute."""

    index: int
    parent: nn.Module
    attr: str
    ebc: nn.Module
    path: str

    @contextlib.contextmanager
    def stubbed(self, stub: PooledStub) -> Iterator[None]:
        """The collection swapped for ``stub`` inside the block; what was there is put back
        however it ends (the module the user holds now, which after a replacement is not the
        collection ``optimize`` found: a re-capture must never undo the user's change)."""
        found = getattr(self.parent, self.attr)
        setattr(self.parent, self.attr, stub)
        try:
            yield
        finally:
            setattr(self.parent, self.attr, found)


class DenseOf(nn.Module):
    """The model with its ``index``-th argument taken as the pooled embeddings: what is exported.

    Called eagerly (the guards' fallback), it swaps the stub in around the call itself; while
    Dynamo traces it, the capture code has swapped it in (a swap inside the trace would be a side
    effect). Its ``training`` is the model's (the guards read the root's flag)."""

    def __init__(self, module: nn.Module, boundary: Boundary, stub: PooledStub) -> None:
        super().__init__()
        self.module = module
        self.__dict__["boundary"] = boundary  # not a submodule: the collection is the model's
        self.__dict__["stub"] = stub

    @property  # type: ignore[override]
    def training(self) -> bool:
        modules = self.__dict__.get("_modules", {})
        return bool(modules["module"].training) if "module" in modules else True

    @training.setter
    def training(self, mode: bool) -> None:
        modules = self.__dict__.get("_modules", {})
        if "module" in modules:
            modules["module"].training = mode

    def forward(self, *args: Any) -> Any:
        i = self.__dict__["boundary"].index
        call = (*args[:i], PooledFeatures(args[i]), *args[i + 1 :])
        if torch.compiler.is_compiling():
            return self.module(*call)
        with self.__dict__["boundary"].stubbed(self.__dict__["stub"]):
            return self.module(*call)


def _named(obj: Any, name: str) -> bool:
    return any(k.__name__ == name for k in type(obj).__mro__)


def find(module: nn.Module, inputs: tuple[Any, ...]) -> Boundary | None:
    """The boundary, when the module and inputs have the one unambiguous form (see module doc)."""
    kjts = [i for i, v in enumerate(inputs) if _named(v, KJT_NAME)]
    ebcs: list[tuple[str, nn.Module]] = [
        (name, m) for name, m in module.named_modules() if _named(m, EBC_NAME) and name
    ]
    if len(kjts) != 1 or len(ebcs) != 1:
        return None
    path, ebc = ebcs[0]
    parent_path, _, attr = path.rpartition(".")
    parent = module.get_submodule(parent_path) if parent_path else module
    if getattr(parent, attr, None) is not ebc:
        return None
    return Boundary(kjts[0], parent, attr, ebc, path)


def pooled_example(boundary: Boundary, kjt: Any) -> tuple[torch.Tensor, PooledStub] | None:
    """Run the collection on (a copy of) the example KJT: the pooled example the graph is captured
    on, with the grad flag eager's would have, and the stub that rebuilds its ``KeyedTensor``."""
    with torch.no_grad():
        out = boundary.ebc(kjt)
    if not (_named(out, "KeyedTensor") and isinstance(out.values(), torch.Tensor)):
        return None
    wants_grad = torch.is_grad_enabled() and any(p.requires_grad for p in boundary.ebc.parameters())
    pooled = out.values().detach().clone().requires_grad_(wants_grad)
    return pooled, PooledStub(out.keys(), out.length_per_key(), out.key_dim())


def outer_graph_module(boundary: Boundary, inner: nn.Module, names: list[str]) -> fx.GraphModule:
    """What ``optimize`` returns: ``inner(..., sparse(kjt).values(), ...)`` as a GraphModule whose
    submodules are the collection itself (run eagerly) and the captured graph."""
    root = nn.Module()
    root.sparse = boundary.ebc
    root.dense = inner
    graph = fx.Graph()
    args = [graph.placeholder(name) for name in names]
    pooled = graph.call_method("values", (graph.call_module("sparse", (args[boundary.index],)),))
    dense_args = [*args[: boundary.index], pooled, *args[boundary.index + 1 :]]
    graph.output(graph.call_module("dense", tuple(dense_args)))
    return fx.GraphModule(root, graph)


__all__ = [
    "Boundary",
    "DenseOf",
    "PooledFeatures",
    "PooledStub",
    "find",
    "outer_graph_module",
    "pooled_example",
]
