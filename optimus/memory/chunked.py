"""Inference under Inductor: run a stacked chain a few members at a time, so fusion costs no peak.

WHY: horizontal fusion computes G members as one op, so G members' intermediates exist at once
(a ``[G, B, D]`` buffer per layer) where the unfused graph, run by Inductor one member after
another, holds one member's at a time and writes each result straight into the final ``cat``.
On towers medium inference that lifted the peak by 3.8 MB (+41%, parameters included; docs/perf.md
"A fused chain in chunks"). Nearly all of fusion's speed under Inductor is the batched GEMM's:
cut into chunks of 8 members the chain ran faster still (1.43x of plain compile, side by side,
against 1.33x whole) at +1.4% peak, and the seam ``cat`` where two groups meet one wider group
(the sparse and dense towers' layer norm) disappears, since no chunk straddles a seam.

What it does, after the rules have converged, only for a graph captured in eval mode and priced
for Inductor (``optimize_graph_module(..., inference=True)`` with an Inductor cost model):

* a *region* is a connected set of nodes that all carry the same leading group dim G and act on
  each index of it separately: ``baddbmm``/``bmm``, ``layer_norm`` over trailing dims, pointwise
  ops whose other operands broadcast over G, views that keep dim 0 (``unflatten``/``select``/
  ``unsqueeze`` off dim 0, a ``reshape``/``view`` keeping G, a ``permute`` keeping dim 0). A
  ``cat`` along dim 0 of region values joins their regions into one index space at offsets;
* the space is cut at every region's ends and every ``k`` indices: ``k`` is the larger of
  ``chunk_bytes`` over the group's largest per-member bytes of a computed value, 2, and the group's
  members over its share of ``MAX_CHUNKS`` (shared out by the groups' bytes); a group whose
  chunks would share their kernels (:func:`_kernels_shared`) is cut at ``chunk_bytes`` alone,
  down to one member. Each chunk's nodes are emitted in order, chunk after chunk, reading
  ``narrow`` views of the values outside (stacked parameters, the input views), or computing
  its own columns of an input that is a slab of one linear (:mod:`optimus.memory.chunk_slab`) where
  that lowers the graph's estimated peak (:func:`chunk_lightest`);
* a value read outside is rebuilt from its chunks: ``flatten(movedim(v, 0, 1), 1, 2)`` (the
  fused towers' hand-back) becomes the ``cat`` of the chunks' own, spliced into an enclosing
  ``cat`` on dim 1; a contiguous copy of ``movedim(v, 0, 1)`` (MMoE's experts) the ``cat`` of
  the chunks' own ``movedim`` on dim 1.

Each chunk computes each member's values by the same ops on fewer members: dtypes, strides
(every rebuilt value is new contiguous storage where the original was) and aliasing are as
before, and values too up to the last bits a GEMM library may round otherwise for a smaller
batch (as batching itself differs from eager's per-member GEMMs; 1.5e-8 in float32 in
tests/optimus/memory/test_chunk_stacked.py). It declines (the whole group, said in ``report.notes``)
where it cannot show that: an effect (mutation, randomness, a grad/autocast switch) placed among
the group's nodes, a group node or input in the alias class of a value written in place, a group
value the graph returns, a reader placed before the group's last node, a value read by anything
but a hand-back (copying it back whole from the chunks would add the memory chunking saves).
Training graphs are left alone: there a chunk's ``narrow`` backward writes zeros over the whole
stacked gradient per chunk.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from optimus.memory import chunk_slab
from optimus.memory.live import estimate
from optimus.semantics.effects import is_effectful, ordered_nodes
from optimus.semantics.graph_copy import copy_graph
from optimus.semantics.meta import TensorMeta, propagate, tensor_meta
from optimus.semantics.normalize import BINARY_POINTWISE, UNARY_POINTWISE, canonicalize

CHUNK_BYTES = 256 * 1024  # per-member bytes x members of one chunk's largest computed value
# Each chunk is its own few kernels for Inductor to generate and compile (about 0.4 s each on a
# CPU: a fused op reading a stacked parameter at another offset is another kernel), so a graph's
# groups are cut into about this many chunks in all, shared out by bytes, whatever
# ``chunk_bytes`` says (groups whose chunks share their kernels excepted).
MAX_CHUNKS = 8

_BMM = {torch.baddbmm, torch.bmm, "baddbmm", "bmm"}
_ADDCMUL = {torch.addcmul, "addcmul"}
_LAYER_NORM = {F.layer_norm, torch.layer_norm}
_DIM_VIEWS = {"unflatten", "select", "unsqueeze", torch.unflatten, torch.select, torch.unsqueeze}
_SHAPE_VIEWS = {"reshape", "view", torch.reshape}
_PERMUTE = {"permute", torch.permute}
_CAT = {torch.cat, torch.concat}
_MOVEDIM = {"movedim", torch.movedim}
_FLATTEN = {"flatten", torch.flatten}
_NARROW = {"narrow", torch.narrow}


def _is(node: Any, names: set[Any]) -> bool:
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method"):
        return False
    try:
        return node.target in names
    except TypeError:
        return False


@dataclass
class _Group:
    """Regions joined by dim-0 cats: one index space of ``size`` members."""

    nodes: list[fx.Node] = field(default_factory=list)  # graph order
    offset: dict[fx.Node, int] = field(default_factory=dict)  # where a node's dim 0 starts
    bad: str | None = None


@dataclass
class _Effects:
    """Where the graph's effectful nodes sit, and every node in the alias class of a value
    written in place (``effects.ordered_nodes``): a group's chunks run later than its nodes did,
    so nothing of the kind may lie between them or be read by them."""

    positions: list[int]
    ordered: set[fx.Node]


def _meta(node: Any) -> TensorMeta | None:
    return tensor_meta(node) if isinstance(node, fx.Node) else None


def _norm_dim(dim: Any, ndim: int) -> int | None:
    if not isinstance(dim, int) or not -ndim <= dim < ndim:
        return None
    return dim % ndim


def _acts_per_member(node: fx.Node, out: TensorMeta) -> tuple[str, list[fx.Node]] | None:
    """How ``node`` acts on its leading dim: ("compute"|"view", its inputs indexed by that dim),
    or None when it does not act on each index separately."""
    g, ndim = out.shape[0], len(out.shape)
    args, kwargs = node.args, node.kwargs
    first = args[0] if args else None
    first_meta = _meta(first)
    if _is(node, _DIM_VIEWS) or _is(node, _SHAPE_VIEWS) or _is(node, _PERMUTE):
        if kwargs or first_meta is None or not first_meta.shape or first_meta.shape[0] != g:
            return None
        rest = args[1:]
        if _is(node, _SHAPE_VIEWS):
            shape = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else rest
            ok = bool(shape) and shape[0] == g and all(isinstance(s, int) for s in shape)
        elif _is(node, _PERMUTE):
            dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else rest
            ok = bool(dims) and _norm_dim(dims[0], len(first_meta.shape)) == 0
        elif node.target in ("unsqueeze", torch.unsqueeze):
            ok = len(rest) == 1 and _norm_dim(rest[0], ndim) not in (None, 0)
        else:  # unflatten / select: a dim of the input
            ok = len(rest) == 2 and _norm_dim(rest[0], len(first_meta.shape)) not in (None, 0)
        return ("view", [first]) if ok and isinstance(first, fx.Node) else None
    if _is(node, _LAYER_NORM):
        normalized = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
        if first_meta is None or not isinstance(normalized, (tuple, list)) or len(normalized) >= ndim:
            return None
    elif not (_is(node, _BMM) or _is(node, _ADDCMUL)):
        canon = canonicalize(node)
        if canon is None or canon.inplace or canon.op not in UNARY_POINTWISE | BINARY_POINTWISE:
            return None
    indexed: list[fx.Node] = []
    for arg in [*args, *kwargs.values()]:
        if isinstance(arg, fx.Node):
            m = _meta(arg)
            if m is None:
                return None
            if len(m.shape) == ndim and m.shape[0] == g:
                indexed.append(arg)
            elif len(m.shape) == ndim and m.shape[0] != 1:
                return None  # neither indexed by G nor broadcast over it
        elif isinstance(arg, (list, tuple)) and any(isinstance(a, fx.Node) for a in arg):
            return None
    return ("compute", indexed) if indexed else None


def _cat_pieces(node: fx.Node) -> list[fx.Node] | None:
    if not _is(node, _CAT):
        return None
    pieces = node.args[0] if node.args else node.kwargs.get("tensors")
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if dim != 0 or not isinstance(pieces, (list, tuple)) or len(pieces) < 2:
        return None
    if not all(isinstance(p, fx.Node) for p in pieces):
        return None
    return list(pieces)


def chunk_lightest(gm: fx.GraphModule, chunk_bytes: int = CHUNK_BYTES) -> tuple[int, list[str]]:
    """:func:`chunk_stacked`, computing a slab per chunk (:mod:`optimus.memory.chunk_slab`) only where
    that lowers the graph's estimated peak (:func:`optimus.memory.live.estimate`); else the chunks read
    ``narrow`` views of the whole linear, in place. Returns (groups chunked, notes).

    WHY: per chunk, one merged GEMM becomes a narrower GEMM per chunk and one for the rest, which
    is slower where the merged output is not what the step's peak holds. MMoE large inference,
    side by side (15 interleaved rounds, 1 thread, under Inductor): 1.15x of plain compile with
    the slab per chunk, 1.18x with the merged GEMM kept, the same estimated peak (12.7 MB) and the
    same measured one (+1.0%). At medium the merged output is the peak: 3.5 MB estimated with the
    slab per chunk against 4.8 MB without (measured +0.0% against +8.0%), so it stays there."""
    before = copy_graph(gm.graph)
    done, notes, slabbed = _chunk_all(gm, chunk_bytes, slabs_allowed=True)
    if not slabbed:
        return done, notes
    with_slabs, peak_with = copy_graph(gm.graph), _estimated_peak(gm)
    gm.graph = before
    done_without, notes_without, _ = _chunk_all(gm, chunk_bytes, slabs_allowed=False)
    peak_without = _estimated_peak(gm)
    if peak_without <= peak_with:
        note = (
            f"chunk_slab: {slabbed} linear(s) kept whole: computed per chunk the estimated peak is "
            f"no lower ({peak_with:.0f} B against {peak_without:.0f} B)"
        )
        return done_without, [*notes_without, note]
    gm.graph = with_slabs  # the setter recompiles
    return done, notes


def _estimated_peak(gm: fx.GraphModule) -> float:
    nodes = list(gm.graph.nodes)
    return estimate(nodes, {n: canonicalize(n) for n in nodes}).peak


def chunk_stacked(gm: fx.GraphModule, chunk_bytes: int = CHUNK_BYTES) -> tuple[int, list[str]]:
    """Cut every stacked region of ``gm`` wider than ``chunk_bytes`` into chunks, in place, slabs
    computed per chunk wherever found. Returns (groups chunked, why others were declined)."""
    done, notes, _ = _chunk_all(gm, chunk_bytes, slabs_allowed=True)
    return done, notes


def _chunk_all(gm: fx.GraphModule, chunk_bytes: int, slabs_allowed: bool) -> tuple[int, list[str], int]:
    """(groups chunked, notes, linears computed per chunk)."""
    graph = gm.graph
    nodes = list(graph.nodes)
    canons = {n: canonicalize(n) for n in nodes}
    calls = ("call_function", "call_method", "call_module")
    effects = _Effects(
        [i for i, n in enumerate(nodes) if n.op in calls and is_effectful(n, canons[n])],
        ordered_nodes(nodes, canons),
    )
    pos = {n: i for i, n in enumerate(nodes)}
    effectful = {nodes[i] for i in effects.positions}
    kind: dict[fx.Node, tuple[str, list[fx.Node]]] = {}
    for n in nodes:
        if n in effectful or n.op not in ("call_function", "call_method", "get_attr", "placeholder"):
            continue  # an effect is never a member (nor run to learn its meta)
        out = _meta(n)
        if out is None or len(out.shape) < 1 or out.shape[0] < 2:
            continue
        pieces = _cat_pieces(n)
        if pieces is not None:
            if all(p in kind for p in pieces):
                kind[n] = ("cat", pieces)
            continue
        found = _acts_per_member(n, out)
        if found is not None:
            kind[n] = found
    # no batched GEMM: a leading dim of plain ops may be the batch, not a group
    groups = [g for g in _join(kind) if any(_is(n, _BMM) for n in g.nodes)]
    sources = [_sources(g, kind) for g in groups]
    slabs = [
        _slabs(g, src, pos, effects) if slabs_allowed else {} for g, src in zip(groups, sources, strict=True)
    ]
    shared = [
        _kernels_shared(g, kind, src, found) for g, src, found in zip(groups, sources, slabs, strict=True)
    ]
    # MAX_CHUNKS chunks in all, shared out by the groups' bytes (MMoE's 100 adapters of 8 KiB a
    # member get fewer than towers' wider members): a group's chunks hold at least this many. A
    # group whose chunks share their kernels costs no compile time per chunk: it is cut at
    # ``chunk_bytes`` alone, down to one member a chunk (MMoE's experts, 256 KiB a member).
    sized = [(_span(g), _per_member(g, kind)) for g in groups]
    total = sum(span * member for (span, member), free in zip(sized, shared, strict=True) if not free)
    done, slabbed, notes = 0, 0, list[str]()
    for i, (group, (span, member)) in enumerate(zip(groups, sized, strict=True)):
        if shared[i]:
            k = max(1, max(chunk_bytes, 1) // max(member, 1))
        else:
            share = max(1, round(MAX_CHUNKS * span * member / max(total, 1)))
            k = max(2, max(chunk_bytes, 1) // max(member, 1), math.ceil(span / share))
        if group.bad is None and _chunk(gm, group, kind, sources[i], pos, effects, k, slabs[i], notes):
            done += 1
            slabbed += len(slabs[i])
    if done:
        graph.lint()
        gm.recompile()
    return done, notes, slabbed


def _sources(group: _Group, kind: dict[fx.Node, tuple[str, list[fx.Node]]]) -> set[fx.Node]:
    """The values outside the group that its members read by member (each chunk a ``narrow``)."""
    members = set(group.nodes)
    return {a for n in group.nodes if kind[n][0] != "cat" for a in kind[n][1] if a not in members}


def _slabs(
    group: _Group, sources: set[fx.Node], pos: dict[fx.Node, int], effects: _Effects
) -> dict[fx.Node, chunk_slab.Slab]:
    """The group's sources that are column slabs of a linear read by nothing else
    (:mod:`optimus.memory.chunk_slab`): each chunk computes its own columns. Not where an effect lies
    between the linear and the group's last node: the chunks compute it later, and a grad-mode or
    autocast switch in between would change how (the chunks then read ``narrow`` views of it)."""
    members = set(group.nodes)
    last = max(pos[n] for n in group.nodes)
    found = {}
    for s in sources:
        slab = chunk_slab.find(s, effects.ordered) if all(u in members for u in s.users) else None
        if slab is not None and not any(pos[slab.linear] < p <= last for p in effects.positions):
            found[s] = slab
    return found


def _kernels_shared(
    group: _Group,
    kind: dict[fx.Node, tuple[str, list[fx.Node]]],
    sources: set[fx.Node],
    slabs: dict[fx.Node, Any],
) -> bool:
    """Whether the group's chunks would be the same kernels for Inductor: every source read at a
    chunk's offset is a slab (computed afresh per chunk) or reaches only batched GEMMs, through
    views (a GEMM library call takes its operands at any offset; a generated kernel that reads a
    stacked parameter bakes the offset in, so each chunk is another kernel to compile)."""
    members = set(group.nodes)

    def gemm_only(node: fx.Node) -> bool:
        for u in node.users:
            if u not in members:
                return False
            if _is(u, _BMM):
                continue
            if kind[u][0] != "view" or not gemm_only(u):
                return False
        return True

    return all(s in slabs or gemm_only(s) for s in sources)


def _per_member(group: _Group, kind: dict[fx.Node, tuple[str, list[fx.Node]]]) -> int:
    """The largest bytes one member takes in a value the group computes (not a view)."""
    return max(
        (
            m.nbytes // m.shape[0]
            for n in group.nodes
            if kind[n][0] == "compute" and (m := _meta(n)) is not None
        ),
        default=0,
    )


def _span(group: _Group) -> int:
    """Members in the group's index space."""
    return max((group.offset[n] + m.shape[0] for n in group.nodes if (m := _meta(n)) is not None), default=0)


def _join(kind: dict[fx.Node, tuple[str, list[fx.Node]]]) -> list[_Group]:
    """Union-find with offsets: a node's leading dim sits at ``offset`` in its group's space."""
    parent: dict[fx.Node, fx.Node] = {n: n for n in kind}
    off: dict[fx.Node, int] = {n: 0 for n in kind}  # offset within parent's space
    conflict: set[fx.Node] = set()

    def find(n: fx.Node) -> tuple[fx.Node, int]:
        total = 0
        path = []
        while parent[n] is not n:
            path.append(n)
            total += off[n]
            n = parent[n]
        root, acc = n, total
        for p in path:  # compress
            nxt = acc - off[p]
            parent[p], off[p] = root, acc
            acc = nxt
        return root, total

    def union(a: fx.Node, b: fx.Node, at: int) -> None:
        """``a``'s index 0 is ``b``'s index ``at``."""
        ra, oa = find(a)
        rb, ob = find(b)
        if ra is rb:
            if oa != ob + at:
                conflict.add(ra)
            return
        parent[ra], off[ra] = rb, ob + at - oa
        if ra in conflict:
            conflict.add(rb)

    for n, (k, ins) in kind.items():
        if k == "cat":
            at = 0
            for p in ins:
                union(p, n, at)
                m = _meta(p)
                at += m.shape[0] if m is not None else 0
        else:
            for a in ins:
                if a in kind:
                    union(a, n, 0)
    by_root: dict[fx.Node, _Group] = {}
    for n in kind:  # dict order = graph order
        root, o = find(n)
        g = by_root.setdefault(root, _Group())
        g.nodes.append(n)
        g.offset[n] = o
        if root in conflict:
            g.bad = "a member is placed at two offsets"
    for g in by_root.values():
        low = min(g.offset.values())
        g.offset = {n: o - low for n, o in g.offset.items()}
    return list(by_root.values())


def _chunk(
    gm: fx.GraphModule,
    group: _Group,
    kind: dict[fx.Node, tuple[str, list[fx.Node]]],
    sources: set[fx.Node],
    pos: dict[fx.Node, int],
    effects: _Effects,
    k: int,
    slabs: dict[fx.Node, chunk_slab.Slab],
    notes: list[str],
) -> bool:
    members = set(group.nodes)
    metas = {n: _meta(n) for n in group.nodes}
    size = {n: m.shape[0] for n, m in metas.items() if m is not None}
    if max(size.values()) <= k and not any(kind[n][0] == "cat" for n in group.nodes):
        return False  # already small, and no seam to remove
    readers: dict[fx.Node, list[fx.Node]] = {}
    for n in group.nodes:
        outside = [u for u in n.users if u not in members]
        if outside:
            readers[n] = outside
    label = f"chunk_stacked ({len(group.nodes)} nodes, {max(size.values())} members)"
    refusal = _refusal(group, sources, readers, metas, pos, effects)
    if refusal is not None:
        notes.append(f"{label}: {refusal}: left alone")
        return False
    chunks = _chunk_bounds(group, size, k)
    graph = gm.graph
    emitter = _ChunkEmitter(graph, group, kind, slabs, max([*group.nodes, *sources], key=lambda n: pos[n]))
    for lo, hi in chunks:
        emitter.chunk(lo, hi, size)
    for n, users in readers.items():
        for u in list(users):
            _hand_back(graph, u, emitter.values[n])
    for n in reversed(group.nodes):
        if not n.users:
            graph.erase_node(n)
    _drop_dead_views(graph, sources)
    for slab in slabs.values():
        chunk_slab.restrict(graph, slab)
    per_chunk = ", its input's linear computed per chunk" if slabs else ""
    notes.append(f"{label}: in {len(chunks)} chunks of at most {k} members{per_chunk}")
    return True


def _refusal(
    group: _Group,
    sources: set[fx.Node],
    readers: dict[fx.Node, list[fx.Node]],
    metas: dict[fx.Node, TensorMeta | None],
    pos: dict[fx.Node, int],
    effects: _Effects,
) -> str | None:
    """Why the group must stay whole, or None. The chunks run after the group's last node and its
    sources (``anchor``), and hand their pieces back to the readers outside the group."""
    anchor = max(pos[n] for n in [*group.nodes, *sources])
    first = min(pos[n] for n in group.nodes)
    if any(first <= p <= anchor for p in effects.positions):
        # a write, a draw or a grad/autocast switch among the group's nodes could change what
        # the chunks read or how they run
        return "an effect lies among the group's nodes"
    if any(n in effects.ordered for n in [*group.nodes, *sources]):
        return "reads a value that is written in place"
    for n, users in readers.items():
        if any(u.op == "output" for u in users):
            return "a value is returned by the graph"
        if any(pos[u] <= anchor for u in users):
            return "a value is read before the group's last node"
        if metas[n] is None or not all(_is_hand_back(n, u) for u in users):
            return "a value read outside would be copied whole"
    return None


def _chunk_bounds(group: _Group, size: dict[fx.Node, int], k: int) -> list[tuple[int, int]]:
    """The group's index space, cut at every member region's ends and every ``k`` members."""
    cuts = {0}
    for n in group.nodes:
        start = group.offset[n]
        cuts.update((start, start + size[n]))
    cuts.update(range(0, max(cuts), k))
    return list(itertools.pairwise(sorted(cuts)))


class _ChunkEmitter:
    """Builds each chunk's copy of a group's nodes, in chunk order, after the group's last node
    (``cursor``); ``values[n]`` collects node ``n``'s pieces for the hand-back."""

    def __init__(
        self,
        graph: fx.Graph,
        group: _Group,
        kind: dict[fx.Node, tuple[str, list[fx.Node]]],
        slabs: dict[fx.Node, chunk_slab.Slab],
        after: fx.Node,
    ) -> None:
        self.graph, self.group, self.kind, self.slabs = graph, group, kind, slabs
        self.members = set(group.nodes)
        self.cursor = after
        self.values: dict[fx.Node, list[fx.Node]] = {n: [] for n in group.nodes}
        self.narrowed: dict[tuple[fx.Node, int, int], fx.Node] = {}

    def emit(self, fn: Callable[[], fx.Node]) -> fx.Node:
        with self.graph.inserting_after(self.cursor):
            new = fn()
        propagate(new)
        self.cursor = new
        return new

    def chunk(self, lo: int, hi: int, size: dict[fx.Node, int]) -> None:
        local: dict[fx.Node, fx.Node] = {}
        for n in self.group.nodes:
            start = self.group.offset[n]
            if not (start <= lo and hi <= start + size[n]):
                continue
            a, length = lo - start, hi - lo
            how, ins = self.kind[n]
            if how == "cat":  # the chunk lies inside one of the cat's inputs: that input's piece
                at = 0
                for p in ins:
                    if at <= a < at + size[p]:
                        local[n] = local[p]
                        break
                    at += size[p]
                self.values[n].append(local[n])
                continue
            local[n] = self._member(n, a, length, local)
            self.values[n].append(local[n])

    def _member(self, n: fx.Node, a: int, length: int, local: dict[fx.Node, fx.Node]) -> fx.Node:
        def sub(arg: fx.Node) -> fx.Node:
            return self._operand(n, arg, a, length, local)

        new_args = fx.node.map_arg(n.args, sub)
        new_kwargs = fx.node.map_arg(n.kwargs, sub)
        if _is(n, _SHAPE_VIEWS):
            rest = new_args[1:]
            if len(rest) == 1 and isinstance(rest[0], (tuple, list)):
                new_args = (new_args[0], (length, *rest[0][1:]))
            else:
                new_args = (new_args[0], length, *rest[1:])
        return self.emit(_maker(self.graph, n, new_args, new_kwargs))

    def _operand(
        self, n: fx.Node, arg: fx.Node, a: int, length: int, local: dict[fx.Node, fx.Node]
    ) -> fx.Node:
        if arg not in self.kind[n][1]:
            return arg  # broadcast over the group: read whole
        if arg in self.members:
            return local[arg]
        key = (arg, a, length)
        if key not in self.narrowed:
            if arg in self.slabs:  # the chunk's own columns of the linear
                self.narrowed[key] = self.cursor = chunk_slab.emit(
                    self.graph, self.slabs[arg], a, length, self.cursor
                )
            else:
                self.narrowed[key] = self.emit(
                    lambda: self.graph.call_function(torch.narrow, (arg, 0, a, length))
                )
        return self.narrowed[key]


def _drop_dead_views(graph: fx.Graph, nodes: set[fx.Node]) -> None:
    """Erase the views and ``get_attr``s the chunks left unread (the whole stacked inputs), and
    the views they read in turn: pure, so only dead code; a graph run eagerly would still run it."""
    stack, erased = list(nodes), set()
    while stack:
        n = stack.pop()
        if n in erased or n.users:
            continue
        pure = n.op == "get_attr" or any(
            _is(n, names) for names in (_DIM_VIEWS, _SHAPE_VIEWS, _PERMUTE, _MOVEDIM, _NARROW)
        )
        if not pure:
            continue
        inputs = list(n.all_input_nodes)
        graph.erase_node(n)
        erased.add(n)
        stack.extend(inputs)


def _maker(graph: fx.Graph, like: fx.Node, args: Any, kwargs: Any) -> Callable[[], fx.Node]:
    """A call of ``like``'s target (function or method) on new arguments."""
    if like.op == "call_method":
        return lambda: graph.call_method(str(like.target), args, kwargs)
    target: Any = like.target
    return lambda: graph.call_function(target, args, kwargs)


def _is_hand_back(v: fx.Node, mover: fx.Node) -> bool:
    """``movedim(v, 0, 1)`` of a contiguous ``[G, B, D]`` value, read only by ``flatten(., 1, 2)``
    (the fused towers' hand-back to the per-member layout) or by a contiguous copy
    (``.contiguous()``, ``clone(memory_format=torch.contiguous_format)``: MMoE's experts as
    ``[B, E, H]``). Either is new contiguous storage, since ``[B, G, D]`` is a view of ``v`` that
    merges or keeps G and D contiguous only when B == 1, which is excluded; so is the ``cat`` of
    the chunks' own. Any other reader would need the whole stacked value, copied back from the
    chunks: chunking would then add memory."""
    m = _meta(v)
    if m is None or len(m.shape) != 3 or m.shape[1] == 1 or not m.is_contiguous:
        return False
    if not (_is(mover, _MOVEDIM) and mover.args[1:] == (0, 1) and not mover.kwargs and len(mover.users) == 1):
        return False
    reader = next(iter(mover.users))
    if _is(reader, _FLATTEN):
        return reader.args[1:] == (1, 2) and not reader.kwargs
    return _is_contiguous_copy(reader)


def _is_contiguous_copy(node: fx.Node) -> bool:
    if node.op == "call_method" and node.target == "contiguous":
        return (
            len(node.args) == 1
            and node.kwargs.get("memory_format", torch.contiguous_format) is torch.contiguous_format
        )
    if node.target in ("clone", torch.clone) and node.op in ("call_method", "call_function"):
        return len(node.args) == 1 and dict(node.kwargs) == {"memory_format": torch.contiguous_format}
    return False


def _hand_back(graph: fx.Graph, mover: fx.Node, chunks: list[fx.Node]) -> None:
    """Rebuild a hand-back (:func:`_is_hand_back`) as the ``cat`` of each chunk's own along
    dim 1, spliced into an enclosing dim-1 ``cat``."""
    flat = next(iter(mover.users))
    keep_dims = _is_contiguous_copy(flat)  # [B, G, D] rather than [B, G * D]
    pieces: list[fx.Node] = []
    with graph.inserting_before(flat):
        for c in chunks:
            moved = graph.call_function(torch.movedim, (c, 0, 1))
            propagate(moved)
            pieces.append(moved if keep_dims else graph.call_function(torch.flatten, (moved, 1, 2)))
            propagate(pieces[-1])
    users = list(flat.users)
    outer = users[0] if len(users) == 1 and not keep_dims else None
    if outer is not None and _is(outer, _CAT) and _cat_dim(outer) in (1, -1) and len(outer.args) >= 1:
        listed = list(outer.args[0]) if isinstance(outer.args[0], (list, tuple)) else None
        if (
            listed is not None
            and listed.count(flat) == 1
            and all(_ndim(p) == 2 for p in listed if isinstance(p, fx.Node))
        ):
            i = listed.index(flat)
            outer.args = (listed[:i] + pieces + listed[i + 1 :], *outer.args[1:])
            graph.erase_node(flat)
            graph.erase_node(mover)
            return
    with graph.inserting_before(flat):
        whole = graph.call_function(torch.cat, (pieces, 1))
    propagate(whole)
    flat.replace_all_uses_with(whole)
    graph.erase_node(flat)
    graph.erase_node(mover)


def _ndim(node: fx.Node) -> int | None:
    m = _meta(node)
    return None if m is None else len(m.shape)


def _cat_dim(node: fx.Node) -> Any:
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
