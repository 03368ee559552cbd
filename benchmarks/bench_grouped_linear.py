"""The grouped-linear op against G separate linears, on a ragged shape set.

Timed by asv itself (``time_``): one forward, and one forward+backward, of G linears whose
(K, N) differ, run as G ``F.linear`` calls (``separate``: what the unfused graph does) or as one
``torch.ops.optimus.grouped_linear`` with a backend: ``loop`` and ``padded`` (CPU
implementations), ``triton`` (the grouped kernel, CUDA only: on CPU it would only run in
Triton's interpreter, which times numpy, so it is not offered there). Pairs that cannot run on
the device raise NotImplementedError, which asv reports as skipped.

Shapes: batch M = 256 rows (the medium presets' batch), K_g and N_g drawn uniformly from the
embedding dims of ``models/widths.py`` (8..128, powers of two), seeded; G = 8 and 32.

On a GPU machine, ``python -m benchmarks.grouped_linear_report OUT.json`` times every grouped
form torch offers against these (``torch._foreach_mm``, ``torch._grouped_mm``, ``bmm``), at the
widths of wide towers, eager and under CUDA graphs (``scripts/gpu-run`` runs it). See
docs/optimus.md, "group_linear and the grouped kernel".
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
import torch.nn.functional as F

EMBEDDING_DIMS = (8, 16, 32, 64, 128)  # models.widths.EMBEDDING_DIMS (models needs torchrec)
BATCH = 256
VARIANTS = ("separate", "loop", "padded", "triton")


def ragged_shapes(
    groups: int, seed: int = 0, batch: int = BATCH, dims: tuple[int, ...] = EMBEDDING_DIMS
) -> list[tuple[int, int, int]]:
    """(M, K, N) of ``groups`` linears: K and N drawn from ``dims``, seeded."""
    rng = random.Random(f"{seed}/bench")
    return [(batch, rng.choice(dims), rng.choice(dims)) for _ in range(groups)]


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def make_problem(
    shapes: list[tuple[int, int, int]],
    device: str,
    dtype: torch.dtype = torch.float32,
    grad: bool = False,
    scale: float = 1.0,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Inputs, weights and biases of the linears, seeded normal values times ``scale``."""
    gen = torch.Generator().manual_seed(0)

    def t(*shape: int) -> torch.Tensor:
        return (
            (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype).requires_grad_(grad)
        )

    return [t(m, k) for m, k, _ in shapes], [t(n, k) for _, k, n in shapes], [t(n) for _, _, n in shapes]


def runner(variant: str, device: str) -> Callable[[list, list, list], list[torch.Tensor]]:
    """The forward of one variant; NotImplementedError where it cannot run."""
    if variant == "separate":
        return lambda xs, ws, bs: [F.linear(x, w, b) for x, w, b in zip(xs, ws, bs, strict=True)]
    from optimus.kernels.grouped_linear import triton_installed

    if variant == "triton" and (device != "cuda" or not triton_installed()):
        raise NotImplementedError("the Triton grouped kernel is timed on CUDA only")
    op = torch.ops.optimus.grouped_linear
    return lambda xs, ws, bs: op(xs, ws, bs, "none", variant)


class GroupedLinear:
    """G ragged linears: separate F.linear calls vs one grouped op per backend."""

    params = (devices(), [8, 32], list(VARIANTS))
    param_names = ("device", "groups", "variant")
    number = 5
    repeat = (3, 10, 20.0)
    timeout = 300.0

    def setup(self, device: str, groups: int, variant: str) -> None:
        self.run = runner(variant, device)
        self.device = device
        self.xs, self.ws, self.bs = make_problem(ragged_shapes(groups), device)
        self.gx, self.gw, self.gb = make_problem(ragged_shapes(groups), device, grad=True)
        self.run(self.xs, self.ws, self.bs)  # warm up (Triton compiles on first call)

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def time_forward(self, device: str, groups: int, variant: str) -> None:
        with torch.no_grad():
            self.run(self.xs, self.ws, self.bs)
        self._sync()

    def time_forward_backward(self, device: str, groups: int, variant: str) -> None:
        outs = self.run(self.gx, self.gw, self.gb)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        self._sync()
