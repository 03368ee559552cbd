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

The contexts the model wraps its lookup in (``with torch.no_grad():`` for frozen tables,
``inference_mode``, ``autocast``, ``set_grad_enabled``) are kept for it. Dynamo records them as
context nodes in the graph (:mod:`optimus.semantics.regions`), so the boundary first exports the
model once with a marker at the lookup, reads the context nodes open at the marker
(:func:`lookup_context`), and the outer graph replays them around the collection
(:class:`LookupContext`): the pooled values then carry eager's ``requires_grad`` (frozen tables
get no gradient), dtype and inference-ness. A context it cannot reproduce (any other enter/exit
call, a lookup inside a higher-order op) makes the boundary decline, with the reason in the report.

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

from optimus.semantics.regions import context_kind, describe

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
        self.probe = False  # mark where the lookup runs (an ``aten.alias`` of the pooled input)

    def forward(self, features: PooledFeatures) -> Any:
        from torchrec.sparse.jagged_tensor import KeyedTensor

        values = torch.ops.aten.alias.default(features.pooled) if self.probe else features.pooled
        return KeyedTensor(
            keys=self.keys_, length_per_key=self.length_per_key, values=values, key_dim=self.key_dim
        )


@dataclass(frozen=True)
class LookupContext:
    """The contexts open around the model's lookup, in the order the model entered them:
    ``("grad", (flag,))`` for a ``_set_grad_enabled``, ``("autocast", (device, dtype, enabled,
    cache))``, ``("inference_mode", (mode,))``. Empty: the lookup runs in the caller's state."""

    steps: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The steps replayed, in order; grad mode, autocast and inference mode are the caller's
        again afterwards, however the block ends."""
        with contextlib.ExitStack() as stack:
            stack.callback(torch._C._set_grad_enabled, torch.is_grad_enabled())
            for kind, args in self.steps:
                if kind == "grad":
                    torch._C._set_grad_enabled(args[0])
                elif kind == "autocast":
                    device, dtype, enabled, cache = args
                    stack.enter_context(
                        torch.autocast(device_type=device, dtype=dtype, enabled=enabled, cache_enabled=cache)
                    )
                else:
                    stack.enter_context(torch.inference_mode(args[0]))
            yield


def lookup_context(gm: fx.GraphModule, traced_grad: bool = True) -> LookupContext | str:
    """The contexts open at the lookup marker of a graph exported with ``PooledStub.probe`` set
    (under grad mode ``traced_grad``), or why they cannot be reproduced.

    WHY: Dynamo leaves ``with`` blocks as enter/exit/set calls in node order (see
    :mod:`optimus.semantics.regions`). A block closed before the lookup is dropped with all it
    set (Dynamo closes a ``no_grad`` block by setting the traced mode again: that set is dropped,
    so a caller in ``no_grad`` keeps its own mode for the lookup, as in eager); what is still open
    at the marker is replayed around the collection. Known kinds only: an
    unknown context node anywhere before the lookup may still be open, so the boundary declines."""
    open_steps: list[tuple[fx.Node, str, tuple[Any, ...]]] = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.alias.default:
            if not (node.args and isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder"):
                return "the lookup's marker does not read the pooled input"
            return LookupContext(tuple((kind, args) for _, kind, args in open_steps))
        kind = context_kind(node)
        if (
            kind is None
            and node.op in ("call_function", "call_method")
            and node.meta.get("example_value") is None
        ):
            kind = "unknown"  # a call Dynamo kept for its effect alone (``_sdpa_kernel``, a hooks switch)
        if kind is None:
            continue
        if kind == "unknown":
            return f"the lookup may run inside {describe(node)}, which the boundary cannot reproduce"
        enter = node.target in (
            torch.amp.autocast_mode._enter_autocast,
            torch.autograd.grad_mode._enter_inference_mode,
        )
        if kind == "grad" or enter:
            args = tuple(node.args)
            if kind == "grad" and not (len(args) == 1 and isinstance(args[0], bool)):
                return f"the lookup's grad mode is not a constant ({describe(node)})"
            if kind == "autocast" and len(args) != 4:
                return f"unexpected autocast arguments ({describe(node)})"
            if kind == "inference_mode" and not (len(args) == 1 and isinstance(args[0], bool)):
                return f"unexpected inference_mode arguments ({describe(node)})"
            if kind == "grad":  # supersedes the grad mode set since the innermost open block
                while open_steps and open_steps[-1][1] == "grad":
                    open_steps.pop()
                before = next((a[0] for _, k, a in reversed(open_steps) if k == "grad"), traced_grad)
                if args[0] == before:
                    continue  # the exit of a block: the mode it was entered with again
            open_steps.append((node, kind, args))
            continue
        opened = [i for i, (n, _, _) in enumerate(open_steps) if node.args and n is node.args[0]]
        if not opened:
            return f"an exit without its enter before the lookup ({describe(node)})"
        # leaving a block drops it; leaving inference_mode also restores the grad mode set inside
        i = opened[0]
        open_steps[i:] = [] if kind == "inference_mode" else open_steps[i + 1 :]
    return "the lookup is not in the top-level graph (inside a higher-order op?)"


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


def pooled_example(
    boundary: Boundary, kjt: Any, context: LookupContext | None = None
) -> tuple[torch.Tensor, PooledStub] | None:
    """Run the collection on (a copy of) the example KJT under the lookup's ``context``: the
    pooled example the graph is captured on, with the grad flag and dtype eager's would have, and
    the stub that rebuilds its ``KeyedTensor``."""
    with (context or LookupContext()).entered():
        grad_on = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        with torch.no_grad():
            out = boundary.ebc(kjt)
    if not (_named(out, "KeyedTensor") and isinstance(out.values(), torch.Tensor)):
        return None
    wants_grad = grad_on and any(p.requires_grad for p in boundary.ebc.parameters())
    pooled = out.values().detach().clone().requires_grad_(wants_grad)
    return pooled, PooledStub(out.keys(), out.length_per_key(), out.key_dim())


def lookup(ebc: nn.Module, kjt: Any, context: LookupContext) -> torch.Tensor:
    """The collection's pooled values, computed under the contexts the model wraps its lookup in."""
    with context.entered():
        return ebc(kjt).values()


def outer_graph_module(
    boundary: Boundary, inner: nn.Module, names: list[str], context: LookupContext | None = None
) -> fx.GraphModule:
    """What ``optimize`` returns: ``inner(..., sparse(kjt).values(), ...)`` as a GraphModule whose
    submodules are the collection itself (run eagerly, under the lookup's ``context``) and the
    captured graph."""
    root = nn.Module()
    root.sparse = boundary.ebc
    root.dense = inner
    graph = fx.Graph()
    args = [graph.placeholder(name) for name in names]
    if context is not None and context.steps:
        root.__dict__["lookup_context"] = context  # a plain attribute, read by get_attr
        pooled = graph.call_function(
            lookup, (graph.get_attr("sparse"), args[boundary.index], graph.get_attr("lookup_context"))
        )
    else:
        pooled = graph.call_method("values", (graph.call_module("sparse", (args[boundary.index],)),))
    dense_args = [*args[: boundary.index], pooled, *args[boundary.index + 1 :]]
    graph.output(graph.call_module("dense", tuple(dense_args)))
    return fx.GraphModule(root, graph)


__all__ = [
    "Boundary",
    "DenseOf",
    "LookupContext",
    "PooledFeatures",
    "PooledStub",
    "find",
    "lookup",
    "lookup_context",
    "outer_graph_module",
    "pooled_example",
]
