"""Run one fuzz program eagerly and through an Optimus path; report every observable difference.

WHAT is compared (eager vs optimized, on identical copies of module, inputs and RNG seed):

- outputs: values (dtype-aware tolerances, see :func:`tolerance`), dtype, shape, strides (of dims
  longer than 1) and ``is_contiguous``, ``requires_grad``;
- aliasing: for each output, which other outputs, inputs and parameters share memory with it;
- the global RNG state after the forward call;
- the inputs after the call (in-place writes) and the module's buffers (BatchNorm running
  statistics, ``num_batches_tracked``);
- after ``backward()`` of a fixed random weighting of the outputs: which parameters (and ``x``)
  have a ``.grad``, and its value;
- the layout of every parameter (``stride()`` and ``is_contiguous()``, exactly) and of its
  ``.grad`` (strides of dims longer than 1): code that flattens parameters
  (``parameters_to_vector``, ``p.view(-1)``, flat-buffer optimizers) needs eager's;
- that the Optimus call itself (``optimize()``) left the example inputs, the module's parameters
  and buffers, and the RNG state as it found them;
- that the optimized call raises exactly when eager raises (eager raising is a generator bug), and
  leaves grad mode as eager does (a rewritten graph that raises inside a ``no_grad`` region it
  entered with ``set_grad_enabled(False)`` never re-enables grad).

PATHS (see :data:`PATHS`): ``optimize`` with the default config (``default``), with a launch-bound
cost model so every rule that can fire does (``optimize``), the same with
``layout=RelayoutParams()`` (``relayout``), ``torch.compile(backend=optimus.backend(inner="eager"))``
(``backend``; "eager" also runs checkpointed blocks as eager does, which Dynamo's own eager
backend does not: see ``optimus.capture.checkpoint_rng``), and ``flatten``: ``relayout`` run the
way training code treats parameters between steps (:func:`flatten_params` before each call:
``parameters_to_vector``, ``p.view(-1)``, an EMA with ``torch._foreach_mul_``/``_foreach_lerp_``,
the vector written back with ``vector_to_parameters``; each keeps the values, so eager's
observation is the reference). WHY an eager inner compiler: it hands Optimus the same Dynamo graph Inductor would
get and runs the rewritten graph as it is, so a difference is Optimus's rewrite and not Inductor's
codegen, and an example costs tens of milliseconds instead of an Inductor C++ compile (seconds).
``inductor`` (the real ``backend="optimus"`` with Inductor, ``fallback_random`` so random draws
match eager) is there for a few slow examples. ``gated`` is ``optimize`` with the memory gate on
(``memory_margin=0.9``, or ``$OPTIMUS_FUZZ_MARGIN``): vertical chains (optimus/engine/vertical.py) are applied together, judged, and
taken or undone (``--paths gated``; not in the default set). ``chained``: the gate on with
a budget nothing reaches (margin 0), so every vertical chain is taken whole, with the parameters
re-laid out (each chain tried with the probe layout, then applied again; ``--paths chained``).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from fuzz_programs import Spec, build, features, legalize, make_inputs
from optimus_helpers import LAUNCH_BOUND
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import optimus
from optimus.params.relayout import RelayoutParams


@dataclass
class Observation:
    """What a caller can see after one forward (+ backward) call."""

    error: str | None = None
    outputs: list[torch.Tensor] = field(default_factory=list)
    meta: list[dict[str, Any]] = field(default_factory=list)
    aliases: list[frozenset[str]] = field(default_factory=list)
    rng: torch.Tensor | None = None
    inputs: list[torch.Tensor] = field(default_factory=list)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    # name -> (stride, is_contiguous) of each parameter, and its .grad's (None: no grad), after backward
    param_layouts: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    grad_mode_after: bool = True  # torch.is_grad_enabled() right after the call (restored then)
    trained: dict[str, torch.Tensor] = field(default_factory=dict)  # parameters after the steps


@dataclass
class Mismatch:
    path: str
    check: str  # "values", "stride", "alias", "rng", "buffers", "grads", "raises", ...
    detail: str

    def __str__(self) -> str:
        return f"[{self.path}] {self.check}: {self.detail}"


def _span(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage address, first byte, end byte) of the memory ``t`` reads."""
    if t.numel() == 0:
        return None
    size = t.element_size()
    lo = t.storage_offset() * size
    extent = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True)) + 1
    return t.untyped_storage().data_ptr(), lo, lo + extent * size


def _overlap(a: tuple[int, int, int] | None, b: tuple[int, int, int] | None) -> bool:
    return a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _aliases(
    outs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], module: nn.Module
) -> list[frozenset[str]]:
    spans = [_span(o) for o in outs]
    others = [(f"in{k}", _span(t)) for k, t in enumerate(inputs)]
    others += [(f"param:{n}", _span(p)) for n, p in module.named_parameters()]
    found = []
    for i, s in enumerate(spans):
        names = {f"out{j}" for j, t in enumerate(spans) if j != i and _overlap(s, t)}
        names |= {name for name, t in others if _overlap(s, t)}
        found.append(frozenset(names))
    return found


def _meta(t: torch.Tensor) -> dict[str, Any]:
    return {
        "dtype": t.dtype,
        "shape": tuple(t.shape),
        # strides of size-1 dims are not observable through indexing or views
        "stride": tuple(s if n > 1 else None for n, s in zip(t.shape, t.stride(), strict=True)),
        "contiguous": t.is_contiguous(),
        "requires_grad": t.requires_grad,
    }


def _loss(outs: Sequence[torch.Tensor], seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed + 1)
    loss: Any = 0.0
    for o in outs:
        w = torch.randn(o.shape, generator=gen, dtype=torch.float64)
        if o.requires_grad:
            loss = loss + (o.double() * w).sum()
    return loss


def _train(
    fn: Callable[..., Any], module: nn.Module, inputs: Sequence[torch.Tensor], seed: int, steps: int
) -> dict[str, torch.Tensor]:
    """``steps`` AdamW steps (weight decay), then ``steps`` SGD steps with momentum, the first
    on the gradients already there; the parameters after them.

    WHY: a parameter eager gives a zero gradient moves under weight decay and momentum, one left
    ``None`` does not: one step's gradients cannot show it, the parameters after a few steps do."""
    params = [p for p in module.parameters() if p.requires_grad]
    adamw = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    sgd = torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=0.01)
    for step in range(2 * steps):
        if step:
            for p in params:
                p.grad = None
            torch.manual_seed(seed + step)
            out = fn(*[t.detach().clone().requires_grad_(t.requires_grad) for t in inputs])
            loss = _loss(list(out) if isinstance(out, (tuple, list)) else [out], seed + step)
            if isinstance(loss, torch.Tensor):
                loss.backward()
        (adamw if step < steps else sgd).step()
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def _layout(p: torch.Tensor) -> tuple[Any, ...]:
    """A parameter's layout: its strides exactly (``p.view(-1)`` and ``parameters_to_vector``
    need them), its gradient's where a dim is longer than 1 (``AccumulateGrad`` itself keeps a
    gradient's strides only there, so eager's size-1 strides are not a contract)."""
    g = p.grad
    grad = None if g is None else (_meta(g)["stride"], g.is_contiguous())
    return tuple(p.stride()), p.is_contiguous(), grad


def observe(
    fn: Callable[..., Any], module: nn.Module, inputs: Sequence[torch.Tensor], seed: int, steps: int = 0
) -> Observation:
    """Call ``fn(*inputs)`` from RNG ``seed``, then ``backward()`` a fixed weighting of its outputs
    (and with ``steps``, train a few optimizer steps: :func:`_train`)."""
    obs = Observation()
    fresh = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    torch.manual_seed(seed)
    grad_mode = torch.is_grad_enabled()
    try:
        out = fn(*inputs)
    except Exception as exc:
        obs.error = f"forward: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return obs
    finally:  # a graph that raised between its own set_grad_enabled calls leaves grad mode changed
        obs.grad_mode_after = torch.is_grad_enabled()
        torch.set_grad_enabled(grad_mode)
    obs.rng = torch.get_rng_state()
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    obs.meta = [_meta(o) for o in outs]
    obs.aliases = _aliases(outs, inputs, module)
    obs.outputs = [o.detach().clone() for o in outs]
    obs.inputs = [t.detach().clone() for t in inputs]
    obs.buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    gen = torch.Generator().manual_seed(seed + 1)
    loss: Any = 0.0
    try:  # reading an output can raise too (a no_grad view of a base written in place later)
        for o in outs:
            w = torch.randn(o.shape, generator=gen, dtype=torch.float64)
            if o.requires_grad:
                loss = loss + (o.double() * w).sum()
        if isinstance(loss, torch.Tensor):
            loss.backward()
    except Exception as exc:
        obs.error = f"backward: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return obs
    obs.grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in module.named_parameters()}
    obs.param_layouts = {n: _layout(p) for n, p in module.named_parameters()}
    for k, t in enumerate(inputs):
        if t.requires_grad:
            obs.grads[f"in{k}"] = None if t.grad is None else t.grad.detach().clone()
    if steps:
        try:
            obs.trained = _train(fn, module, fresh, seed, steps)
        except Exception as exc:
            obs.error = f"train: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return obs


def tolerance(dtype: torch.dtype, low_precision: bool) -> tuple[float, float]:
    """(rtol, atol relative to the reference's magnitude) for values of ``dtype``.

    Rewrites reorder sums (a batched matmul, a fused reduction), so float32 results may differ in
    the last bits: 1e-4 is far above that and far below any real bug seen (0.03 .. 5). Values
    computed under ``autocast(bfloat16)`` carry bf16 rounding (8 bits) through later fp32 ops.
    float64 programs are compared tightly (1e-9): only a real change moves them that far.
    """
    if low_precision or dtype in (torch.bfloat16, torch.float16):
        return 5e-2, 5e-2
    if dtype == torch.float64:
        return 1e-9, 1e-9
    return 1e-4, 1e-4


def _close(a: torch.Tensor, b: torch.Tensor, low_precision: bool) -> str | None:
    """None when ``b`` (optimized) matches ``a`` (eager), else the largest error."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"dtype/shape {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if not a.is_floating_point():
        return None if torch.equal(a, b) else "integer values differ"
    rtol, atol = tolerance(a.dtype, low_precision)
    a64, b64 = a.double(), b.double()
    scale = max(1.0, float(a64.abs().nan_to_num(0.0, 0.0, 0.0).max())) if a.numel() else 1.0
    if torch.allclose(b64, a64, rtol=rtol, atol=atol * scale, equal_nan=True):
        return None
    err = (b64 - a64).abs().nan_to_num(float("inf")).max()
    return f"max error {float(err):.3g}"


def compare(ref: Observation, new: Observation, path: str, low_precision: bool) -> list[Mismatch]:
    """Every way ``new`` differs from ``ref`` (empty: the caller cannot tell them apart)."""
    out: list[Mismatch] = []

    def bad(check: str, detail: str) -> None:
        out.append(Mismatch(path, check, detail))

    if ref.error is not None:
        bad("eager_raises", ref.error)  # a generator bug: legalize() must prevent it
        return out
    if ref.grad_mode_after != new.grad_mode_after:
        bad(
            "grad_mode",
            f"grad mode after the call: {ref.grad_mode_after} in eager, {new.grad_mode_after} optimized",
        )
    if new.error is not None:
        bad("raises", new.error)
        if not new.outputs:  # the forward raised: nothing else to compare
            return out
    if len(ref.outputs) != len(new.outputs):
        bad("count", f"{len(ref.outputs)} outputs vs {len(new.outputs)}")
        return out
    for i, (a, b) in enumerate(zip(ref.meta, new.meta, strict=True)):
        for key in ("dtype", "shape", "stride", "contiguous", "requires_grad"):
            if a[key] != b[key]:
                bad(key, f"output {i}: {a[key]} vs {b[key]}")
    for i, (a, b) in enumerate(zip(ref.outputs, new.outputs, strict=True)):
        err = _close(a, b, low_precision)
        if err:
            bad("values", f"output {i}: {err}")
    for i, (a, b) in enumerate(zip(ref.aliases, new.aliases, strict=True)):
        if a != b:
            bad("alias", f"output {i} shares memory with {sorted(a)} in eager, {sorted(b)} optimized")
    if ref.rng is not None and new.rng is not None and not torch.equal(ref.rng, new.rng):
        bad("rng", "global RNG state differs after the call")
    for k, (a, b) in enumerate(zip(ref.inputs, new.inputs, strict=True)):
        err = _close(a, b, low_precision)
        if err:
            bad("inputs", f"input {k} after the call: {err}")
    for name, a in ref.buffers.items():
        b = new.buffers.get(name)
        err = "missing" if b is None else _close(a, b, low_precision)
        if err:
            bad("buffers", f"{name}: {err}")
    for name, ga in ref.grads.items() if new.error is None else ():
        gb = new.grads.get(name)
        if (ga is None) != (gb is None):
            bad(
                "grad_presence",
                f"{name}.grad is {'None' if ga is None else 'set'} in eager, "
                f"{'None' if gb is None else 'set'} optimized",
            )
        elif ga is not None and gb is not None:
            err = _close(ga, gb, low_precision)
            if err:
                bad("grads", f"{name}.grad: {err}")
    for name, pa in ref.trained.items() if new.error is None else ():
        pb = new.trained.get(name)
        err = "missing" if pb is None else _close(pa, pb, low_precision)
        if err:
            bad("trained", f"{name} after the optimizer steps: {err}")
    for name, la in ref.param_layouts.items() if new.error is None else ():
        lb = new.param_layouts.get(name)
        if la != lb:
            bad("param_layout", f"{name} (stride, contiguous, grad's): {la} in eager, {lb} optimized")
    return out


# ----------------------------------------------------------------------------------------------
# paths


def _state(module: nn.Module, inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    state = {f"in{k}": t.detach().clone() for k, t in enumerate(inputs)}
    state |= {f"param:{n}": p.detach().clone() for n, p in module.named_parameters()}
    state |= {f"buffer:{n}": b.detach().clone() for n, b in module.named_buffers()}
    return state


def _restore(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in module.named_parameters():
            p.copy_(state[f"param:{n}"])
        for n, b in module.named_buffers():
            b.copy_(state[f"buffer:{n}"])


def _optimize_path(config: Callable[[], optimus.OptimusConfig]) -> Callable[..., Any]:
    def prepare(module: nn.Module, example: Sequence[torch.Tensor], rules: Any) -> tuple[Any, Any]:
        cfg = config()
        if rules is not None:
            cfg = cfg.with_(rules=tuple(rules))
        gm = optimus.optimize(module, tuple(example), config=cfg)
        return gm, gm.optimus_report

    return prepare


def _backend_path(inner: Any = "eager") -> Callable[..., Any]:
    def prepare(module: nn.Module, example: Sequence[torch.Tensor], rules: Any) -> tuple[Any, Any]:
        torch._dynamo.reset()
        cfg = optimus.OptimusConfig(cost_model=LAUNCH_BOUND)
        if rules is not None:
            cfg = cfg.with_(rules=tuple(rules))
        chosen = optimus.backend(cfg, inner=inner)
        compiled = torch.compile(module, backend=chosen, dynamic=False)
        return compiled, chosen.reports  # filled by the first call

    return prepare


def _changed_path(module: nn.Module, example: Sequence[torch.Tensor], rules: Any) -> tuple[Any, Any]:
    """``optimize`` (re-layout, launch-bound), one call, then every ``nn.Linear`` replaced by a copy
    and every parameter of the model by a new ``nn.Parameter`` object with the same values (what
    a swapped head and ``load_state_dict(assign=True)`` do): the optimized module must now compute
    with, and send gradients to, the new objects (``optimus.capture.structure_watch``). The first call's effects (RNG, BatchNorm statistics, inputs)
    are undone, so the check sees what the next call does."""
    gm, report = PATHS["relayout"](module, example, rules)
    state, rng = _state(module, example), torch.get_rng_state()
    gm(*(t.detach().clone().requires_grad_(t.requires_grad) for t in example))
    torch.set_rng_state(rng)
    _restore(module, state)
    for parent in list(module.modules()):  # every Linear a new module object (a swapped head)
        for name, child in list(parent._modules.items()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, copy.deepcopy(child))
    fresh: dict[int, nn.Parameter] = {}
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                new = fresh.setdefault(id(p), nn.Parameter(p.detach().clone(), p.requires_grad))
                setattr(sub, name, new)
    return gm, report


def flatten_params(module: nn.Module) -> None:
    """What training code does with the parameters between steps, each of which needs every
    parameter laid out as in eager (``view(-1)`` raises on a transposed one): the flat vector
    (``parameters_to_vector``), flat views, an EMA of the weights updated with ``torch._foreach``
    ops, model averaging written back into the parameters with ``_foreach_lerp_``, and the vector
    written back with ``vector_to_parameters`` (each parameter's ``.data`` replaced: a re-laid-out
    model lays them out again at its next call). Every step keeps the values exactly (a lerp
    between equal tensors), so the eager observation stays the reference."""
    params = list(module.parameters())
    if not params:
        return
    with torch.no_grad():
        vec = parameters_to_vector(params)
        views = [p.view(-1) for p in params]
        ema = [v.clone() for v in views]
        torch._foreach_mul_(ema, 1.0)
        torch._foreach_lerp_(ema, views, 0.5)
        torch._foreach_lerp_(params, [e.view_as(p) for e, p in zip(ema, params, strict=True)], 0.5)
        vector_to_parameters(vec.clone(), params)


def _flatten_path(module: nn.Module, example: Sequence[torch.Tensor], rules: Any) -> tuple[Any, Any]:
    """``relayout``, with :func:`flatten_params` before each call of the optimized module."""
    gm, report = PATHS["relayout"](module, example, rules)

    def call(*args: Any) -> Any:
        flatten_params(module)
        return gm(*args)

    return call, report


def _dynamo_only(module: nn.Module, example: Sequence[torch.Tensor], rules: Any) -> tuple[Any, Any]:
    """Dynamo with the plain eager backend: tells Dynamo's own differences from Optimus's."""
    torch._dynamo.reset()
    return torch.compile(module, backend="eager", dynamic=False), []


def _inductor(module: nn.Module, example: Sequence[torch.Tensor], rules: Any) -> tuple[Any, Any]:
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True  # random ops draw from the eager RNG stream
    return _backend_path(inner=None)(module, example, rules)


GATED_MARGIN = float(os.environ.get("OPTIMUS_FUZZ_MARGIN", "0.9"))
PATHS: dict[str, Callable[..., Any]] = {
    "default": _optimize_path(lambda: optimus.OptimusConfig()),
    "optimize": _optimize_path(lambda: optimus.OptimusConfig(cost_model=LAUNCH_BOUND)),
    "relayout": _optimize_path(
        lambda: optimus.OptimusConfig(cost_model=LAUNCH_BOUND, layout=RelayoutParams())
    ),
    "backend": _backend_path(),
    "gated": _optimize_path(
        lambda: optimus.OptimusConfig(cost_model=LAUNCH_BOUND, memory_margin=GATED_MARGIN)
    ),
    "chained": _optimize_path(
        lambda: optimus.OptimusConfig(
            cost_model=LAUNCH_BOUND, layout=RelayoutParams(), memory_budget_bytes=1 << 40
        )
    ),
    # eval-mode examples with an Inductor-priced model: fused chains cut into chunks of a member
    # or two (optimus.memory.chunked), run eagerly; train-mode examples take the unchunked graph
    "chunked": _optimize_path(
        lambda: optimus.OptimusConfig(
            cost_model=replace(LAUNCH_BOUND, inductor=True),
            layout=RelayoutParams(),
            inference_chunk_bytes=64,
        )
    ),
    "inductor": _inductor,
    "dynamo": _dynamo_only,
    "changed": _changed_path,
    "flatten": _flatten_path,
}
FAST_PATHS = ("default", "optimize", "relayout", "backend", "flatten")


@dataclass
class Result:
    """Mismatches of one example on one path, the rules that fired, and the seconds it took."""

    mismatches: list[Mismatch]
    fired: dict[str, int]
    seconds: float


def low_precision(spec: Spec, dtype: torch.dtype) -> bool:
    return dtype == torch.float32 and has_autocast(spec)


def has_autocast(spec: Spec) -> bool:
    return any(m.region == "autocast" for m in spec.members)


def half_dtype(spec: Spec, float16: bool) -> torch.dtype:
    """The dtype of a half-precision example: models converted with ``.to(float16)`` or
    ``.to(bfloat16)``, as users run them for inference and memory. Programs PyTorch cannot run
    in float16 on CPU are bfloat16: inside ``autocast(bfloat16)`` (eager raises in
    ``autocast::prioritize``) or with ``rrelu`` (no CPU Half kernel)."""
    runnable = not has_autocast(spec) and "random:rrelu" not in features(spec)
    return torch.float16 if float16 and runnable else torch.bfloat16


def reference(spec: Spec, dtype: torch.dtype, seed: int = 0) -> Observation:
    module = build(spec, dtype, seed)
    return observe(module, module, make_inputs(spec, dtype, seed), seed, spec.train_steps)


def run_path(
    spec: Spec,
    path: str,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    rules: Sequence[str] | None = None,
    ref: Observation | None = None,
) -> Result:
    """Compare ``path`` against eager on ``spec`` (``rules``: restrict Optimus to these rules)."""
    ref = ref if ref is not None else reference(spec, dtype, seed)
    start = time.perf_counter()
    module = build(spec, dtype, seed)
    example = make_inputs(spec, dtype, seed)
    before = _state(module, example)
    rng_before = torch.get_rng_state()
    mismatches: list[Mismatch] = []
    try:
        fn, reports = PATHS[path](module, example, rules)
    except Exception as exc:
        mismatches.append(
            Mismatch(path, "raises", f"optimize: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        )
        return Result(mismatches, {}, time.perf_counter() - start)
    if not torch.equal(rng_before, torch.get_rng_state()):
        mismatches.append(Mismatch(path, "optimize_rng", "optimize() advanced the global RNG"))
    after = _state(module, example)
    for name, value in before.items():
        if not torch.equal(value, after[name]):
            mismatches.append(Mismatch(path, "optimize_state", f"optimize() changed {name}"))
    _restore(module, before)  # so the checks below see what the call itself does
    new = observe(fn, module, make_inputs(spec, dtype, seed), seed, spec.train_steps)
    mismatches += compare(ref, new, path, low_precision(spec, dtype))
    fired: dict[str, int] = {}
    for report in reports if isinstance(reports, list) else [reports]:
        for rule, n in report.rules_fired.items():
            fired[rule] = fired.get(rule, 0) + n
        if getattr(report, "chunked_groups", 0):
            fired["(chunk_stacked)"] = fired.get("(chunk_stacked)", 0) + report.chunked_groups
    return Result(mismatches, fired, time.perf_counter() - start)


def check(
    spec: Spec, paths: Sequence[str] = FAST_PATHS, dtype: torch.dtype = torch.float32, seed: int = 0
) -> dict[str, Result]:
    """Every path on one program (the eager reference is computed once)."""
    ref = reference(spec, dtype, seed)
    return {p: run_path(spec, p, dtype, seed, ref=ref) for p in paths}


# ----------------------------------------------------------------------------------------------
# explaining a failure: shrink it, then find who is responsible


def signature(m: Mismatch) -> tuple[str, str]:
    return m.path, m.check


def _fails(spec: Spec, path: str, check_name: str, dtype: torch.dtype) -> bool:
    ref = reference(spec, dtype)
    if ref.error is not None:
        return False  # not a valid program any more
    return any(m.check == check_name for m in run_path(spec, path, dtype, ref=ref).mismatches)


def _simpler(spec: Spec) -> list[Spec]:
    """Candidate one-step simplifications of ``spec``, most drastic first."""
    out: list[Spec] = []
    ms = spec.members
    for k in range(len(ms)):
        if len(ms) > 1:
            out.append(replace(spec, members=ms[:k] + ms[k + 1 :]))
    for k, m in enumerate(ms):
        for change in (
            {"region": ""},
            {"consumer": ""},
            {"keep": False},
            {"writes": False},
            {"src": "x"},
            {"src": "z"},
        ):
            m2 = legalize(replace(m, **change))  # type: ignore[arg-type]
            if m2 != m:
                out.append(replace(spec, members=(*ms[:k], m2, *ms[k + 1 :])))
    for change in (
        {"shared_blocks": not spec.shared_blocks},
        {"batch": 2},
        {"width": 4},
        {"hidden": 4},
        {"train": True},
    ):
        s2 = replace(spec, **change)  # type: ignore[arg-type]
        if s2 != spec:
            out.append(s2)
    return out


def shrink(
    spec: Spec, path: str, check_name: str, dtype: torch.dtype = torch.float32, budget: int = 60
) -> Spec:
    """A smaller program with the same failure (greedy: keep any simplification that still fails)."""
    tries = 0
    changed = True
    while changed and tries < budget:
        changed = False
        for cand in _simpler(spec):
            tries += 1
            if _fails(cand, path, check_name, dtype):
                spec, changed = cand, True
                break
            if tries >= budget:
                break
    return spec


def blame(spec: Spec, path: str, check_name: str, dtype: torch.dtype = torch.float32) -> str:
    """Who changes the result: "dynamo" (plain Dynamo differs too), "capture" (Optimus with no rule
    differs), "rules: a, b" (each of these rules alone makes the difference), or "combination"."""
    if path in ("backend", "inductor") and _fails_with(spec, "dynamo", None, check_name, dtype):
        return "dynamo"
    if _fails_with(spec, path, (), check_name, dtype):
        return "capture"
    fired = run_path(spec, path, dtype).fired
    alone = [r for r in sorted(fired) if _fails_with(spec, path, (r,), check_name, dtype)]
    return f"rules: {', '.join(alone)}" if alone else f"combination of {sorted(fired)}"


def _fails_with(
    spec: Spec, path: str, rules: Sequence[str] | None, check_name: str, dtype: torch.dtype
) -> bool:
    result = run_path(spec, path, dtype, rules=rules)
    return any(m.check == check_name for m in result.mismatches)


def describe(spec: Spec) -> str:
    return ", ".join(sorted(features(spec))) or "plain"
