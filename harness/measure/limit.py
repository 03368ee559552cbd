"""The limit of a cell: the step time an ideal rewrite could reach on this device.

Why: a speedup alone does not say whether a rewrite left much on the table. For the reference
cells (``compile``, read against ``compile+optimus``) this estimates

    ideal = T_ref - members + batched

- ``T_ref``: the cell's own median step time (the unfused model, as that mode runs it);
- the *fusable groups*: the horizontal groups Optimus's rules find in the dense arch's captured
  graph (the cleanup rules run first, then every priced rule's ``match``; overlapping candidates
  are resolved as the driver does, best-rated first, one group per node). Every group counts,
  also one the cost model would decline: the limit is what an ideal rewrite could reach, not what
  this cost model picks;
- ``members``: what the groups' members cost inside the compiled dense arch: the captured graph
  timed whole, minus the same graph with every member cut out (its output a graph input, its
  inputs kept as outputs so nothing upstream turns into dead code and, in train, the backward
  still reaches it). Timing the members standalone instead priced them above the whole compiled
  step on towers tiny (each op its own kernel, where Inductor fuses many into their neighbours);
- ``batched``: one ideal batched kernel per group, on inputs that are already stacked and weights
  stored pre-stacked in the layout the kernel wants (linear: one ``baddbmm`` over [G, rows, K] x
  [G, K, N], as ``optimus-bench headroom``'s "ideal"; linears sharing one input: one wide
  ``linear``; layer_norm: one ``layer_norm`` over [G, ...] plus one stacked affine; pointwise: the
  op over the stacked tensor).

Everything else (the over-arch and expert GEMMs, the embedding bags, the loss and optimizer step,
ops no rule groups) stays at its measured cost: ``untouched = T_ref - members``. The three
programs (whole, cut, batched) are compiled as the cell's mode compiles (Inductor for
``compile``) and timed side by side, interleaved, in the cell's own process after its own
measurements. In ``train`` a call is forward plus the backward to every input that requires grad
in the model's step (the pooled embeddings) and every weight.

The report then shows, per model and phase: ideal speedup ``T_ref / ideal``, achieved speedup
``T_ref / T_optimus`` and the share of the headroom captured ``(T_ref - T_optimus) / (T_ref -
ideal)`` (None when there is no headroom: no groups, or batching saves nothing).

It is an estimate (docs/harness.md, "The limit"): cutting the members out also changes what
Inductor can fuse around them, the batched kernels are timed standalone, it assumes inputs
arrive stacked (an ideal rewrite upstream would produce them so), pads different-shape linears to one batched GEMM, and leaves rules it cannot price (``unpriced``:
embedding gathers, split/cat rewrites, ...) in the untouched part. ``ideal`` is floored at the
batched kernels' own time when noise would push it below (``clamped``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Modes whose cells carry a limit, and the optimized mode each is read against. Not eager: its
# step includes nn.Module dispatch that capturing the graph alone removes (eager+optimus read
# 320% of the "headroom" on towers tiny that way), so that limit would not bound anything.
REFERENCES = {"compile": "compile+optimus"}
# Rules whose groups are priced here, by the kind of their members' op.
PRICED_RULES = (
    "merge_shared_linear",
    "batch_linear",
    "batch_size1_linear",
    "group_linear",
    "batch_layer_norm",
    "batch_unary",
    "batch_binary",
)
_COMMUTATIVE = ("add", "mul", "maximum", "minimum")

Timer = Callable[[dict[str, Callable[[], Any]]], dict[str, float]]  # name -> step; -> name -> ms/call


# -- the formulas (pure: the report and the tests use them) ------------------------------------
def derive(reference_ms: float, members_ms: float, batched_ms: float) -> dict[str, Any]:
    """ideal = reference - (members - batched), the saving never negative (an ideal rewrite
    would not batch a group that batching slows), floored at min(batched, reference)."""
    saving = max(0.0, members_ms - batched_ms)
    raw = reference_ms - saving
    floor = min(batched_ms, reference_ms)
    ideal = max(raw, floor)
    return {
        "ideal_ms": ideal,
        "ideal_speedup": reference_ms / ideal if ideal > 0 else None,
        "saving_ms": saving,
        "clamped": raw < floor,
    }


def captured(reference_ms: float, target_ms: float, ideal_ms: float) -> float | None:
    """Share of the headroom a rewrite captured: (ref - target) / (ref - ideal). None when there
    is no headroom (ideal == ref). Below 0: the rewrite is slower than the reference; above 1:
    faster than the estimated limit (which ignores inter-op effects, see the module docstring)."""
    headroom = reference_ms - ideal_ms
    if not headroom > 1e-9 * max(reference_ms, 1e-30):
        return None
    return (reference_ms - target_ms) / headroom


def summary(ref_cell: dict[str, Any] | None, target_cell: dict[str, Any] | None) -> dict[str, Any] | None:
    """The limit figures of one (model, scale, phase): the reference cell's ``limit`` with the
    target's achieved speedup and captured share; None when the reference has no measured limit."""
    if ref_cell is None or ref_cell.get("status") != "ok":
        return None
    lim = ref_cell.get("limit")
    if not isinstance(lim, dict) or lim.get("ideal_ms") is None:
        return None
    ref_ms = float(ref_cell["latency_ms"]["median"])
    out = {
        k: lim.get(k)
        for k in ("ideal_ms", "ideal_speedup", "groups", "members", "clamped", "method", "unpriced")
    }
    out["reference_ms"] = ref_ms
    out["target_ms"] = out["achieved"] = out["captured"] = None
    out["target_status"] = None if target_cell is None else target_cell.get("status")
    if target_cell is not None and target_cell.get("status") == "ok":
        t_ms = float(target_cell["latency_ms"]["median"])
        out["target_ms"] = t_ms
        out["achieved"] = ref_ms / t_ms if t_ms > 0 else None
        out["captured"] = captured(ref_ms, t_ms, float(lim["ideal_ms"]))
    return out


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per reference cell that has a limit (model, scale, phase, reference mode)."""
    from harness.spec import CellKey
    from harness.store.results import cell_map

    cells = cell_map(doc)
    out = []
    for key, c in cells.items():
        target = REFERENCES.get(key.mode)
        if target is None:
            continue
        s = summary(c, cells.get(CellKey(key.model, key.scale, target, key.phase)))
        if s is not None:
            out.append({"model": key.model, "scale": key.scale, "phase": key.phase, "reference": key.mode,
                        "target": target, **s})  # fmt: skip
    out.sort(key=lambda r: (r["model"], r["scale"], r["phase"] != "infer", r["reference"] != "compile"))
    return out


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


def format_table(doc: dict[str, Any]) -> str:
    """Markdown: the limit per model, phase and reference mode (empty string when none)."""
    found = rows(doc)
    if not found:
        return ""
    lines = [
        "| model | scale | phase | reference | ref ms | ideal ms | optimized ms | ideal speedup | achieved "
        "| headroom captured | groups (members) | unpriced |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in found:
        opt = "-" if r["target_ms"] is None else f"{r['target_ms']:.3f}"
        if r["target_ms"] is None and r["target_status"]:
            opt = str(r["target_status"])
        cap = "- (no headroom)" if r["captured"] is None and r["target_ms"] is not None else "-"
        if r["captured"] is not None:
            cap = f"{r['captured']:.0%}"
        unpriced = ", ".join(f"{k} {v}" for k, v in sorted((r["unpriced"] or {}).items())) or "-"
        lines.append(
            f"| {r['model']} | {r['scale']} | {r['phase']} | {r['reference']} | {r['reference_ms']:.3f} "
            f"| {r['ideal_ms']:.3f}{' ‡' if r['clamped'] else ''} | {opt} | {_x(r['ideal_speedup'])} "
            f"| {_x(r['achieved'])} | {cap} | {r['groups']} ({r['members']}) | {unpriced} |"
        )
    lines += [
        "",
        "ideal = ref - members + batched: members = (the captured dense graph) - (the same graph with every "
        "fusable group's members cut out), batched = one ideal batched kernel per group on pre-stacked "
        "inputs and weights, all three compiled as the reference compiles and timed side by side; "
        "ideal speedup = ref / ideal; achieved = ref / optimized; headroom captured = (ref - optimized) / "
        "(ref - ideal). ‡: floored at the batched kernels' own time (noise). ref and optimized are two "
        "cells timed minutes apart (load drift lands in achieved and captured; see the † marks above). "
        "An estimate (docs/harness.md, 'The limit').",
    ]
    return "\n".join(lines)


# -- the groups ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Slot:
    """A tensor operand of a member op: index into ``Plan.tensors``."""

    index: int


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: Any  # torch.dtype
    device: Any  # torch.device
    grad: bool  # requires grad in the captured graph (a parameter, or a value computed from one)


@dataclass
class Member:
    op: str  # canonical op, as optimus.dry_run names it
    kwargs: dict[str, Any]  # canonical kwargs, tensor operands as Slot
    call: Callable[..., Any] = field(default=lambda **kw: None, repr=False)  # the op, on canonical kwargs
    operands: tuple[str, ...] = ()  # the op's first two argument names
    kind: str = ""  # "linear" | "layer_norm" | "unary" | "binary"


@dataclass
class Group:
    rule: str
    kind: str  # "linear" | "layer_norm" | "unary" | "binary"
    members: list[Member]
    nodes: tuple[Any, ...] = ()  # the members' nodes in ``Plan.gm``

    def describe(self, tensors: Sequence[TensorSpec]) -> dict[str, Any]:
        first = self.members[0].kwargs
        x = first.get("input")
        return {
            "rule": self.rule,
            "kind": self.kind,
            "op": self.members[0].op,
            "members": len(self.members),
            "input_shape": list(tensors[x.index].shape) if isinstance(x, Slot) else None,
        }


@dataclass
class Plan:
    tensors: list[TensorSpec] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    unpriced: dict[str, int] = field(default_factory=dict)  # rule -> candidates not priced
    gm: Any = None  # the captured graph the groups were found in (the dry run's copy)
    dry: Any = None  # the optimus.DryRun the groups come from: tensor metadata of gm's nodes


def _priced_candidates(gm: Any, inductor: bool, plan: Plan) -> list[Any]:
    """The rewrites the driver would try on ``gm``, priced for Inductor or eager, best first
    (``optimus.dry_run``: the driver's own order, on a copy after the cleanup rules; ``plan.gm``
    becomes that copy). Rewrites of rules without a price are counted in ``plan.unpriced``."""
    import optimus

    dry = optimus.dry_run(gm, cost_model=optimus.AnalyticCostModel(inductor=inductor))
    plan.gm, plan.dry = dry.graph, dry
    priced = []
    for rewrite in dry.rewrites:
        if rewrite.rule in PRICED_RULES:
            priced.append(rewrite)
        else:
            plan.unpriced[rewrite.rule] = plan.unpriced.get(rewrite.rule, 0) + 1
    return priced


def _operands(plan: Plan) -> Callable[[Any], Any]:
    """``operand(v)``: a node's value as the plan holds it (a ``Slot`` of ``plan.tensors`` for a
    tensor, the number for a known scalar, None when unknown); lists item by item."""
    from torch import fx

    slots: dict[fx.Node, Slot] = {}

    def slot(node: fx.Node) -> Slot | None:
        if node in slots:
            return slots[node]
        info = plan.dry.tensor(node)
        if info is None:
            return None
        slots[node] = Slot(len(plan.tensors))
        plan.tensors.append(TensorSpec(info.shape, info.dtype, info.device, info.requires_grad))
        return slots[node]

    def operand(v: Any) -> Any:
        if isinstance(v, fx.Node):
            if plan.dry.tensor(v) is not None:
                return slot(v)
            found = plan.dry.value(v)
            return found if isinstance(found, int | float | bool) else None
        if isinstance(v, (list, tuple)):
            items = [operand(i) for i in v]
            return (
                None
                if any(i is None and o is not None for i, o in zip(items, v, strict=True))
                else type(v)(items)
            )
        return v

    return operand


def _members(rewrite: Any, operand: Callable[[Any], Any]) -> list[Member] | None:
    """The rewrite's members as plan members, or None when one cannot be one (not a fusable
    kind, in place, or an operand whose value is not known here)."""
    members = []
    for m in rewrite.members:
        if m.op is None or m.kind is None or m.inplace:
            return None
        kwargs = {k: operand(v) for k, v in m.kwargs.items()}
        if any(kwargs[k] is None and m.kwargs[k] is not None for k in kwargs):
            return None  # an operand whose value is not known here
        if m.kind == "binary":
            swapped = _tensor_first(m.op, m.operands, kwargs)
            if swapped is None:
                return None
            kwargs = swapped
        members.append(Member(m.op, kwargs, m.call, m.operands, m.kind))
    return members


def find_plan(gm: Any, inductor: bool = True) -> Plan:
    """The fusable groups of a captured graph (``gm`` itself is left as it is)."""
    plan = Plan(gm=gm)
    rewrites = _priced_candidates(gm, inductor, plan)
    operand = _operands(plan)
    touched: set[Any] = set()
    for rewrite in rewrites:
        if any(n in touched for n in rewrite.nodes):
            continue
        members = _members(rewrite, operand)
        if members is not None:
            kinds = {m.kind for m in members}
            if len(kinds) == 1 and len({m.op for m in members}) == 1:
                touched.update(rewrite.nodes)
                plan.groups.append(Group(rewrite.rule, kinds.pop() or "", members, tuple(rewrite.nodes)))
                continue
        plan.unpriced[rewrite.rule] = plan.unpriced.get(rewrite.rule, 0) + 1
    return plan


def _tensor_first(op: str, operands: tuple[str, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """A binary op's kwargs with a tensor as the first operand (``2 * x`` -> ``x * 2``)."""
    first, second = operands
    if isinstance(kwargs[first], Slot):
        return kwargs
    if isinstance(kwargs[second], Slot) and op in _COMMUTATIVE and kwargs.get("alpha", 1) == 1:
        return {**kwargs, first: kwargs[second], second: kwargs[first]}
    return None


# -- the two standalone programs ---------------------------------------------------------------
class _Specs:
    """The stacked tensors' specs of one group, shaped after its members' tensors."""

    def __init__(self, group: Group, tensors: Sequence[TensorSpec]) -> None:
        self.members, self.tensors = group.members, tensors

    def spec(self, shape: Sequence[int], like: Slot, grad: bool | None = None) -> TensorSpec:
        t = self.tensors[like.index]
        return TensorSpec(tuple(int(d) for d in shape), t.dtype, t.device, t.grad if grad is None else grad)

    def any_grad(self, name: str) -> bool:
        return any(
            isinstance(m.kwargs[name], Slot) and self.tensors[m.kwargs[name].index].grad for m in self.members
        )

    def of(self, name: str) -> TensorSpec:
        """The first member's ``name`` tensor."""
        return self.tensors[self.members[0].kwargs[name].index]


def _linear_kernel(group: Group, sp: _Specs) -> tuple[Callable[..., Any], list[TensorSpec]]:
    import torch
    import torch.nn.functional as F

    ms, g, first = group.members, len(group.members), group.members[0].kwargs
    xs = [sp.tensors[m.kwargs["input"].index] for m in ms]
    ws = [sp.tensors[m.kwargs["weight"].index] for m in ms]
    bias = first["bias"] is not None
    if len({m.kwargs["input"] for m in ms}) == 1:  # one input: one wide linear over the weights side by side
        n = sum(w.shape[0] for w in ws)
        specs = [xs[0], sp.spec((n, ws[0].shape[1]), first["weight"], sp.any_grad("weight"))]
        if bias:
            specs.append(sp.spec((n,), first["bias"], sp.any_grad("bias")))
        return (lambda x, w, b=None: F.linear(x, w, b)), specs
    rows = max(math.prod(x.shape[:-1]) for x in xs)
    k = max(w.shape[1] for w in ws)
    n = max(w.shape[0] for w in ws)
    specs = [
        sp.spec((g, rows, k), first["input"], sp.any_grad("input")),
        sp.spec((g, k, n), first["weight"], sp.any_grad("weight")),
    ]
    if bias:
        specs.append(sp.spec((g, 1, n), first["bias"], sp.any_grad("bias")))
        return torch.baddbmm, [specs[2], specs[0], specs[1]]
    return torch.bmm, specs


def _layer_norm_kernel(group: Group, sp: _Specs) -> tuple[Callable[..., Any], list[TensorSpec]]:
    import torch
    import torch.nn.functional as F

    g, first = len(group.members), group.members[0].kwargs
    x = sp.of("input")
    ns = first["normalized_shape"]
    ns = (ns,) if isinstance(ns, int) else tuple(ns)
    eps = first["eps"]
    affine_shape = (g, *([1] * (len(x.shape) - len(ns))), *ns)
    specs = [sp.spec((g, *x.shape), first["input"], sp.any_grad("input"))]
    has_w, has_b = first["weight"] is not None, first["bias"] is not None
    if has_w:
        specs.append(sp.spec(affine_shape, first["weight"], sp.any_grad("weight")))
    if has_b:
        specs.append(sp.spec(affine_shape, first["bias"], sp.any_grad("bias")))

    def layer_norm(x: Any, *affine: Any) -> Any:
        out = F.layer_norm(x, ns, None, None, eps)
        if has_w and has_b:
            return torch.addcmul(affine[1], out, affine[0])
        if has_w:
            return out * affine[0]
        return out + affine[0] if has_b else out

    return layer_norm, specs


def _elementwise_kernel(group: Group, sp: _Specs) -> tuple[Callable[..., Any], list[TensorSpec]]:
    g, first, call = len(group.members), group.members[0].kwargs, group.members[0].call
    if group.kind == "unary":
        x = sp.of("input")
        settings = {k: v for k, v in first.items() if k != "input"}
        kernel = lambda x: call(input=x, **settings)  # noqa: E731
        return kernel, [sp.spec((g, *x.shape), first["input"], sp.any_grad("input"))]
    a_name, b_name = group.members[0].operands
    rest = {k: v for k, v in first.items() if k not in (a_name, b_name)}
    specs = [sp.spec((g, *sp.of(a_name).shape), first[a_name], sp.any_grad(a_name))]
    if isinstance(first[b_name], Slot):
        specs.append(sp.spec((g, *sp.of(b_name).shape), first[b_name], sp.any_grad(b_name)))
        return (lambda x, y: call(**{a_name: x, b_name: y}, **rest)), specs
    scalar = first[b_name]
    return (lambda x: call(**{a_name: x, b_name: scalar}, **rest)), specs


def _batched_kernel(
    group: Group, tensors: Sequence[TensorSpec]
) -> tuple[Callable[..., Any], list[TensorSpec]]:
    """(kernel over pre-stacked tensors, their specs) for one group."""
    sp = _Specs(group, tensors)
    if group.kind == "linear":
        return _linear_kernel(group, sp)
    if group.kind == "layer_norm":
        return _layer_norm_kernel(group, sp)
    return _elementwise_kernel(group, sp)


def batched_program(plan: Plan) -> tuple[Callable[..., tuple[Any, ...]], list[TensorSpec]]:
    """One ideal batched kernel per group, on pre-stacked tensors."""
    kernels, specs, counts = [], [], []
    for g in plan.groups:
        fn, s = _batched_kernel(g, plan.tensors)
        kernels.append(fn)
        specs += s
        counts.append(len(s))

    def batched(*ts: Any) -> tuple[Any, ...]:
        outs, i = [], 0
        for fn, n in zip(kernels, counts, strict=True):
            outs.append(fn(*ts[i : i + n]))
            i += n
        return tuple(outs)

    return batched, specs


def context_programs(plan: Plan) -> tuple[Any, Any, list[Any]]:
    """(whole, cut, cut nodes): the captured graph as one flat program, and the same graph with
    every group member cut out, its output a graph input instead (after the original inputs, in
    graph order). Both return the graph's tensor outputs and every member's inputs (kept alive in
    the cut program, so nothing upstream of a member becomes dead code and, in train, the
    backward still reaches it), so whole - cut is what the members cost in the compiled model,
    forward and backward, with whatever Inductor fuses around them."""
    from torch import fx

    gm = plan.gm
    members = {n for g in plan.groups for n in g.nodes}
    outputs: list[fx.Node] = []
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    fx.node.map_arg(out_node.args, lambda n: outputs.append(n) or n)  # type: ignore[func-returns-value]
    keep = [a for n in gm.graph.nodes if n in members for a in n.all_input_nodes]
    keep = [a for a in keep if a not in members and a.op not in ("placeholder", "get_attr")]
    returned = [n for n in dict.fromkeys([*outputs, *keep]) if plan.dry.tensor(n) is not None]
    cut_nodes = [n for n in gm.graph.nodes if n in members]

    def build(cut: bool) -> Any:
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                env[n] = graph.placeholder(n.name)
        for n in cut_nodes if cut else []:
            env[n] = graph.placeholder(f"cut_{n.name}")
        for n in gm.graph.nodes:
            if n.op not in ("placeholder", "output") and n not in env:
                env[n] = graph.node_copy(n, lambda a: env[a])
        graph.output(tuple(env[n] for n in returned))
        graph.eliminate_dead_code()
        return fx.GraphModule(gm, graph)

    return build(False), build(True), cut_nodes


# -- measuring ------------------------------------------------------------------------------
def make_tensors(specs: Sequence[TensorSpec], train: bool) -> list[Any]:
    """Fresh tensors of the specs: floats in [0.5, 1.5) (no NaN for log/sqrt/div), integers 1."""
    import torch

    out = []
    for s in specs:
        if s.dtype.is_floating_point:
            t = torch.rand(s.shape, dtype=s.dtype, device=s.device) + 0.5
            t.requires_grad_(train and s.grad)
        else:
            t = torch.ones(s.shape, dtype=s.dtype, device=s.device)
        out.append(t)
    return out


def step_of(
    fn: Callable[..., tuple[Any, ...]], ts: Sequence[Any], train: bool, params: Sequence[Any] = ()
) -> Callable[[], Any]:
    """One call: no_grad forward (infer), or forward plus the gradients of every input and
    parameter that requires grad (train; ``autograd.grad``, so nothing accumulates into ``.grad``)."""
    import torch

    leaves = [t for t in (*ts, *params) if t.requires_grad]
    ones: list[Any] = []

    def step() -> Any:
        if not train or not leaves:
            with torch.no_grad():
                return fn(*ts)
        outs = [o for o in fn(*ts) if o.requires_grad]
        if not outs:
            return outs
        if not ones:
            ones.extend(torch.ones_like(o) for o in outs)
        return torch.autograd.grad(outs, leaves, ones, allow_unused=True)

    return step


def default_timer(
    steps: dict[str, Callable[[], Any]], sync: Callable[[], None] = lambda: None
) -> dict[str, float]:
    """Median ms per call of each step, timed side by side (``harness.measure.timing.interleave``):
    11 rounds of about 10 ms of calls each per step."""
    from harness.measure.timing import Contender, interleave

    for s in steps.values():
        for _ in range(3):
            s()
    sync()
    longest = 0.0
    for s in steps.values():
        t0 = time.perf_counter()
        s()
        sync()
        longest = max(longest, time.perf_counter() - t0)
    n = max(1, min(100, int(0.01 / max(longest, 1e-6))))
    contenders = [Contender(name, s, 0.0, None) for name, s in steps.items()]
    rounds = interleave(contenders, rounds=11, steps=n, warmup=0, sync=sync)
    return {name: float(statistics.median(v)) for name, v in rounds.items()}


def measure(
    plan: Plan,
    reference_ms: float,
    example: Sequence[Any],
    *,
    train: bool,
    compiled: bool,
    timer: Timer | None = None,
    compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """The cell's ``limit`` record: the plan's groups timed in context and batched, and
    ``derive``'s figures. ``example``: the captured graph's inputs (their ``requires_grad`` as in
    the model's step: in train the pooled embeddings require grad, the dense features do not).

    ``timer`` and ``compile_fn`` are seams (tests pass fakes); by default the three programs are
    ``torch.compile``d when ``compiled`` and timed side by side with :func:`default_timer`."""
    t0 = time.perf_counter()
    timed = {"whole": 0.0, "cut": 0.0, "batched": 0.0}
    if plan.groups:
        if compile_fn is None:
            compile_fn = _inductor if compiled else (lambda f: f)
        whole, cut, cut_nodes = context_programs(plan)
        infos = [plan.dry.tensor(n) for n in cut_nodes]
        cut_specs = [TensorSpec(i.shape, i.dtype, i.device, i.requires_grad) for i in infos if i is not None]
        inputs = list(example)
        bat, bat_specs = batched_program(plan)
        steps = {
            "whole": step_of(compile_fn(whole), inputs, train, list(whole.parameters())),
            "cut": step_of(
                compile_fn(cut), inputs + make_tensors(cut_specs, train), train, list(cut.parameters())
            ),
            "batched": step_of(compile_fn(bat), make_tensors(bat_specs, train), train),
        }
        timed = {k: float(v) for k, v in (timer or (lambda s: default_timer(s, sync)))(steps).items()}
    members_ms = timed["whole"] - timed["cut"]
    kinds: dict[str, int] = {}
    for g in plan.groups:
        kinds[g.kind] = kinds.get(g.kind, 0) + 1
    return {
        "method": "members in context (whole - cut graph), "
        + ("Inductor" if compiled else "eager")
        + (", fwd+bwd" if train else ""),
        "reference_ms": reference_ms,
        "whole_ms": timed["whole"],
        "cut_ms": timed["cut"],
        "members_ms": members_ms,
        "batched_ms": timed["batched"],
        "untouched_ms": reference_ms - max(0.0, members_ms),
        **derive(reference_ms, members_ms, timed["batched"]),
        "groups": len(plan.groups),
        "members": sum(len(g.members) for g in plan.groups),
        "kinds": kinds,
        "unpriced": dict(plan.unpriced),
        "group_list": [g.describe(plan.tensors) for g in plan.groups],
        "measure_s": time.perf_counter() - t0,
    }


def _inductor(fn: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    return torch.compile(fn, fullgraph=True, dynamic=False)


def graph_inputs(example: Sequence[Any], input_grads: Sequence[bool] | None, train: bool) -> list[Any]:
    """Copies of the dense arch's example inputs, requiring grad where the model's step does."""
    flags = list(input_grads or [])
    out = []
    for i, t in enumerate(example):
        t = t.detach().clone()
        if train and i < len(flags) and flags[i] and t.dtype.is_floating_point:
            t.requires_grad_(True)
        out.append(t)
    return out


def capture(dense: Any, example: Sequence[Any], train: bool) -> Any:
    """The dense arch as one Dynamo graph with shapes recorded (what Optimus's rules match on)."""
    import optimus

    return optimus.capture_graph(dense, example, train)


def measure_cell(
    dense: Any,
    example: Sequence[Any],
    reference_ms: float,
    *,
    train: bool,
    compiled: bool,
    device: str,
    input_grads: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """A cell's ``limit``: capture ``dense`` (the unprepared dense arch), find its groups, time them."""
    import torch

    t0 = time.perf_counter()
    inputs = graph_inputs(example, input_grads, train)
    gm = capture(dense, inputs, train)
    if len([n for n in gm.graph.nodes if n.op == "placeholder"]) != len(inputs):
        raise RuntimeError("the captured graph's inputs do not line up with the dense arch's inputs")
    plan = find_plan(gm, inductor=compiled)
    sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = measure(plan, reference_ms, inputs, train=train, compiled=compiled, sync=sync)
    out["measure_s"] = time.perf_counter() - t0
    return out
