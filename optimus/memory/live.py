"""Live bytes: how much tensor memory a graph holds at once, and what a horizontal fusion adds.

WHY: horizontal fusion computes G members as one op, so their G outputs exist together (one
stacked buffer, freed only when the last member piece dies) where the unfused graph may have
held one member's output at a time, and a stack that cannot be a view copies its inputs while
the originals are still alive. The time-based cost model cannot see that; the driver weighs
these bytes against the graph's estimated peak (``OptimusConfig.memory_margin`` and
``memory_budget_bytes``, see docs/optimus.md, "Memory is a cost").

The estimate, forward only and in the graph's current node order:

- a node whose output is new storage (not a view, not in place: ``effects.may_alias_output``;
  advanced indexing with a tensor is a copy, ``copies_by_index``) holds ``nbytes`` of its tensor
  meta from its own position through its last reader, where a reader that may alias it (a view,
  ``getitem`` of a split/unbind) passes on its own last reader;
- graph inputs (placeholders) are held through the whole graph; parameters and buffers
  (``get_attr``) are not counted: they are alive in every mode, whatever the optimizer does;
- unknown sizes count 0, so the estimate is a lower bound;
- for Inductor (``inductor=True``: the graph goes to torch.compile), a pointwise op or a layer
  norm whose every reader Inductor also generates code for (pointwise, a norm, a reduction, a
  cat or stack) is not a buffer of its own: Inductor computes it inside its readers, so it holds
  no bytes and its inputs live until those readers run (it is treated like a view). Without this
  the unfused graph's estimate counted every tower's LayerNorm and SiLU output, about twice
  what compile holds (towers tiny: 8.4 KiB estimated against 4.2 KiB measured), and a fused
  group then looked free where it doubled the peak.

In training, autograd keeps saved activations past their last forward reader; this estimate of
a forward graph prices the forward's own working set. A whole training step is estimated by
running it on the forward and backward traced together (``optimus.memory.step``), where a saved
activation is read by the backward.

What a user measures is the whole program: the parameters and buffers (``static_bytes``) plus
the step's own peak. The ceiling (``OptimusConfig.memory_ceiling``; ``MEMORY_CEILING`` in the benchmark)
is a fraction of that total, so a rewrite may add bytes where they are small beside the program
(the fused groups at scale) and not where the activations are the program (a tiny model, where
one stacked group alone outweighs what the unfused graph ever holds at once).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch
from torch import fx

from optimus.semantics.effects import may_alias_output
from optimus.semantics.meta import TensorMeta, value_meta
from optimus.semantics.op_schema import aten_name

# Ops Inductor generates code for that read their inputs inside their own kernel (so a pointwise
# producer is fused into them), beside every op tagged pointwise; matmuls, convolutions and
# embeddings are extern kernels that need their inputs in memory.
_GENERATED = frozenset(
    {"layer_norm", "native_layer_norm", "sum", "mean", "amax", "softmax", "_softmax", "cat", "stack"}
)
# Of those, the ones whose result is itself computed inside its readers (a norm's output is a
# pointwise epilogue of its statistics).
_FUSED_RESULT = frozenset({"layer_norm", "native_layer_norm"})
# Ops Inductor lowers to pointwise code though ATen does not tag them pointwise: the backward of
# a slice or a select (and the scatters they decompose to) writes the gradient into a zero-filled
# tensor, which Inductor computes as a masked load inside its readers. Seen in training steps
# (``optimus.memory.step``): dlrm medium's interaction slices its stacked projections, and each
# slice's full-size ``slice_backward`` (2 MiB) held until the sum of them read +24.5% where the
# step measured +0.0%.
_LOWERED_POINTWISE = frozenset({"slice_backward", "select_backward", "slice_scatter", "select_scatter"})
# Python's arithmetic operators on tensors (``x * y`` in a captured graph) and their ATen ops.
_OPERATORS: dict[Any, str] = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.neg: "neg",
}


# The peak a rewrite may add over the graph as captured, as a fraction of the program's estimated
# memory (static_bytes + the live peak): the harness's ceiling on compile+optimus against compile.
MEMORY_CEILING = 0.02


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and shared weights counted once;
    what is not a tensor, and meta tensors, count nothing)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def static_bytes(gm: fx.GraphModule) -> int:
    """Bytes of the distinct storages behind ``gm``'s parameters and buffers (alive in every mode,
    so not in the live curve; the base the ceiling is a fraction of)."""
    return storage_bytes([*gm.parameters(), *gm.buffers()])


def ceiling_budget(static: float, peak: float, ceiling: float) -> float:
    """Live bytes the graph may reach so that ``static`` + its peak stays within ``ceiling`` of
    ``static + peak`` (the graph as captured)."""
    return (1.0 + ceiling) * (static + peak) - static


def output_bytes(node: fx.Node) -> int:
    """Bytes of the tensor(s) ``node`` returns, by its meta (0 where unknown)."""
    value = value_meta(node)
    metas = value if isinstance(value, tuple) else (value,)
    return sum(m.nbytes for m in metas if isinstance(m, TensorMeta))


@dataclass(frozen=True)
class LiveEstimate:
    """Live bytes at every position of one node order (see the module docstring)."""

    live: tuple[float, ...]  # live[i]: bytes held while node i runs
    last: dict[fx.Node, int]  # position of the last reader of each node's storage
    pos: dict[fx.Node, int]

    @property
    def peak(self) -> float:
        return max(self.live, default=0.0)

    def at(self, node: fx.Node) -> float:
        """Live bytes while ``node`` runs (0 for a node not in this order)."""
        i = self.pos.get(node)
        return self.live[i] if i is not None else 0.0


def copies_by_index(node: fx.Node) -> bool:
    """``x[idx]`` where ``idx`` holds a tensor of one or more dims: advanced indexing, which always
    returns new storage (``aten.index``), never a view of ``x``.

    WHY here and not in ``effects.may_alias_output``: for effects, "may alias" only needs to be
    safe; for memory, calling such a copy a view holds ``x`` alive until the copy's last reader
    and counts the copy as free. dlrm medium's interaction indexes each group's ``bmm`` output
    with its pair indices and joins them in one cat at the end, so every ``bmm`` (0.69 MB) looked
    alive until that cat, and the fused graph, whose stacked projections are alive through those
    groups, looked 2.5 MB over the captured one's peak."""
    if node.op != "call_function" or node.target is not operator.getitem or len(node.args) < 2:
        return False
    base, index = node.args[0], node.args[1]
    if not isinstance(base, fx.Node) or not isinstance(value_meta(base), TensorMeta):
        return False
    parts = index if isinstance(index, tuple) else (index,)
    for part in parts:
        meta = value_meta(part) if isinstance(part, fx.Node) else None
        if isinstance(meta, TensorMeta) and len(meta.shape) >= 1:
            return True
    return False


def _aten_name(node: fx.Node) -> str | None:
    if node.op not in ("call_function", "call_method"):
        return None
    try:
        name = _OPERATORS.get(node.target)
    except TypeError:  # an unhashable target
        name = None
    return name or aten_name(node)


def _pointwise(name: str) -> bool:
    if name in _LOWERED_POINTWISE:
        return True
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return False
    try:
        return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())
    except (AttributeError, RuntimeError):
        return False


def _generated(node: fx.Node, names: dict[fx.Node, str | None]) -> str | None:
    """``node``'s ATen name when Inductor generates code for it (pointwise or ``_GENERATED``)."""
    if node.op not in ("call_function", "call_method"):
        return None
    name = names.get(node)
    if name is None:
        return None
    return name if name in _GENERATED or _pointwise(name) else None


_JOINS = frozenset({"cat", "stack"})
# Extern matmuls Inductor also runs with ``out=`` a slice of a joined buffer (dlrm's projections
# into its interaction stack: ``addmm(..., out=reinterpret_tensor(buf, ...))``).
_JOINABLE_EXTERN = frozenset({"linear", "addmm", "mm"})


def inductor_placement(
    nodes: Sequence[fx.Node], is_view: Callable[[fx.Node], bool] | None = None
) -> tuple[set[fx.Node], set[fx.Node]]:
    """(fused, joined) under Inductor (see the module docstring). fused: pointwise ops and layer
    norms Inductor computes inside their readers (each reader a pointwise op, a norm or a
    reduction), or read only by two or more cats or stacks; they hold no buffer and their inputs
    live until the readers run. joined: pointwise ops and 2-D matmuls read only by one cat or
    stack, which Inductor writes straight into the joined buffer when they run; they hold no
    buffer, and the joined one is alive from the first of them. ``is_view``: a node whose output may be a view of its input; a joined op
    may reach its cat through views (the fused towers' ``flatten(movedim(v))`` hand-back), which
    Inductor folds into the write's indexing."""
    names = {n: _aten_name(n) for n in nodes}
    generated = {n: _generated(n, names) for n in nodes}
    viewing = is_view or (lambda n: False)
    into_join: dict[fx.Node, bool] = {}

    def reaches_join_only(node: fx.Node) -> bool:
        """Every reader of ``node`` is a cat or stack, or a view whose readers all are."""
        if node not in into_join:
            into_join[node] = bool(node.users) and all(
                generated.get(u) in _JOINS or (viewing(u) and reaches_join_only(u)) for u in node.users
            )
        return into_join[node]

    reached: dict[fx.Node, frozenset[fx.Node]] = {}

    def joins_reached(node: fx.Node) -> frozenset[fx.Node]:
        """The cats and stacks ``node`` reaches through its readers (once per node)."""
        if node not in reached:
            found: set[fx.Node] = set()
            for u in node.users:
                found |= {u} if generated.get(u) in _JOINS else joins_reached(u)
            reached[node] = frozenset(found)
        return reached[node]

    fused: set[fx.Node] = set()
    joined: set[fx.Node] = set()
    for node in nodes:
        name = generated[node]
        if not node.users:
            continue
        readers = [generated.get(u) for u in node.users]
        if name is None:
            if (
                names.get(node) in _JOINABLE_EXTERN
                and reaches_join_only(node)
                and len(joins_reached(node)) == 1
            ):
                joined.add(node)
            continue
        if name in _GENERATED - _FUSED_RESULT:
            continue
        if all(r is not None and r not in _JOINS for r in readers):
            fused.add(node)
        elif name not in _FUSED_RESULT and reaches_join_only(node):
            # written into the one join's buffer; read by several, it is computed inside each
            # join's kernel (dlrm's bottom-MLP output, in every interaction group's cat), and
            # each join's buffer is alive only from when that join runs
            (joined if len(joins_reached(node)) == 1 else fused).add(node)
    return fused, joined


def _joined_parts(node: fx.Node, joined: set[fx.Node], aliases: dict[fx.Node, bool]) -> list[fx.Node]:
    """The joined ops written into ``node``'s buffer: its inputs, looked through views."""
    found: list[fx.Node] = []
    todo = list(node.all_input_nodes) if joined else []
    while todo:
        p = todo.pop()
        if p in joined:
            found.append(p)
        elif aliases.get(p) and p.op in ("call_function", "call_method"):
            todo.extend(p.all_input_nodes)
    return found


def estimate(nodes: Sequence[fx.Node], canons: dict[fx.Node, Any], inductor: bool = False) -> LiveEstimate:
    """The live-bytes curve of ``nodes`` (a graph's nodes in order); O(nodes + edges).
    ``inductor``: the graph is compiled by Inductor (see the module docstring)."""
    pos = {n: i for i, n in enumerate(nodes)}
    end = len(nodes) - 1
    aliases = {
        n: n.op != "output" and may_alias_output(n, canons.get(n)) and not copies_by_index(n) for n in nodes
    }  # once each
    joined: set[fx.Node] = set()
    if inductor:
        views = dict(aliases)
        fused, joined = inductor_placement(nodes, lambda n: views.get(n, False))
        for node in fused:
            aliases[node] = True
    last: dict[fx.Node, int] = {}
    for node in reversed(nodes):
        if node.op == "placeholder":
            last[node] = end
            continue
        reach = pos[node]
        for user in node.users:
            if user not in pos:
                continue
            reach = max(reach, pos[user])
            if aliases[user]:
                reach = max(reach, last.get(user, pos[user]))
        last[node] = reach
    delta = [0.0] * (len(nodes) + 1)
    for node in nodes:
        nbytes = (
            0 if aliases[node] or node in joined or node.op in ("get_attr", "output") else output_bytes(node)
        )
        if nbytes:
            parts = [pos[p] for p in _joined_parts(node, joined, aliases) if p in pos]
            delta[min([pos[node], *parts])] += nbytes
            delta[last[node] + 1] -= nbytes
    live = tuple(accumulate(delta[:-1]))
    return LiveEstimate(live, last, pos)


def earliest_inputs_first(nodes: Sequence[fx.Node]) -> list[fx.Node]:
    """A topological order of ``nodes`` that runs next the node whose inputs ran earliest (ties:
    graph order), so a buffer's readers run soon after it and it dies early.

    WHY: Inductor does not keep the graph's order. It schedules for peak memory
    (``torch._inductor.config.reorder_for_peak_memory``, on by default), trying a few
    topological orders and keeping the one with the lowest peak; this is the breadth-first one
    of them (``topological_sort_bfs``), on FX nodes instead of Inductor's kernels."""
    import heapq

    pos = {n: i for i, n in enumerate(nodes)}
    preds = {n: [p for p in n.all_input_nodes if p in pos] for n in nodes}
    waiting = {n: len(set(preds[n])) for n in nodes}
    succs: dict[fx.Node, list[fx.Node]] = {n: [] for n in nodes}
    for n in nodes:
        for p in set(preds[n]):
            succs[p].append(n)
    ran: dict[fx.Node, int] = {}
    ready: list[tuple[list[int], int, fx.Node]] = [([], pos[n], n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    out: list[fx.Node] = []
    while ready:
        _, _, node = heapq.heappop(ready)
        ran[node] = len(out)
        out.append(node)
        for s in succs[node]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (sorted({ran[p] for p in preds[s]}), pos[s], s))
    if len(out) != len(nodes):  # not a DAG over these nodes (cannot happen for a graph's nodes)
        return list(nodes)
    out.sort(key=lambda n: n.op == "output")  # the output stays last (the sort is stable)
    return out


def scheduled_peak(nodes: Sequence[fx.Node], canons: dict[fx.Node, Any], inductor: bool = False) -> float:
    """The estimated peak of ``nodes`` as its runtime would order them: for Inductor, the lower of
    the graph's order and ``earliest_inputs_first`` (Inductor keeps the order with the lowest
    peak); otherwise the graph's order (eager runs it as written).

    Measured, dlrm medium inference (the stacked projections alive through every interaction
    group in graph order): compile's step peak 10.05 MB, estimated 10.09 MB; fused, measured
    10.60 MB, estimated 13.37 MB in graph order."""
    peak = estimate(nodes, canons, inductor).peak
    if inductor:
        peak = min(peak, estimate(earliest_inputs_first(nodes), canons, inductor).peak)
    return peak


def most_alive_at_once(members: Iterable[fx.Node], est: LiveEstimate, nbytes: Sequence[float]) -> float:
    """The largest total of ``nbytes`` over members whose storages are alive together in the
    current order (a sweep over their [position, last reader] intervals)."""
    events: list[tuple[int, int, float]] = []
    for node, size in zip(members, nbytes, strict=True):
        start = est.pos.get(node)
        if start is None:
            continue
        events.append((start, 0, size))  # starts sort before ends at the same position
        events.append((est.last.get(node, start), 1, -size))
    best = cur = 0.0
    for _, _, size in sorted(events):
        cur += size
        best = max(best, cur)
    return best


def horizontal_live(
    nodes: Sequence[fx.Node], est: LiveEstimate, fresh_inputs: float = 0.0, kept: float = 0.0
) -> tuple[float, float]:
    """(before, after) live bytes of fusing ``nodes`` into one op whose output is stacked.

    before: the most member outputs the current order holds at once. after: all member outputs
    together (one stacked buffer lives until its last piece dies), plus ``fresh_inputs`` (stacked
    input copies, alive beside the originals while the fused op runs) and ``kept`` (per-call
    buffers such as weights stacked at run time)."""
    sizes = [float(output_bytes(n)) for n in nodes]  # members are fresh ops (linear, norm, ...)
    return most_alive_at_once(nodes, est, sizes), sum(sizes) + fresh_inputs + kept
