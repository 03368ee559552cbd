"""Why ``compile+peer`` cells say "mismatch": Inductor's ``unbind_stack_to_slices_pass``.

Runs Inductor's pre-grad passes ONLY (``torch._inductor.fx_passes.pre_grad.pre_grad_passes``, no
Inductor codegen, so a run takes seconds, not a C++ compile) on a Dynamo graph, executes the
rewritten graph eagerly, and prints the largest difference from eager:

    PYTHONPATH=. python scripts/peer_mismatch.py                   # the few-line repro
    PYTHONPATH=. python scripts/peer_mismatch.py towers medium     # a model: all keys, then all
                                                                   # but that pass, then the pass
                                                                   # with the batch fusions only

See docs/perf.md "Why compile+peer cells say mismatch".
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch._inductor.fx_passes import group_batch_fusion, pre_grad, split_cat

CULPRIT = "unbind_stack_to_slices_pass"
ALL_KEYS = [*group_batch_fusion.PRE_GRAD_FUSIONS, *split_cat.PRE_GRAD_PATTERNS]


def pre_grad_only(
    fn: Callable[..., Any], inputs: Sequence[Any], keys: Sequence[str]
) -> tuple[Any, dict[str, int]]:
    """``fn(*inputs)`` after Inductor's pre-grad passes with ``keys`` on (run eagerly), and which fired."""
    torch._dynamo.reset()
    counters.clear()

    def backend(gm: torch.fx.GraphModule, example: Any) -> Any:
        with inductor_config.patch(pre_grad_fusion_options={k: {} for k in keys}):
            pre_grad.pre_grad_passes(gm, example)
        return gm.forward

    out = torch.compile(fn, backend=backend, dynamic=False)(*inputs)
    return out, {k: v for k, v in counters["inductor"].items() if v and k.endswith("_pass")}


def reordered_stack(x: torch.Tensor) -> torch.Tensor:
    a, b, c = torch.unbind(x, 0)
    return torch.stack([b, a, c], 0)  # the pass returns x itself: rows 0 and 1 come back swapped


def main(argv: list[str]) -> None:
    warnings.filterwarnings("ignore")
    if not argv:
        x = torch.randn(3, 4, dtype=torch.float64)
        out, fired = pre_grad_only(reordered_stack, (x,), ["normalization_pass", CULPRIT])
        print(
            f"stack([b, a, c]) of unbind(x): max error {float((out - reordered_stack(x)).abs().max()):.3g}; {fired}"
        )
        return
    from models.builder import build

    family, scale = argv[0], argv[1] if len(argv) > 1 else "medium"
    b = build(family, scale, count_nodes=False)
    dense = b.module.dense.eval()
    inputs = tuple(t.detach() for t in b.dense_inputs(b.batches[0]))
    ref = dense(*inputs)
    batch = ["normalization_pass", *group_batch_fusion.PRE_GRAD_FUSIONS]
    for name, keys in (
        ("all keys", ALL_KEYS),
        (f"all but {CULPRIT}", [k for k in ALL_KEYS if k != CULPRIT]),
        (f"batch fusions + {CULPRIT}", [*batch, CULPRIT]),
    ):
        out, fired = pre_grad_only(dense, inputs, keys)
        print(f"{family} {scale}, {name}: max error {float((out - ref).abs().max()):.3g}; fired {fired}")


if __name__ == "__main__":
    main(sys.argv[1:])
