"""Count the FX nodes of the Dynamo capture of a dense arch, the graph Optimus and Inductor see.

Why this way: `torch.compile(..., backend=counting)` runs the real Dynamo front end (the same
capture as `torch.compile(dense, fullgraph=True)`) but hands the graph to a backend that only
counts it, so no Inductor/C++ compile happens. Parameters are lifted to placeholders by Dynamo,
so a Linear is 1 call plus 2 placeholder nodes; `dense_nodes` counts every node of the graph.

The capture goes through a wrapper function with a fresh code object each time, whose cache
entry is dropped afterwards: the cache of the dense class's own `forward` is never touched (a
model compiled elsewhere in the process keeps its compiled code) and repeated captures never hit
Dynamo's recompile limit. `dynamic=False` pins shapes so the count never depends on what was
compiled before (automatic dynamic shapes would add symbolic-size nodes).
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, fx, nn

_serial = itertools.count()


def _call(module: nn.Module, *args: Tensor) -> Any:
    return module(*args)


def capture(module: nn.Module, inputs: Sequence[Tensor]) -> fx.GraphModule:
    """The Dynamo FX graph of `module(*inputs)` (fullgraph, static shapes), no compilation."""
    graphs: list[fx.GraphModule] = []

    def backend(gm: fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    code = _call.__code__.replace(co_name=f"_optimus_models_capture_{next(_serial)}")
    fn = types.FunctionType(code, _call.__globals__)
    try:
        with torch.no_grad():
            torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)(module, *inputs)
    finally:
        from torch._C._dynamo.eval_frame import reset_code

        reset_code(code)
    if len(graphs) != 1:
        raise RuntimeError(f"expected one Dynamo graph for {type(module).__name__}, got {len(graphs)}")
    return graphs[0]


def count_nodes(gm: fx.GraphModule) -> int:
    return len(gm.graph.nodes)


def count_dense_nodes(dense: nn.Module, inputs: Sequence[Tensor]) -> int:
    return count_nodes(capture(dense, inputs))
