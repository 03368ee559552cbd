"""Random small torchrec models for the fuzzers: a KeyedJaggedTensor looked up by an
EmbeddingBagCollection under a context the model opens, then a dense head.

WHY a generator of its own: :mod:`fuzz_programs` writes its lookups as ``F.embedding`` inside the
graph, but a model fed a KeyedJaggedTensor is captured with its collection run eagerly OUTSIDE
the graph (:mod:`optimus.capture.sparse_boundary`). The contexts the model wraps its lookup in
(frozen tables under ``no_grad`` or ``set_grad_enabled(False)``, ``inference_mode``, a
low-precision ``autocast``) are then the boundary's to replay; one it dropped would change the
pooled dtype, give frozen tables gradients, or let inference tensors into training, and only
training shows some of that. So each model is optimized with the default config, called, back-
propagated and trained two AdamW steps and two SGD-with-momentum steps beside an eager copy.

Models are plain data (:class:`SparseSpec`) built into modules (:func:`build`); decisions come
from a :class:`fuzz_choices.Choices` (hypothesis or a seed), like :mod:`fuzz_programs`.
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from fuzz_choices import Choices, RandomChoices
from torch import nn

import optimus
from optimus.config import OptimusConfig

# the context around the lookup (and the read of its pooled values): what frozen, inference-only
# and low-precision lookups are written with; "autocast_no_grad" nests a no_grad in an autocast
CONTEXTS = ("none", "no_grad", "inference_mode", "autocast", "set_grad_enabled", "autocast_no_grad")
# how the pooled KeyedTensor is read: inside the context ("values" split there, "to_dict",
# "getitem"), or with nothing but the lookup inside it ("kt": the KeyedTensor leaves the block;
# "values_out": its values() leave it), so that no op of the graph runs in the context and only
# the boundary's replay of it keeps eager's grad mode, dtype and inference-ness
READS = ("values", "to_dict", "getitem", "kt", "values_out")
HEADS = ("towers", "top")  # a Linear per feature then a top Linear, or one top Linear
POOLINGS = ("SUM", "MEAN")
DENSE = 3  # width of the dense input x


@dataclass(frozen=True)
class SparseSpec:
    """A model: ``features`` tables of ``rows`` x ``dim`` (one feature each), looked up under
    ``context``, read as ``read``, then ``head``; trained from batches of ``batch`` rows."""

    features: int = 2
    dim: int = 2
    rows: int = 5
    pooling: str = "SUM"
    context: str = "none"
    read: str = "values"
    head: str = "top"
    batch: int = 2
    hidden: int = 2


def generate(c: Choices) -> SparseSpec:
    return SparseSpec(
        features=c.integer(1, 3),
        dim=c.choice((2, 4)),
        rows=c.integer(4, 8),
        pooling=c.choice(POOLINGS),
        context=c.choice(CONTEXTS),
        read=c.choice(READS),
        head=c.choice(HEADS),
        batch=c.integer(2, 4),
        hidden=c.choice((2, 4)),
    )


def sparse_spec(seed: int) -> SparseSpec:
    return generate(RandomChoices(seed))


def features(spec: SparseSpec) -> set[str]:
    return {
        f"context:{spec.context}",
        f"read:{spec.read}",
        f"head:{spec.head}",
        f"pooling:{spec.pooling}",
        f"tables:{spec.features}",
    }


class SparseModel(nn.Module):
    """The generated model (its forward reads ``spec`` only to choose between the drawn forms)."""

    def __init__(self, spec: SparseSpec) -> None:
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

        super().__init__()
        self.spec = spec
        tables = [
            EmbeddingBagConfig(
                name=f"t{i}",
                embedding_dim=spec.dim,
                num_embeddings=spec.rows,
                feature_names=[f"f{i}"],
                pooling=PoolingType[spec.pooling],
            )
            for i in range(spec.features)
        ]
        self.sparse = nn.Module()
        self.sparse.ebc = EmbeddingBagCollection(tables=tables)  # nested, as DLRM's sparse arch
        width = DENSE + (spec.hidden if spec.head == "towers" else spec.dim) * spec.features
        if spec.head == "towers":
            self.towers = nn.ModuleList([nn.Linear(spec.dim, spec.hidden) for _ in range(spec.features)])
        self.top = nn.Linear(width, 1)

    def _lookup(self, kjt: Any) -> Any:
        """The pooled value of each feature, read from the collection's KeyedTensor as drawn (or
        the KeyedTensor, or its values, for :meth:`_split` to read outside the context)."""
        spec = self.spec
        kt = self.sparse.ebc(kjt)
        if spec.read == "kt":
            return kt
        if spec.read == "values_out":
            return kt.values()
        if spec.read == "values":
            return list(kt.values().split([spec.dim] * spec.features, 1))
        if spec.read == "to_dict":
            d = kt.to_dict()
            return [d[f"f{i}"] for i in range(spec.features)]
        return [kt[f"f{i}"] for i in range(spec.features)]

    def forward(self, x: torch.Tensor, kjt: Any) -> torch.Tensor:
        spec = self.spec
        # each context written as models write it (Dynamo reads the with blocks themselves)
        if spec.context == "no_grad":
            with torch.no_grad():
                pooled = self._lookup(kjt)
        elif spec.context == "inference_mode":
            with torch.inference_mode():
                pooled = self._lookup(kjt)
        elif spec.context == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                pooled = self._lookup(kjt)
        elif spec.context == "set_grad_enabled":
            with torch.set_grad_enabled(False):
                pooled = self._lookup(kjt)
        elif spec.context == "autocast_no_grad":
            with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
                pooled = self._lookup(kjt)
        else:
            pooled = self._lookup(kjt)
        if spec.read == "kt":
            pooled = pooled.values()
        if spec.read in ("kt", "values_out"):
            pooled = list(pooled.split([spec.dim] * spec.features, 1))
        # back in the caller's mode: float32 copies (inference tensors cannot be saved for backward)
        pooled = [p.float().clone() for p in pooled]
        if spec.head == "towers":
            pooled = [torch.relu(t(p)) for t, p in zip(self.towers, pooled, strict=True)]
        return self.top(torch.cat([x, *pooled], 1))


def build(spec: SparseSpec, seed: int = 0) -> SparseModel:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return SparseModel(spec)


def make_inputs(spec: SparseSpec, seed: int) -> tuple[torch.Tensor, Any]:
    """A dense batch and a KeyedJaggedTensor of 0..3 ids per feature and row (an empty bag too)."""
    from torchrec import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(spec.batch, DENSE, generator=gen)
    lengths = torch.randint(0, 4, (spec.features * spec.batch,), generator=gen)
    values = torch.randint(0, spec.rows, (int(lengths.sum()),), generator=gen)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(spec.features)], values=values, lengths=lengths
    )
    return x, kjt


@dataclass
class SparseResult:
    """What differed from eager (empty: nothing), whether the boundary was used, seconds taken."""

    mismatches: list[str] = field(default_factory=list)
    boundary: bool = False
    seconds: float = 0.0


def _grad(g: torch.Tensor | None) -> str:
    return "None" if g is None else "a tensor"


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 reordering. Tight even under autocast: both sides run the lookup
    eagerly under the same context and the head in float32, so only a reordered float32 sum may
    differ, while a lookup that lost a bfloat16 autocast would differ by its rounding (~1e-3)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def check(spec: SparseSpec, seed: int = 0) -> SparseResult:
    """Optimize a copy of the model with the default config and compare it with eager: the output
    of a new batch (values, dtype, ``requires_grad``), which parameters get a ``.grad`` and its
    value, then the outputs of two AdamW and two SGD-with-momentum steps and the parameters after
    them (a frozen table must not move)."""
    start = time.perf_counter()
    res = SparseResult()
    ref = build(spec, seed)
    mod = copy.deepcopy(ref)
    with _quiet():
        try:
            gm = optimus.optimize(mod, make_inputs(spec, seed), config=OptimusConfig())
        except Exception as exc:
            res.mismatches.append(f"raises: optimize: {type(exc).__name__}: {str(exc).splitlines()[:1]}")
            return res
    report = getattr(gm, "optimus_report", None)
    res.boundary = report is not None and "run eagerly outside it" in report.capture_reason

    def steps(model: Any, params: list[nn.Parameter]) -> list[torch.Tensor]:
        adamw = torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)
        sgd = torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01)
        outs = []
        for step in range(4):
            out = model(*make_inputs(spec, seed + 1 + step))
            outs.append(out)
            gen = torch.Generator().manual_seed(seed + 100 + step)
            (out.double() * torch.randn(out.shape, generator=gen, dtype=torch.float64)).sum().backward()
            if step == 0:
                outs.append({n: p.grad for n, p in zip(names, params, strict=True)})  # type: ignore[arg-type]
            (adamw if step < 2 else sgd).step()
            for p in params:
                p.grad = None
        return outs

    names = [n for n, _ in ref.named_parameters()]
    with _quiet():
        try:
            want = steps(ref, list(ref.parameters()))
        except Exception as exc:
            res.mismatches.append(f"eager_raises: {type(exc).__name__}: {exc}")
            return res
        try:
            got = steps(gm, list(mod.parameters()))
        except Exception as exc:
            res.mismatches.append(f"raises: {type(exc).__name__}: {str(exc).splitlines()[:1]}")
            return res
    for k, (w, g) in enumerate(zip(want, got, strict=True)):
        if isinstance(w, dict):
            for name in names:
                a, b = w[name], g[name]
                if (a is None) != (b is None):
                    res.mismatches.append(f"grad_presence: {name}: eager {_grad(a)}, optimized {_grad(b)}")
                elif a is not None and not _close(a, b):
                    res.mismatches.append(f"grad: {name}")
        elif w.requires_grad != g.requires_grad or not _close(w.detach(), g.detach()):
            res.mismatches.append(
                f"output: call {k}: eager {w.dtype} requires_grad={w.requires_grad}, "
                f"got {g.dtype} requires_grad={g.requires_grad}, max diff "
                f"{(w.detach().double() - g.detach().double()).abs().max().item() if w.shape == g.shape else 'shape'}"
            )
    for (name, p), q in zip(ref.named_parameters(), mod.parameters(), strict=True):
        if not _close(p.detach(), q.detach()):
            res.mismatches.append(f"trained: {name} after the optimizer steps")
    res.seconds = time.perf_counter() - start
    return res


def source(spec: SparseSpec) -> str:
    """How the failing model reads (its forward, with the drawn forms filled in)."""
    return f"SparseModel({spec!r})  # tests/optimus/fuzz_sparse.py"


def run(start: int, examples: int, show: int = 10) -> int:
    """``examples`` seeded models from seed ``start`` (what ``scripts/fuzz --programs sparse`` runs):
    progress every 25, then the constructs covered, how many used the boundary, and each failure
    with its model. Returns the number of failing examples."""
    from collections import Counter

    begin = time.perf_counter()
    failures, used, seconds = 0, 0, 0.0
    covered: Counter[str] = Counter()
    failed: list[str] = []
    for k in range(start, start + examples):
        spec = sparse_spec(k)
        result = check(spec, k)
        covered.update(features(spec))
        used += result.boundary
        seconds += result.seconds
        if result.mismatches:
            failures += 1
            failed.append(f"{k}: {source(spec)}\n    " + "\n    ".join(result.mismatches[:6]))
        done = k - start + 1
        if done % 25 == 0:
            print(
                f"... {done} examples, {failures} failures, {time.perf_counter() - begin:.0f} s", flush=True
            )
    print(f"per example (s): sparse {seconds / max(examples, 1):.3f}")
    print(f"sparse boundary used in {used} of {examples}")
    print("constructs: " + ", ".join(f"{f} {n}" for f, n in sorted(covered.items())))
    for line in failed[:show]:
        print(f"\n--- {line}")
    print(f"\nfuzz: {examples} examples, {failures} failures")
    return failures
