"""The grouped-linear kernel and its op: forward and backward parity against per-group F.linear.

The Triton kernel runs on CPU in Triton's interpreter: ``triton.jit`` reads ``TRITON_INTERPRET``
when it decorates, and the kernel module decorates on first launch (per mode), so setting the
variable here, for this module, before anything launches is enough. Shapes stay tiny: the interpreter runs every program in numpy.
Without triton the kernel tests skip, saying so; the CPU backends are tested either way.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from optimus.kernels.grouped_linear import grouped_linear, padded_forward, triton_installed

RAGGED = [(3, 17, 5), (1, 1, 1), (20, 33, 40), (4, 3, 17), (0, 4, 3), (5, 0, 7)]  # (M, K, N)
needs_triton = pytest.mark.skipif(not triton_installed(), reason="triton is not installed")


@pytest.fixture(scope="module", autouse=True)
def _interpret() -> object:
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if old is None:
        os.environ.pop("TRITON_INTERPRET")
    else:
        os.environ["TRITON_INTERPRET"] = old


def _make(
    shapes: list[tuple[int, int, int]], dtype: torch.dtype, bias: bool = True
) -> tuple[list, list, list]:
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(m, k, generator=gen).to(dtype).requires_grad_() for m, k, _ in shapes]
    ws = [torch.randn(n, k, generator=gen).to(dtype).requires_grad_() for _, k, n in shapes]
    bs = [torch.randn(n, generator=gen).to(dtype).requires_grad_() for _, _, n in shapes] if bias else []
    return xs, ws, bs


def _reference(xs: list, ws: list, bs: list, activation: str) -> tuple[list, list]:
    """Per-group F.linear in float64: outputs and gradients of a seeded weighted sum."""
    leaves = [t.detach().double().requires_grad_() for t in [*xs, *ws, *bs]]
    g = len(xs)
    lx, lw, lb = leaves[:g], leaves[g : 2 * g], leaves[2 * g :]
    outs = [F.linear(x, w, lb[i] if lb else None) for i, (x, w) in enumerate(zip(lx, lw, strict=True))]
    if activation == "relu":
        outs = [o.relu() for o in outs]
    return outs, _grads(outs, leaves)


def _grads(outs: list, leaves: list) -> list:
    gen = torch.Generator().manual_seed(1)
    loss = sum((o.double() * torch.randn(o.shape, generator=gen).double()).sum() for o in outs)
    return list(torch.autograd.grad(loss, leaves, allow_unused=True))


def _check(shapes: list, dtype: torch.dtype, backend: str, activation: str, bias: bool, tol: float) -> None:
    xs, ws, bs = _make(shapes, dtype, bias)
    outs = torch.ops.optimus.grouped_linear(xs, ws, bs, activation, backend)
    ref_outs, ref_grads = _reference(xs, ws, bs, activation)
    assert [tuple(o.shape) for o in outs] == [tuple(r.shape) for r in ref_outs]
    for o, r in zip(outs, ref_outs, strict=True):
        assert o.dtype == dtype and o.is_contiguous()
        torch.testing.assert_close(o.double(), r, rtol=tol, atol=tol)
    grads = _grads(outs, [*xs, *ws, *bs])
    for got, want, leaf in zip(grads, ref_grads, [*xs, *ws, *bs], strict=True):
        assert got is not None and got.shape == leaf.shape and got.dtype == dtype
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)


@needs_triton
@pytest.mark.parametrize("activation", ["none", "relu"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_triton_kernel_ragged_forward_backward(dtype: torch.dtype, tol: float, activation: str) -> None:
    _check(RAGGED, dtype, "triton", activation, bias=True, tol=tol)


@needs_triton
@pytest.mark.parametrize(
    "shapes",
    [
        [(17, 3, 1)],  # G = 1
        [(1, 65, 3), (2, 1, 70)],  # K and N past one tile (64), not multiples of it
        [(70, 5, 2), (3, 40, 33)],  # M past one tile
    ],
)
def test_triton_kernel_tiles_and_one_group(shapes: list) -> None:
    _check(shapes, torch.float32, "triton", "none", bias=False, tol=1e-4)


@needs_triton
def test_triton_kernel_masks_are_boolean_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every mask the kernel loads or stores with is boolean data in the interpreter, not only of
    Triton type int1. Triton 3.9's interpreter rejects any other mask ("mask has unsupported
    dtype"); the pinned 3.6 accepts integer masks, so without this check the default run would not
    notice a mask that breaks on newer Triton (a scalar condition broadcast into a block mask is
    such a one: the interpreter splats it as integers). Forward and backward, with a dW launch
    whose K spans two column tiles, so the row-sum store runs in tiles that must not write."""
    from triton.runtime.interpreter import InterpreterBuilder

    seen: list[str] = []
    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store

    def checked_load(self: object, ptrs: object, mask: Any, *rest: object) -> object:
        seen.append(f"load {mask.data.dtype}")
        return load(self, ptrs, mask, *rest)

    def checked_store(self: object, ptrs: object, value: object, mask: Any, *rest: object) -> object:
        seen.append(f"store {mask.data.dtype}")
        return store(self, ptrs, value, mask, *rest)

    monkeypatch.setattr(InterpreterBuilder, "create_masked_load", checked_load)
    monkeypatch.setattr(InterpreterBuilder, "create_masked_store", checked_store)
    _check(RAGGED, torch.float32, "triton", "relu", bias=True, tol=1e-4)
    _check([(1, 65, 3), (2, 1, 70)], torch.float32, "triton", "none", bias=False, tol=1e-4)
    assert seen, "no masked load or store reached the interpreter"
    assert set(seen) == {"load bool", "store bool"}, sorted(set(seen))


@pytest.mark.parametrize("backend", ["loop", "padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("activation", ["none", "relu"])
def test_cpu_backends_parity(backend: str, dtype: torch.dtype, activation: str) -> None:
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    _check(RAGGED, dtype, backend, activation, bias=True, tol=tol)
    _check([(2, 3, 4)], dtype, backend, activation, bias=False, tol=tol)


def test_loop_backend_is_bitwise_f_linear() -> None:
    xs, ws, bs = _make(RAGGED, torch.float32)
    for got, x, w, b in zip(grouped_linear(xs, ws, bs, "none", "loop"), xs, ws, bs, strict=True):
        assert torch.equal(got, F.linear(x, w, b))


def test_padded_form_pads_with_zeros_only() -> None:
    xs, ws, bs = _make([(2, 3, 4), (5, 1, 2)], torch.float64)
    got = padded_forward([x.detach() for x in xs], [w.detach() for w in ws], [b.detach() for b in bs], "none")
    assert [tuple(t.shape) for t in got] == [(2, 4), (5, 2)]


def test_fake_impl_gives_shapes_without_data() -> None:
    xs = [torch.empty(4, 3, device="meta"), torch.empty(2, 9, device="meta")]
    ws = [torch.empty(5, 3, device="meta"), torch.empty(1, 9, device="meta")]
    out = grouped_linear(xs, ws, [], "none", "triton")
    assert [tuple(o.shape) for o in out] == [(4, 5), (2, 1)]


def test_opcheck_schema_fake_and_autograd_registration() -> None:
    xs, ws, bs = _make([(4, 3, 6), (2, 5, 1)], torch.float32)
    result = torch.library.opcheck(torch.ops.optimus.grouped_linear.default, (xs, ws, bs, "relu", "loop"))
    assert set(result.values()) == {"SUCCESS"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("none", "cuda-magic"), "backend must be one of"),
        (("gelu", "loop"), "activation must be one of"),
    ],
)
def test_bad_arguments_say_what_is_wrong(args: tuple, message: str) -> None:
    xs, ws, _ = _make([(2, 3, 4)], torch.float32)
    with pytest.raises(ValueError, match=message):
        grouped_linear(xs, ws, [], *args)


def test_mismatched_shapes_say_which_group() -> None:
    with pytest.raises(ValueError, match="group 1"):
        grouped_linear(
            [torch.zeros(2, 3), torch.zeros(2, 4)], [torch.zeros(5, 3), torch.zeros(5, 3)], [], "none", "loop"
        )


def test_traces_through_aot_autograd() -> None:
    """torch.compile traces the op (fake impl) and its backward (a second custom op)."""
    xs, ws, bs = _make([(4, 3, 6), (2, 5, 1)], torch.float32)

    def f(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        return torch.ops.optimus.grouped_linear([a * 2, b], ws, bs, "relu", "loop")

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    got = compiled(*xs)
    want = [F.linear(xs[0] * 2, ws[0], bs[0]).relu(), F.linear(xs[1], ws[1], bs[1]).relu()]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    grads = torch.autograd.grad(sum(g.sum() for g in got), [*xs, *ws])
    ref = torch.autograd.grad(sum(w.sum() for w in want), [*xs, *ws])
    for g, r in zip(grads, ref, strict=True):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("backend", ["loop", "padded"])
def test_autocast_casts_like_f_linear(backend: str) -> None:
    """Under autocast F.linear runs in the autocast dtype; so does the op (its autocast kernel)."""
    xs, ws, bs = _make([(3, 4, 6), (2, 5, 7)], torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = grouped_linear(xs, ws, bs, "none", backend)
        want = [F.linear(x, w, b) for x, w, b in zip(xs, ws, bs, strict=True)]
    assert [g.dtype for g in got] == [w.dtype for w in want] == [torch.bfloat16] * 2
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(sum(g.float().sum() for g in got), [*xs, *ws, *bs])
    ref = torch.autograd.grad(sum(w.float().sum() for w in want), [*xs, *ws, *bs])
    for g, r in zip(grads, ref, strict=True):
        assert g.dtype == r.dtype == torch.float32
        torch.testing.assert_close(g, r, rtol=2e-2, atol=2e-2)


@needs_triton
def test_launch_tables_are_reused_only_when_their_contents_match() -> None:
    """The device-table cache (kernels.grouped_linear_triton.TABLES): a repeat launch on the same
    buffers reuses its tables; new buffers, new shapes or another dtype build new ones, and every
    launch's result is still F.linear's."""
    from optimus.kernels import grouped_linear_triton as gl

    gl.TABLES.clear()
    torch.manual_seed(0)
    shapes = [(5, 7, 3), (4, 9, 6)]  # (M, K, N)
    xs = [torch.randn(m, k) for m, k, _ in shapes]
    ws = [torch.randn(n, k) for _, k, n in shapes]
    bs = [torch.randn(n) for _, _, n in shapes]
    for _ in range(3):
        out = gl.linear_forward(xs, ws, bs, "none")
        for o, x, w, b in zip(out, xs, ws, bs, strict=True):
            torch.testing.assert_close(o, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        # fresh outputs are allocated per launch; on CPU their addresses may differ, so only
        # the launches with identical tables may hit
    misses_same = gl.TABLES.misses
    hits_same = gl.TABLES.hits
    assert misses_same + hits_same == 6  # two tables per launch
    xs2 = [x.clone() for x in xs]  # other addresses: a new pointer table, the same tile table
    out2 = gl.linear_forward(xs2, ws, bs, "none")
    for o, x, w, b in zip(out2, xs2, ws, bs, strict=True):
        torch.testing.assert_close(o, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert gl.TABLES.misses >= misses_same + 1
    assert gl.TABLES.hits >= hits_same + 1  # the tile-start table is the same
    gl.TABLES.clear()
    keep = gl.TABLES.size
    try:
        gl.TABLES.size = 2
        for v in range(5):
            gl.TABLES.get([v, v + 1], torch.int64, torch.device("cpu"))
        assert len(gl.TABLES.tables) == 2
        assert gl.TABLES.get([4, 5], torch.int64, torch.device("cpu")).tolist() == [4, 5]
        assert gl.TABLES.hits == 1
        assert gl.TABLES.get([1, 2], torch.int32, torch.device("cpu")).dtype == torch.int32
        assert gl.TABLES.misses == 6  # evicted, rebuilt
    finally:
        gl.TABLES.size = keep
        gl.TABLES.clear()
