"""The estimated peak of one training step of a graph: its forward and its backward, together.

WHY: a training step's peak is in its backward (towers tiny and medium: the one stacked
layer-norm backward holds every member's intermediates at once, where compile's peak is in the
embedding tables' backward). The forward estimate (``optimus.memory.live``) cannot see that: on
towers medium it called the fused graph free (+0.0%) where the step measured +35.0% over compile.

How: the graph's forward and the gradients of its parameters are recorded together into one
ATen graph (the forward and ``torch.autograd.grad`` run on fake tensors under a dispatch mode
that records each op: no memory, no kernels, seconds at large), and that graph's live bytes are
estimated like any graph's, in the order its runtime would run it (``live.scheduled_peak``). In the joint graph a forward value the backward reads is
alive until its last backward reader: autograd's saved tensors, freed when the backward is done
with them. The parameters are its inputs (held throughout, as they are) and their gradients its
outputs (alive to the step's end, as ``.grad`` is).

What it leaves out, so it is a comparison, not a measurement:

- Inductor's partitioner recomputes cheap pointwise values in the backward instead of saving
  them; the estimate's Inductor model (a pointwise value computed inside its readers holds no
  buffer) stands in for that;
- the work outside the graph (the embedding tables' backward, the optimizer), whose peak may be
  above the graph's: the estimate is of the graph's own part.

Measured against the harness's step peak (compile -> compile+optimus, training, the whole run
fused), and what the ceiling (2%) does with it:

| cell | this estimate | measured | the ceiling |
| --- | --- | --- | --- |
| towers tiny | +20.3% | +40.9% | left as captured: +0.0% measured |
| towers medium | +3.5% | +35.0% | left as captured: +0.0% measured |
| towers large | +0.3% | +0.0% | kept |
| dlrm medium | +0.0% | +0.0% | kept |

The other training cells at tiny, medium and large estimate +0.0% or less and are kept, as
measured (mmoe tiny: -3.5% estimated, +0.0% measured).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

from optimus.memory.live import scheduled_peak
from optimus.semantics.meta import TensorMeta, empty_of, output_requires_grad, value_meta
from optimus.semantics.normalize import canonicalize


def step_peak(gm: fx.GraphModule, inductor: bool) -> float:
    """Estimated live peak of one training step of ``gm`` (forward, then the gradients of its
    parameters and of its inputs that require grad), parameters included. Raises
    ``StepNotTraced`` where the step cannot be traced (an input of unknown shape, an op without
    a fake kernel, no output that needs a gradient)."""
    joint = joint_graph(gm)
    nodes = list(joint.graph.nodes)
    return scheduled_peak(nodes, {n: canonicalize(n, None) for n in nodes}, inductor)


class StepNotTraced(Exception):
    """The training step of a graph could not be traced on fake tensors (the message says why)."""


def joint_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm``'s forward and backward as one ATen graph, run on fake tensors and recorded op by op
    (``_Recorder``). ``gm``, its parameters and buffers, the grad mode and the RNG are left as
    they were.

    WHY a recorder and not ``make_fx``: ``make_fx`` builds the same graph through proxies at two
    to three times the cost, and the ceiling traces twice per training optimize. Side by side on
    a loaded machine, dlrm large training's captured and fused steps: 8.5 and 4.5 s through
    ``make_fx``, 3.1 and 1.7 s recorded, the same estimate to the byte (as on towers, mmoe and
    dlrm at tiny and medium)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    inputs = [_fake_input(n, fake_mode) for n in placeholders]
    params = {name: fake_mode.from_tensor(p) for name, p in gm.named_parameters()}
    buffers = {name: fake_mode.from_tensor(b) for name, b in gm.named_buffers()}
    recorder = _Recorder()
    for name, value in [*params.items(), *buffers.items()]:
        recorder.placeholder(value, name)
    for node, value in zip(placeholders, inputs, strict=True):
        recorder.placeholder(value, node.name)
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), fake_mode, recorder:
            out = functional_call(gm, {**params, **buffers}, tuple(inputs))
            outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
            if not outs:
                raise StepNotTraced("no output of the graph needs a gradient")
            wrt: list[torch.Tensor] = [p for p in params.values() if p.requires_grad]
            wrt += [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
            tangents = [torch.ones_like(o) for o in outs]
            grads = torch.autograd.grad(outs, wrt, tangents, allow_unused=True)
    except StepNotTraced:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise StepNotTraced(f"{type(exc).__name__}: {first}"[:200]) from exc
    recorder.graph.output([recorder.node_of(g) for g in grads if g is not None])
    return fx.GraphModule(torch.nn.Module(), recorder.graph)


class _Recorder(TorchDispatchMode):
    """Appends each ATen op run under it to an FX graph: a node per call, its arguments the nodes
    of the tensors it reads, ``meta["val"]`` the (fake) tensor it returns; a tensor it never saw
    made is a placeholder. Every recorded tensor is kept alive, so no ``id`` is reused."""

    def __init__(self) -> None:
        super().__init__()
        self.graph = fx.Graph()
        self._nodes: dict[int, fx.Node] = {}
        self._kept: list[torch.Tensor] = []

    def placeholder(self, value: Any, name: str) -> None:
        if isinstance(value, torch.Tensor) and id(value) not in self._nodes:
            node = self.graph.placeholder(name.replace(".", "_"))
            self._record(value, node)

    def node_of(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) not in self._nodes:
            self.placeholder(value, f"outside_{len(self._nodes)}")
        return self._nodes[id(value)]

    def _record(self, value: torch.Tensor, node: fx.Node) -> None:
        node.meta["val"] = value
        self._nodes[id(value)] = node
        self._kept.append(value)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not any(isinstance(o, torch.Tensor) for o in pytree.tree_leaves(out)):
            return out  # a query (``prim.device``, a size): no value to hold
        node_args, node_kwargs = pytree.tree_map(self.node_of, (args, kwargs))
        node = self.graph.call_function(func, tuple(node_args), dict(node_kwargs))
        if isinstance(out, torch.Tensor):
            self._record(out, node)
        elif isinstance(out, (tuple, list)):
            node.meta["val"] = tuple(out)
            for i, piece in enumerate(out):
                if isinstance(piece, torch.Tensor):
                    self._record(piece, self.graph.call_function(operator.getitem, (node, i)))
        return out


def _fake_input(node: fx.Node, fake_mode: Any) -> Any:
    """A fake tensor of the placeholder's recorded meta (requiring grad where the capture's example
    did); a non-tensor input as recorded."""
    meta = value_meta(node)
    if not isinstance(meta, TensorMeta):
        value = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(value, torch.Tensor) or value is None:
            raise StepNotTraced(f"input {node.name} has no recorded shape")
        return value
    with fake_mode:
        t = empty_of(meta)
    wants = output_requires_grad(node)
    if wants and t.dtype.is_floating_point:
        t.requires_grad_(True)
    return t
