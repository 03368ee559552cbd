"""A grouped GEMM in Triton: G matrix products of different shapes in ONE launch.

WHY: ranking models run many small linears of different widths (per-feature projections with
different embedding dims, towers and experts of different widths). Launched one by one, each is
a few microseconds of launch for a few microseconds of work; stacked (``batch_linear``) they need
equal shapes. This kernel takes the shapes and pointers of every group from device tables, so
one launch covers them all. ``torch.nn.functional.grouped_mm`` cannot: it needs one K and N.

The kernel computes, for every group g,

    C_g[M_g, N_g] = act(A_g[M_g, K_g] @ B_g[K_g, N_g] + bias_g)

where A_g and B_g are read through per-group strides, so the three products a linear needs
(forward ``x @ W^T``, ``dX = dY @ W``, ``dW = dY^T @ X``) are the same kernel on different tables,
with no transposed copies. Schedule: a flat grid over the tiles of all groups; the host computes
each group's tile count and their prefix sums (``tile_start``), and a program finds its group by
counting the prefix entries at or below its id (G is small). Tiles are masked at the M, N and K
edges, so no shape needs to be a multiple of the tile. Accumulation is fp32 for every input dtype
(fp32 products use IEEE fp32, not TF32, so results match ``F.linear``'s default).

Runs on CUDA, and on CPU tensors under ``TRITON_INTERPRET=1`` (Triton's interpreter; the tests use
it; it has no bf16). The K loop runs to the launch's largest K (a compile-time constant) and skips
steps past each group's own K: Triton 3.6's interpreter cannot loop to a bound read from memory
under numpy 2.4, and on CUDA the constant costs one compile per distinct largest K (shapes are
static per model). Importing this module needs ``triton``: callers check :func:`available` first.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

ACTIVATIONS = {"none": 0, "relu": 1}


def _grouped_mm_kernel(
    ref,  # any tensor of the groups' dtype: gives the element type of the pointer tables
    a_ptrs,  # int64 [G]: address of A_g
    b_ptrs,  # int64 [G]: address of B_g
    c_ptrs,  # int64 [G]: address of C_g (row-major, row stride ``ldc``)
    bias_ptrs,  # int64 [G]: address of bias_g (read only when HAS_BIAS)
    sum_ptrs,  # int64 [G]: where ROW_SUMS writes sum_k A_g[m, k] (fp32 [M_g])
    dims,  # int64 [G, 3]: M_g, N_g, K_g
    strides,  # int64 [G, 5]: A row, A col, B row, B col, C row
    tile_start,  # int32 [G + 1]: prefix sums of the groups' tile counts
    G,
    LOG2_G: tl.constexpr,  # search steps: ceil(log2(G)) + 1
    HAS_BIAS: tl.constexpr,
    ROW_SUMS: tl.constexpr,  # also write A's row sums (db = sum of dY over the batch, for free)
    ACT: tl.constexpr,
    FP32_IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_MAX: tl.constexpr,  # the largest K_g of the launch
):
    pid = tl.program_id(0)
    # binary search: the last group whose first tile is <= pid (empty groups share a start)
    lo = pid * 0
    hi = lo + G
    for _ in tl.static_range(LOG2_G):
        mid = (lo + hi) // 2
        below = tl.load(tile_start + mid) <= pid
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    g = lo
    local = pid - tl.load(tile_start + g)
    m_size = tl.load(dims + g * 3)
    n_size = tl.load(dims + g * 3 + 1)
    k_size = tl.load(dims + g * 3 + 2)
    s_am = tl.load(strides + g * 5)
    s_ak = tl.load(strides + g * 5 + 1)
    s_bk = tl.load(strides + g * 5 + 2)
    s_bn = tl.load(strides + g * 5 + 3)
    s_cm = tl.load(strides + g * 5 + 4)
    elem = ref.dtype.element_ty
    a = tl.load(a_ptrs + g).to(tl.pointer_type(elem))
    b = tl.load(b_ptrs + g).to(tl.pointer_type(elem))
    c = tl.load(c_ptrs + g).to(tl.pointer_type(elem))
    tiles_n = (n_size + BLOCK_N - 1) // BLOCK_N
    pm = local // tiles_n
    pn = local % tiles_n
    offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < m_size
    mask_n = offs_n < n_size
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # not tl.zeros: see _jitted
    # row sums as a product with a ones tile (every column holds them; tl.sum is a jit helper)
    row_sum = tl.full((BLOCK_M, 16), 0.0, tl.float32)
    for k0 in range(0, K_MAX, BLOCK_K):  # constexpr bound: see the module docstring
        if k0 < k_size:
            ks = k0 + offs_k
            mask_k = ks < k_size
            a_tile = tl.load(
                a + offs_m[:, None] * s_am + ks[None, :] * s_ak,
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            )
            b_tile = tl.load(
                b + ks[:, None] * s_bk + offs_n[None, :] * s_bn,
                mask=mask_k[:, None] & mask_n[None, :],
                other=0.0,
            )
            if FP32_IEEE:
                acc = tl.dot(a_tile, b_tile, acc, input_precision="ieee")
                if ROW_SUMS:
                    ones = tl.full((BLOCK_K, 16), 1.0, tl.float32)
                    row_sum = tl.dot(a_tile, ones, row_sum, input_precision="ieee")
            else:
                acc = tl.dot(a_tile, b_tile, acc)
                if ROW_SUMS:
                    row_sum = tl.dot(a_tile, tl.full((BLOCK_K, 16), 1.0, a_tile.dtype), row_sum)
    # Every column tile computed the same sums: the first one writes them. ``pn == 0`` is a branch,
    # not a term of the mask: a scalar condition broadcast into a block mask reaches Triton's
    # interpreter as integer data (its splat keeps the compared operands' dtype), and the
    # interpreter's store rejects a mask that is not boolean since Triton 3.9.
    if ROW_SUMS:  # a compile-time branch; ``pn == 0`` inside it is a runtime one
        col = tl.arange(0, 16)
        if pn == 0:
            sums = tl.load(sum_ptrs + g).to(tl.pointer_type(tl.float32))
            tl.store(
                sums + offs_m[:, None] + col[None, :] * 0,
                row_sum,
                mask=mask_m[:, None] & (col[None, :] == 0),
            )
    if HAS_BIAS:
        bias = tl.load(bias_ptrs + g).to(tl.pointer_type(elem))
        acc += tl.load(bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        acc = tl.maximum(acc, 0.0)
    tl.store(
        c + offs_m[:, None] * s_cm + offs_n[None, :],
        acc.to(elem),
        mask=mask_m[:, None] & mask_n[None, :],
    )


@functools.cache
def _jitted(interpret: bool) -> Any:
    """The kernel, decorated when first launched: ``triton.jit`` picks compiled or interpreted
    at decoration time from ``TRITON_INTERPRET``, and torch may have imported triton before a
    test set the variable, so decorating at import would fix the mode too early. For the same
    reason the kernel calls no ``@triton.jit`` helper of ``triton.language.standard``
    (``tl.zeros``, ``tl.cdiv``): those were decorated when triton was imported."""
    return triton.jit(_grouped_mm_kernel)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _block(size: int, lo: int, hi: int) -> int:
    """The tile edge for a dimension whose largest size is ``size``: a power of two in [lo, hi]."""
    return max(lo, min(hi, triton.next_power_of_2(max(size, 1))))


def tile_counts(mnk: Sequence[tuple[int, int, int]], block_m: int, block_n: int) -> list[int]:
    """Tiles of each group's output: ceil(M / BLOCK_M) * ceil(N / BLOCK_N)."""
    return [triton.cdiv(m, block_m) * triton.cdiv(n, block_n) for m, n, _ in mnk]


def blocks_for(mnk: Sequence[tuple[int, int, int]]) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for one launch: the largest group's sizes, clamped to 16..64
    (``tl.dot`` needs 16; 64 keeps register use modest for fp32)."""
    return (
        _block(max(m for m, _, _ in mnk), 16, 64),
        _block(max(n for _, n, _ in mnk), 16, 64),
        _block(max(k for _, _, k in mnk), 16, 32),
    )


def grouped_mm(
    a: Sequence[torch.Tensor],
    b: Sequence[torch.Tensor],
    bias: Sequence[torch.Tensor] | None = None,
    activation: str = "none",
) -> list[torch.Tensor]:
    """``[act(a[g] @ b[g] + bias[g]) for g]`` in one launch. ``a[g]``: [M_g, K_g] and ``b[g]``:
    [K_g, N_g], any strides (a transposed view costs nothing); all of one dtype and device.
    Returns new contiguous [M_g, N_g] tensors."""
    return _grouped_mm(a, b, bias, activation, row_sums=False)[0]


def grouped_mm_row_sums(
    a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``[a[g] @ b[g]]`` and ``[a[g].sum(1)]`` (in ``a``'s dtype, summed in fp32), one launch."""
    out, sums = _grouped_mm(a, b, None, "none", row_sums=True)
    # a group with no output column has no tile to compute its sums in (dW of a K == 0 linear)
    sums = [x.float().sum(1) if w.shape[1] == 0 else s for s, x, w in zip(sums, a, b, strict=True)]
    return out, [s.to(x.dtype) for s, x in zip(sums, a, strict=True)]


_TABLE_CACHE_SIZE = 64  # distinct launches whose device tables are kept (a model has a few)


class _TableCache:
    """Device copies of launch tables, keyed by their exact contents (and device and stream).

    WHY: building a table means a host tensor, a pinned copy and a host-to-device copy per
    launch. On an H200 in a compiled 0.35 ms dlrm `tiny` step that host work made the step
    slower than the separate GEMMs it replaced (results/gpu/). A compiled step's buffers
    come back from the caching allocator at the same addresses call after call, so the same
    table recurs, and a table whose contents equal the key is correct to reuse whatever it
    came from: the kernel only reads it. Least recently used tables are dropped past
    ``_TABLE_CACHE_SIZE``.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.tables: dict[tuple[Any, ...], torch.Tensor] = {}
        self.hits = 0
        self.misses = 0

    def get(self, values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        stream = _raw_stream(device) if device.type == "cuda" else 0
        key = (device, stream, dtype, *values)
        table = self.tables.pop(key, None)
        if table is None:
            self.misses += 1
            table = _to_device(torch.tensor(values, dtype=dtype), device)
            if len(self.tables) >= self.size:
                self.tables.pop(next(iter(self.tables)))
        else:
            self.hits += 1
        self.tables[key] = table  # most recently used last
        return table

    def clear(self) -> None:
        self.tables.clear()
        self.hits = self.misses = 0


TABLES = _TableCache(_TABLE_CACHE_SIZE)


def _raw_stream(device: torch.device) -> int:
    """The current CUDA stream's handle. ``torch._C._cuda_getCurrentRawStream`` is what
    Inductor's own generated code calls; ``torch.cuda.current_stream`` builds a Stream object and
    cost 17 us per call on the H200's host, a tenth of a grouped launch."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if raw is None:
        return int(torch.cuda.current_stream(device).cuda_stream)
    return int(raw(index))


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device`` without waiting for the stream.

    WHY: a plain ``.to(cuda)`` of pageable memory returns only once the copy is done, so the host
    waits for every kernel queued before it: a stall per launch. Copied from pinned memory with
    ``non_blocking=True`` the copy is queued like a kernel; PyTorch's caching host allocator keeps
    the pinned block until the copy has run, so freeing ``host`` at once is safe. Elsewhere (the
    CPU interpreter) it is a plain ``.to``.
    """
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _grouped_mm(
    a: Sequence[torch.Tensor],
    b: Sequence[torch.Tensor],
    bias: Sequence[torch.Tensor] | None,
    activation: str,
    row_sums: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    if len(a) != len(b) or not a:
        raise ValueError(f"grouped_mm needs as many A as B matrices (>= 1), got {len(a)} and {len(b)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    dtype, device = a[0].dtype, a[0].device
    for i, (x, w) in enumerate(zip(a, b, strict=True)):
        if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0]:
            raise ValueError(f"group {i}: cannot multiply {tuple(x.shape)} by {tuple(w.shape)}")
        if x.dtype != dtype or w.dtype != dtype or x.device != device or w.device != device:
            raise ValueError(f"group {i}: every matrix must be {dtype} on {device}")
    if device.type != "cuda" and not interpreting():
        raise ValueError(f"the Triton grouped kernel runs on CUDA (or with TRITON_INTERPRET=1), not {device}")
    mnk = [(x.shape[0], w.shape[1], x.shape[1]) for x, w in zip(a, b, strict=True)]
    out = [torch.empty(m, n, dtype=dtype, device=device) for m, n, _ in mnk]
    sums = [torch.zeros(m, dtype=torch.float32, device=device) for m, _, _ in mnk] if row_sums else []
    if bias is not None and len(bias) != len(a):
        raise ValueError(f"got {len(bias)} biases for {len(a)} groups")
    bm, bn, bk = blocks_for(mnk)
    counts = tile_counts(mnk, bm, bn)
    total = sum(counts)
    if total == 0:  # no output tile (N == 0 everywhere, or no rows): row sums stay zero
        return out, sums
    # a group with K == 0 runs no loop step: its tile is the bias (or zeros), as F.linear gives
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + n)
    g = len(a)
    biases = list(bias) if bias is not None else out  # unread when there is no bias
    table = TABLES.get(
        [t.data_ptr() for t in a]
        + [t.data_ptr() for t in b]
        + [t.data_ptr() for t in out]
        + [t.data_ptr() for t in biases]
        + [t.data_ptr() for t in (sums if row_sums else out)]  # unread without ROW_SUMS
        + [v for d in mnk for v in d]
        + [v for x, w, c in zip(a, b, out, strict=True) for v in (*x.stride(), *w.stride(), c.stride(0))],
        torch.int64,
        device,
    )
    ptrs = table[: 5 * g].view(5, g)
    dims, strides = table[5 * g : 8 * g], table[8 * g :]
    tile_start = TABLES.get(starts, torch.int32, device)
    _jitted(interpreting())[(total,)](
        a[0],
        ptrs[0],
        ptrs[1],
        ptrs[2],
        ptrs[3],
        ptrs[4],
        dims,
        strides,
        tile_start,
        g,
        LOG2_G=max(g - 1, 1).bit_length() + 1,
        HAS_BIAS=bias is not None,
        ROW_SUMS=row_sums,
        ACT=ACTIVATIONS[activation],
        FP32_IEEE=dtype == torch.float32,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        K_MAX=max(k for _, _, k in mnk),
    )
    return out, sums


def linear_forward(
    xs: Sequence[torch.Tensor], ws: Sequence[torch.Tensor], bs: Sequence[torch.Tensor], activation: str
) -> list[torch.Tensor]:
    """``act(x_g @ W_g^T + b_g)``: B_g is W_g^T, a strided view (no copy). ``bs`` empty: no bias."""
    return grouped_mm(xs, [w.t() for w in ws], list(bs) if bs else None, activation)


def linear_backward(
    grads: Sequence[torch.Tensor], xs: Sequence[torch.Tensor], ws: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """(dX, dW, db) from two grouped launches: dX_g = dY_g @ W_g, and dW_g = dY_g^T @ X_g with
    db_g = sum over the batch of dY_g as the row sums of dY_g^T in the same launch."""
    dx = grouped_mm(grads, ws)
    dw, db = grouped_mm_row_sums([dy.t() for dy in grads], xs)
    return dx, dw, db
