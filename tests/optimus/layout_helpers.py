"""Checks that an optimized graph hands back what eager hands back, down to layout and aliasing.

WHY: equal values are not enough. A caller can observe a result's strides (``.view(-1)`` raises
on a strided tensor, ``as_strided`` reads other elements) and its aliasing (an in-place op on a
returned tensor that shares memory with an input, a parameter or another output changes them).
``assert_same_results`` compares values, dtypes, shapes, strides, ``is_contiguous`` and which
results overlap in memory with each other and with the inputs/parameters; ``assert_meta_matches``
runs a GraphModule node by node and checks that the shape, dtype and strides the engine recorded
for each node (``optimus.semantics.meta.value_meta``) are what actually runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from optimus.semantics.meta import TensorMeta, value_meta


def _flat(value: Any) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_flatten(value)[0]
    return [v for v in leaves if isinstance(v, torch.Tensor)]


def _addresses(t: torch.Tensor) -> set[int]:
    """Byte offsets (in its storage) of every element of ``t`` (small test tensors only)."""
    if t.numel() == 0:
        return set()
    offsets = torch.zeros((), dtype=torch.long)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        offsets = offsets.unsqueeze(-1) + torch.arange(size) * stride
    first = (t.storage_offset() + offsets.flatten()) * t.element_size()
    return set(first.tolist())


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share at least one element of memory (what an in-place op on one
    can change in the other). Pieces of one batched tensor that do not overlap are independent,
    exactly like separately allocated eager results."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    return bool(_addresses(a) & _addresses(b))


def aliasing(results: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> list[list[bool]]:
    """For each result: does it overlap each source (inputs, parameters), then each result."""
    return [[overlaps(r, s) for s in [*sources, *results]] for r in results]


def assert_same_results(
    eager: Any,
    optimized: Any,
    sources: Sequence[torch.Tensor] = (),
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """``optimized`` matches ``eager`` in values, dtypes, shapes, strides, contiguity, and in which
    results overlap in memory with each other and with ``sources`` (the inputs and parameters the
    two calls shared)."""
    want, got = _flat(eager), _flat(optimized)
    assert len(want) == len(got), f"{len(got)} results, eager gave {len(want)}"
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        assert b.dtype == a.dtype, f"result {i}: dtype {b.dtype}, eager {a.dtype}"
        assert b.shape == a.shape, f"result {i}: shape {tuple(b.shape)}, eager {tuple(a.shape)}"
        assert b.is_contiguous() == a.is_contiguous(), (
            f"result {i}: is_contiguous {b.is_contiguous()}, eager {a.is_contiguous()} (stride {b.stride()} vs {a.stride()})"
        )
        assert _norm_stride(b) == _norm_stride(a), f"result {i}: stride {b.stride()}, eager {a.stride()}"
        torch.testing.assert_close(b.detach(), a.detach(), rtol=rtol, atol=atol)
    want_alias, got_alias = aliasing(want, sources), aliasing(got, sources)
    assert got_alias == want_alias, f"aliasing differs: optimized {got_alias}, eager {want_alias}"


def _norm_stride(t: torch.Tensor) -> tuple[int, ...]:
    """Strides with size-1 dims' (meaningless) stride blanked out."""
    return tuple(0 if size == 1 else stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _meta_stride(meta: Any) -> tuple[int, ...] | None:
    stride = getattr(meta, "stride", None)
    if stride is None:
        return None
    return tuple(0 if size == 1 else s for size, s in zip(meta.shape, stride, strict=True))


def assert_meta_matches(
    gm: fx.GraphModule, inputs: Sequence[Any], only: Callable[[fx.Node], bool] | None = None
) -> int:
    """Run ``gm`` on ``inputs`` with an interpreter; every node's recorded meta (shape, dtype,
    strides, contiguity; computed on first use for nodes a rewrite built) must describe the
    tensor that node actually produced. Returns how many tensors were checked."""
    checked = 0
    mismatches: list[str] = []

    def compare(node: fx.Node, meta: Any, value: Any) -> None:
        nonlocal checked
        if isinstance(value, torch.Tensor) and isinstance(meta, TensorMeta):
            checked += 1
            real = TensorMeta(tuple(value.shape), value.dtype, value.device, tuple(value.stride()))
            if meta.shape != real.shape or meta.dtype != real.dtype:
                mismatches.append(
                    f"{node.format_node()}: meta {meta.shape}/{meta.dtype}, ran {real.shape}/{real.dtype}"
                )
            elif meta.stride is not None and (
                _meta_stride(meta) != _meta_stride(real) or meta.is_contiguous != value.is_contiguous()
            ):
                mismatches.append(f"{node.format_node()}: meta stride {meta.stride}, ran {real.stride}")
        elif isinstance(value, (list, tuple)) and isinstance(meta, tuple) and len(meta) == len(value):
            for m, v in zip(meta, value, strict=True):
                compare(node, m, v)

    class _Checker(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            if n.op not in ("placeholder", "output") and (only is None or only(n)):
                compare(n, value_meta(n), result)
            return result

    with torch.no_grad():
        _Checker(gm).run(*inputs)
    assert not mismatches, "recorded meta differs from what runs:\n" + "\n".join(mismatches)
    return checked
