"""Capture a module as FX graph(s) the way torch.compile does (Dynamo).

Strategy, in order:

1. the module is already a ``GraphModule``: optimize a copy of its graph (parameters shared);
2. ``torch._dynamo.export``: one whole graph of torch-level ops. Python loops over ``split``
   outputs, list comprehensions and ``nn.ModuleList`` are unrolled; parameters are ``get_attr``
   nodes reading the module's *own* parameters, so gradients land on them;
3. if export fails (a graph break, an input Dynamo cannot export, e.g. a torchrec
   ``KeyedJaggedTensor``, or Python side effects in ``forward``, which a graph would drop: see
   :func:`export`): ``torch.compile(module, backend=<optimus, eager>)``. Dynamo splits the
   model into graphs at the breaks; each graph is optimized and run eagerly (no Inductor), and the
   rest runs as Python. The returned ``GraphModule`` has one ``call_module`` node calling that
   compiled module; ``optimus_report`` aggregates every graph (``report.graphs``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import fx, nn

from optimus.capture import numpy_constants

log = logging.getLogger("optimus")


def check_inputs(module: nn.Module, example_inputs: Any) -> tuple[Any, ...]:
    """Inputs as a tuple; ValueError if they are not a sequence or do not fit ``module.forward``."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (list, tuple)):
        raise ValueError(
            f"example_inputs must be a tuple/list of the module's positional inputs, got {type(example_inputs).__name__}"
        )
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    inputs = tuple(example_inputs)
    try:
        inspect.signature(module.forward).bind(*inputs)
    except TypeError as exc:
        raise ValueError(f"example_inputs do not match {type(module).__name__}.forward: {exc}") from exc
    except ValueError:
        pass  # no introspectable signature
    # Not run here: running forward would be a side effect of optimize() (see caller_state.py).
    # Inputs that bind but do not fit make both captures fail; api.py then runs the module
    # eagerly on copies and raises the ValueError.
    return inputs


class SideEffectsInForward(RuntimeError):
    """``forward`` has Python side effects (an attribute assignment, a list append, a global):
    an exported graph would drop them at every call, so the export path is not taken."""


_SIDE_EFFECTS_MESSAGE = "side effects happened in the model.forward"


def export(module: nn.Module, inputs: Sequence[Any]) -> fx.GraphModule:
    """One whole Dynamo graph (raises if there is a graph break or an unexportable input, and
    :class:`SideEffectsInForward` if ``forward`` has Python side effects).

    Side effects: an exported graph is tensor ops only; Dynamo replays a forward's Python side
    effects (``self.last = y``, ``self.log.append(1)``) in bytecode around the graph, which
    export runs once, on FakeTensors, and then drops. ``side_effect_replay_policy="error"``
    makes Dynamo raise at that point instead, before anything runs, naming the mutated objects.

    NumPy array attributes that ``forward`` only copies into tensors are held as constants of the
    graph (:mod:`optimus.capture.numpy_constants`; the arrays are listed in the graph module's
    ``_optimus_numpy_groups``), which the optimized graph reads at each call;
    :class:`~optimus.capture.numpy_constants.NotConstant` where such an array may not be one.
    """
    try:
        with (
            static_shape_guards_skipped(),
            torch._dynamo.config.patch(side_effect_replay_policy="error"),
            numpy_constants.held_as_constants(module) as held,
        ):
            gm, _guards = torch._dynamo.export(module, aten_graph=False, assume_static_by_default=True)(
                *inputs
            )
    except numpy_constants.NotConstant:
        raise
    except Exception as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, numpy_constants.NotConstant):
            raise cause from exc
        text = str(exc)
        if _SIDE_EFFECTS_MESSAGE in text:
            sources = (
                text[text.find("check:") + len("check:") :].strip().splitlines()[0]
                if "check:" in text
                else ""
            )
            raise SideEffectsInForward(f"forward has Python side effects: {sources}".strip()) from exc
        raise
    numpy_constants.as_plain_attributes(gm, held)
    return gm


@contextlib.contextmanager
def static_shape_guards_skipped() -> Iterator[None]:
    """Within the block, Dynamo builds no shape guards for static dimensions.

    Why: in export mode Dynamo writes a guard for every static size and stride of every tensor
    it saw (``ShapeEnv.produce_guards_verbose(ignore_static=False)``), and renders each one to
    Python source. On the towers model at scale medium (688 tensors) that was more than half of
    ``optimize()``'s time (capture 10.1 s -> 4.4 s with this, same graph). ``optimize`` throws the
    export's guards away, so the graph is unchanged; torch.compile mode already skips them
    (``ignore_static=True`` there). On a torch without this method, nothing is patched.
    """
    from torch.fx.experimental import symbolic_shapes

    cls = symbolic_shapes.ShapeEnv
    original = cls.__dict__.get("produce_guards_verbose")
    if original is None:
        yield
        return

    def produce_guards_verbose(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["ignore_static"] = True
        return original(self, *args, **kwargs)

    cls.produce_guards_verbose = produce_guards_verbose  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.produce_guards_verbose = original  # type: ignore[method-assign]


class CompiledWrapper(nn.Module):
    """Holds the torch.compile'd module so a GraphModule can call it (graph-break fallback)."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args: Any) -> Any:
        return self.compiled(*args)


def wrap_compiled(compiled: Callable[..., Any], n_inputs: int) -> fx.GraphModule:
    root = nn.Module()
    root.compiled = CompiledWrapper(compiled)
    graph = fx.Graph()
    args = [graph.placeholder(f"arg{i}") for i in range(n_inputs)]
    graph.output(graph.call_module("compiled", tuple(args)))
    return fx.GraphModule(root, graph)
