"""Random small ``nn.Module`` programs written the way users write them, for the fuzzers.

WHY a generator of its own (not :mod:`split_cat_dags` or the DAGs of ``test_properties``): those
build programs out of the ops the rules target, with no Python around them. Users put the same ops
inside ``with torch.no_grad():`` and ``torch.autocast`` blocks, call a train-mode BatchNorm twice
on one input, draw random numbers twice, return views of their inputs, and read fused results with
``.view(-1)``, ``as_strided`` or in-place ops. Each of those constructs is a way a rewrite can
change what the caller observes, so the programs here are made of them.

A program is plain data (:class:`Spec`: a few :class:`Member` statements over two inputs). It is
turned into Python SOURCE (:func:`module_source`) and compiled into a fresh ``nn.Module`` class
(:func:`build`): Dynamo traces exactly that code, a failure's repro is that code (:func:`repro`),
and every example has its own code object, so compiled caches never mix examples.

Choices come from a :class:`fuzz_choices.Choices` object, so the same generator runs under hypothesis (which
shrinks it) and under a seeded ``random.Random`` (the runner and the "exercises the rules" test:
fixed programs that no hypothesis upgrade changes).

Inputs: ``x`` (requires grad; a leaf) and ``z`` (no grad; may be mutated in place by the program,
which the checks observe). ``h = x * 1.5`` is a fresh intermediate members can read.
"""

from __future__ import annotations

import hashlib
import linecache
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from fuzz_choices import Choices, RandomChoices
from torch import nn

T = TypeVar("T")

# What a member computes (see _emit_member for the exact code of each).
KINDS = (
    "tower",  # tanh/gelu(LayerNorm(Linear(s))): several of them are what batch_linear/batch_layer_norm fuse
    "gated",  # act(Linear(s)) * sigmoid(Linear'(s)): a tower and its gate on one input
    "linear",  # Linear(s) (q/k/v when several share s: merge_shared_linear)
    "split_pw",  # unary op on each piece of a split (batch_unary on split pieces)
    "split_cat",  # cat of all pieces of a split of a view of s (a fresh tensor in eager)
    "stack_unbind",  # stack of all rows of an unbind of a view of s, on its dim or another (fresh in eager)
    "bn_twice",  # bn(s) + bn(s) with one train-mode BatchNorm: two statistics updates
    "bn_unused",  # bn(s) whose result nobody reads: still one statistics update
    "random_dup",  # r(s) - r(s) for a random op r: two independent draws, not zero
    "random_unused",  # r(s) whose result nobody reads: still advances the RNG
    "view_out",  # returns a view of s (or s itself)
    "alias_inplace",  # writes in place through an alias of a fresh b, then reads b
    "embedding",  # F.embedding of indices made from s, one table per member (batch_embedding)
    "matmul_param",  # s @ W with W a parameter, as @, torch.matmul or tensordot (matmul_as_linear)
    "size1",  # nn.Linear(1, hidden) of one column of s (batch_size1_linear)
)
# Kinds that only make sense as a group sharing one tensor: drawn by their own group generator
# (GROUPS), after every draw of the kinds above, so adding them kept each seed's other members.
GROUP_KINDS = (
    "gate_pool",  # one MMoE task: softmax(Linear(s)) pools a shared experts tensor (batch_gate_pool)
    "slice_matmul",  # s @ P[e] with P[e] a slice of a shared [n, width, hidden] parameter (batch_slice_matmul)
)
# Group kinds drawn after all of the above (a draw of their own, so every earlier seed's program
# stays what it was): DeepCTR's input layer and PNN's pairwise products.
LATE_GROUP_KINDS = (
    "feature_lookup",  # F.embedding(ids[:, c:c+1].long(), table_c) per sparse column (stack_cast_pieces, batch_embedding)
    "pairwise",  # cat([e[a] for a in ROW]) * cat([e[b] for b in COL]) over unbind pieces (cat_gather)
)
# Group kinds drawn after all of the above (a draw of their own, so every earlier seed's program
# stays what it was): towers run under activation checkpointing, as users save memory.
CHECKPOINT_KINDS = ("checkpointed",)  # torch.utils.checkpoint.checkpoint(self.ck_i, s, ...) per tower
# Drawn after all of the above: the experts of the multi-task zoos, ``Linear -> BatchNorm1d ->
# ReLU -> Dropout`` (batch_batch_norm, in the module's mode). BN_WIDTH channels: 64 bytes of float32,
# the smallest width batch_batch_norm batches on the CPU.
BN_KINDS = ("bn_expert",)
# Drawn after all of the above: RecBole's input layer, ``torch.cat([field.unsqueeze(1) for field in
# fields], 1)`` (unsqueeze_cat), in the spellings of ``FIELD_FORMS`` (``variant``).
FIELD_KINDS = ("field_cat",)
FIELD_FORMS = {
    "columns": "torch.cat([{s}[:, j].unsqueeze(1) for j in range({n})], 1)",  # views of the source
    "fresh": "torch.cat([torch.tanh({s}[:, j]).unsqueeze(-1) for j in range({n})], -1)",  # a negative dim
    "rows": "torch.cat([torch.unsqueeze({s}[j] * 2.0, 0) for j in range({b})], 0)",  # on dim 0
    # one input not unsqueezed, and one on another dim: the cat must stay
    "mixed": "torch.cat([{s}[:, 0].unsqueeze(1), {s}[:, 1:2] * 1.0, {s}[:, 2].unsqueeze(1)], 1)",
    "other_dim": "torch.cat([{s}[:, 0].unsqueeze(0), {s}[:, 1].unsqueeze(0)], 1)",
}
BN_WIDTH = 16
# The BatchNorm1d of a group (``variant``): the momentum forms (a float, None = a cumulative
# average read from num_batches_tracked), no affine parameters, no running statistics.
BN_SETTINGS = {
    "default": "",
    "momentum": "momentum=0.3",
    "cumulative": "momentum=None",
    "no_affine": "affine=False",
    "no_stats": "track_running_stats=False",
}
BN_DROPOUT = ("0.0", "0.2")  # the expert's dropout p (``shared``): off, or drawing per member
# What a checkpointed tower computes (``variant``): Linear, the middle op, Linear. "dropout" draws
# random numbers the backward's recomputation must draw again, identically (preserve_rng_state).
CHECKPOINT_MIDDLE = {
    "tanh": "nn.Tanh()",
    "dropout": "nn.Dropout(0.5)",
    "relu_dropout": "nn.ReLU(), nn.Dropout(0.3)",
}
# How a tower is checkpointed (``shared``): the non-reentrant default, the reentrant form, and the
# non-reentrant one without preserving the RNG state (eager's recomputation then draws new numbers:
# the gradients are eager's own, whatever they are, and must be the same here).
CHECKPOINT_CALLS = {
    "nonreentrant": "use_reentrant=False",
    "reentrant": "use_reentrant=True",
    "no_rng": "use_reentrant=False, preserve_rng_state=False",
}
# Group kinds whose members in one region always share one ``with`` block (a layer is written
# inside one block; separate blocks are separate regions, which nothing batches across).
ONE_BLOCK_KINDS = (*GROUP_KINDS, "feature_lookup")
# How a column of ids becomes an index (``variant`` of a feature_lookup member); "read" also
# returns a value read from the converted column (the conversions can then not be merged).
CASTS = {"long": "{c}.long()", "to": "{c}.to(torch.long)", "int": "{c}.int()", "read": "{c}.long()"}
# The id tensors (``shared`` of a feature_lookup member): small whole numbers kept as floats, as
# DeepCTR keeps them in its one input X; four times the input's width, so that a run of ten or
# more adjacent columns exists (batching lookups pays from about ten tables).
IDS = {
    "ids_z": "(z.abs() * 2).floor().clamp(max=4.0).repeat(1, 4)",
    "ids_x": "(x.detach().abs() * 2).floor().clamp(max=4.0).repeat(1, 4)",
}
ID_ROWS = 5  # every lookup table has this many rows (ids are 0..4)
# The source of a pairwise layer's pieces (``variant`` of a pairwise member): a view of the input,
# a fresh tensor, or a fresh tensor written in place after the cats read it.
PAIR_SOURCES = ("view", "reshape", "fresh", "written")

# How a task pools the experts ``ex`` [B, E, D] with its gate ``g`` [B, E].
GATE_FORMS = {
    "matmul": "torch.matmul({g}.unsqueeze(1), {ex}).squeeze(1)",  # DeepCTR's MMOE
    "op": "({g}.unsqueeze(1) @ {ex}).squeeze(1)",
    "bmm": "torch.bmm({g}.unsqueeze(1), {ex}).squeeze(1)",
    "mul_sum": "({g}.unsqueeze(-1) * {ex}).sum(1)",  # this repository's mmoe
    "torch_sum": "torch.sum({ex} * {g}.unsqueeze(-1), dim=1)",
}
# How the shared experts tensor is built (``Member.shared`` of a gate_pool member).
EXPERTS = {
    "stack": "torch.stack([torch.relu(e(x)) for e in self.experts], dim=1)",
    "view": "self.experts_all(x).view(-1, {e}, {d})",  # one Linear to E * D, viewed [B, E, D]
    # two-layer experts (DeepCTR's MMOE, this repository's mmoe): their first layers and the
    # gates share x (merge_shared_linear); in eval for Inductor, chunked with the merged GEMM
    # computed per chunk (optimus/memory/chunk_slab.py). Not drawn with the two above (see generate)
    "mlp": "torch.stack([torch.relu(f(torch.relu(e(x)))) for e, f in zip(self.experts, self.experts2)], dim=1)",
}
EXPERTS_DRAWN = ("stack", "view")  # what a block draws first; "mlp" replaces "stack" last
N_EXPERTS = 3
BIG_BATCH = 48  # some programs with an MMoE block run at this batch (see generate)
# How a slice P[e] multiplies its input (``Member.variant`` of a slice_matmul member); "read" is
# "op" with the slice also read by something else (a penalty on the weight, returned).
SLICE_FORMS = {
    "op": "{s} @ {w}",
    "matmul": "torch.matmul({s}, {w})",
    "left_t": "torch.matmul({w}.t(), {s}.unsqueeze(2)).squeeze(2)",  # DCN-Mix: V[i][e].t() @ x
    "read": "{s} @ {w}",
}
SLICED = {"P": "self.P[{e}]", "P4": "self.P4[1][{e}]"}  # P [n, width, hidden], P4 [2, n, width, hidden]
SLICE_ORDERS = ("consecutive", "from_one", "reversed", "gap")
FUSABLE = ("tower", "tower", "gated", "linear", "split_pw", "embedding", "matmul_param", "size1")
MATMUL_FORMS = {
    "op": "{s} @ self.m{i}",
    "matmul": "torch.matmul({s}, self.m{i})",
    "tensordot": "torch.tensordot({s}, self.m{i}, dims=([-1], [0]))",
}
LOOKUP_MODES = ("no_grad", "inference_mode", "autocast")  # Spec.lookup_mode, drawn last
SLICES = ("head", "tail")  # Spec.sliced, drawn last
# The over-arch programs of :func:`generate_over_arch`: members of these kinds (each a [batch,
# hidden] value computed from its own parameters) concatenated side by side, read only through
# one of these slices: the first or last piece, the second, half of the first (a narrow inside
# one piece), ``narrow`` of the first, ``split(...)[0]``
OVER_ARCH_KINDS = ("tower", "gated", "linear", "matmul_param", "embedding", "feature_lookup", "size1")
OVER_ARCH_SLICES = ("head", "tail", "middle", "part", "narrow", "split")
# what reads the slice (``Spec.head``): a dense top Linear, a tanh, or nothing (returned as it is,
# so its strides are the caller's to see and a rewrite must keep them)
OVER_ARCH_HEADS = ("top", "tanh", "")
REGIONS = ("", "no_grad", "enable_grad", "autocast")  # enable_grad is nested inside no_grad
# A region around a whole MMoE block: no_grad half the time (the multiply-sum pooling is batched
# only without a gradient).
BLOCK_REGIONS = ("no_grad", "", "enable_grad", "autocast")
SOURCES = ("x", "z", "h")
CONSUMERS = ("", "view", "as_strided", "t_view", "add_", "relu_", "iadd")
INPLACE = ("add_", "relu_", "iadd")
ACTS = ("tanh", "gelu", "silu", "sigmoid", "relu", "neg")
ACTS_SAVING_OUTPUT = ("tanh", "sigmoid", "relu")  # backward reads the output: no in-place after them
RANDOM_OPS = (
    "dropout",
    "dropout_module",
    "rrelu",
    "alpha_dropout",
    "feature_alpha_dropout",
    "feature_dropout",
    "native_dropout",
    "bernoulli",
    "rand_like",
)
# Views (or the tensor itself) of a source; "w_t" views a parameter of shape [D, B] instead.
VIEWS = ("slice", "view", "t", "contiguous", "dropout_eval", "dropout_p0", "reshape", "w_t")
ALIASES = ("dropout_eval", "dropout_p0", "view", "reshape", "contiguous", "slice_all")
SPLIT_SOURCES = ("plain", "view", "contiguous", "slice", "w_t")


@dataclass(frozen=True)
class Member:
    """One statement group of ``forward``: ``kind`` on source ``src``, inside ``region``, its result
    read by ``consumer``. ``variant`` picks the op (activation, random op, view, pooling or slice
    matmul spelling); ``keep`` also returns the intermediate (the Linear output of a tower, the
    pooled value of an MMoE task, the product of a slice matmul, or the value before ``consumer``).
    ``shared``, ``slot`` and ``writes`` are for the GROUP_KINDS, whose members share a tensor."""

    kind: str
    src: str = "x"
    region: str = ""
    consumer: str = ""
    variant: str = ""
    keep: bool = False
    shared: str = ""  # the tensor a group member shares: EXPERTS key (gate_pool), SLICED key (slice_matmul)
    slot: int = 0  # slice_matmul: the slice e of P[e]
    writes: bool = False  # gate_pool: writes its experts tensor in place after its pooling
    joined: bool = (
        False  # feature_lookup: also in the layer's concatenation (``lk``); tower/gated: only in ``tw``
    )


@dataclass(frozen=True)
class Spec:
    """A whole program: input sizes ``[batch, width]``, hidden width, members, module mode, and
    whether neighbouring members in the same region share one ``with`` block."""

    members: tuple[Member, ...]
    batch: int = 3
    width: int = 8
    hidden: int = 4
    train: bool = True
    shared_blocks: bool = True
    # the lookup layer's context (LOOKUP_MODES), set over the members' own regions
    lookup_mode: str = ""
    # "head"/"tail": the over-arch input ``tw`` and the lookup layer's cat ``lk`` are read only as
    # the slice of their first/last piece (DeepCTR's ``cat(lookups)[:, :D]``): the other pieces'
    # parameters get zero gradients in eager, which the optimizer steps below must see
    sliced: str = ""
    train_steps: int = 0  # AdamW steps, then as many SGD-with-momentum steps (fuzz_checks.observe)
    # the over-arch input ``tw`` concatenates every joined member whatever its kind (towers,
    # linears, projections, lookups: :func:`generate_over_arch`), not only the towers
    mixed_cat: bool = False
    head: str = ""  # what reads ``tw``'s slice (OVER_ARCH_HEADS)


# ----------------------------------------------------------------------------------------------
# generation


def _weighted(c: Choices, options: Sequence[T], first_weight: int) -> T:
    """``options[0]`` with weight ``first_weight``, each other option with weight 1."""
    k = c.integer(0, first_weight + len(options) - 2)
    return options[0] if k < first_weight else options[k - first_weight + 1]


def _member(c: Choices, kind: str, src: str) -> Member:
    region = _weighted(c, REGIONS, 4)
    consumer = _weighted(c, CONSUMERS, 3)
    keep = c.integer(0, 3) == 0
    if kind in ("tower", "gated", "split_pw"):
        variant = c.choice(ACTS)
    elif kind in ("random_dup", "random_unused"):
        variant = c.choice(RANDOM_OPS)
    elif kind == "view_out":
        variant = c.choice(VIEWS)
    elif kind == "alias_inplace":
        variant = c.choice(ALIASES)
    elif kind in ("split_cat", "stack_unbind"):
        variant = c.choice(SPLIT_SOURCES)
    elif kind in ("linear", "size1"):
        variant = c.choice(("bias", "nobias"))
    elif kind == "matmul_param":
        variant = c.choice(tuple(MATMUL_FORMS))
    else:
        variant = ""
    return legalize(Member(kind, src, region, consumer, variant, keep))


def legalize(m: Member) -> Member:
    """The nearest member that eager PyTorch runs forward and backward without an error.

    Rules (each is an autograd or shape restriction of eager, not of Optimus):
    - no in-place write after an op whose backward reads its output (tanh, sigmoid, relu);
    - no in-place write through a view of a leaf that requires grad (``x``, a parameter) while
      grad is on; ``view_out`` with an in-place consumer is moved under ``no_grad``;
    - no ``relu_`` through a view of a source with grad on (a later write of the source would
      change the output relu_'s backward reads): ``add_`` instead;
    - no ``.view(-1)`` of a view eager cannot flatten (a slice, a transpose);
    - no in-place write on a tanh result (``alias_inplace``);
    - members without a tensor result (``*_unused``) have no consumer;
    - no in-place consumer of a BatchNorm expert (its dropout may return ReLU's saved output);
    - a gate_pool member that writes its experts in place pools under ``no_grad`` (a pooling with
      grad saves the experts for backward, and a later write would break eager's backward); the
      writers run first (:func:`generate`), so every pooling with grad reads the written tensor.
    """
    if m.kind in ("bn_unused", "random_unused"):
        return replace(m, consumer="", keep=False)
    if m.kind == "bn_expert" and m.consumer in INPLACE:
        m = replace(m, consumer="")  # dropout(p=0) returns ReLU's output itself, which ReLU's backward reads
    if m.writes and m.kind != "gate_pool":
        m = replace(m, writes=False)
    if m.writes and m.region != "no_grad":
        m = replace(m, region="no_grad")
    if m.consumer in INPLACE and m.kind in ("tower", "gated", "split_pw") and m.variant in ACTS_SAVING_OUTPUT:
        m = replace(m, variant="gelu")
    if writes_leaf(m):
        m = replace(m, region="no_grad", keep=False)
    if mutates_source(m) and m.consumer == "relu_" and m.region != "no_grad":
        # relu_'s backward reads its output, and that output is the source: any later write of the
        # source (another member's) would break eager's backward
        m = replace(m, consumer="add_")
    if m.kind == "view_out" and m.consumer in ("view", "t_view") and m.variant in ("slice", "t", "w_t"):
        m = replace(m, consumer="")  # eager itself cannot flatten these views
    if m.kind == "alias_inplace" and m.consumer in INPLACE:
        m = replace(m, consumer="")  # its result is a tanh output
    return m


def writes_leaf(m: Member) -> bool:
    """The member writes in place through a view of ``x`` or of a parameter (under ``no_grad``)."""
    return m.kind == "view_out" and m.consumer in INPLACE and (m.src == "x" or m.variant == "w_t")


def writes_under_no_grad(m: Member) -> bool:
    """The member writes in place, under ``no_grad``, through a view of a value that requires grad
    (``x``, ``h``, a parameter). That view itself is not returned: autograd refuses any use of a
    view made under ``no_grad`` whose base was then written, so users write through it and drop it
    (an optimizer step). ``z`` does not require grad, so its written view may be returned."""
    return mutates_source(m) and m.region == "no_grad" and (m.src != "z" or m.variant == "w_t")


def mutates_source(m: Member) -> bool:
    """The member writes into its source (an in-place consumer on a view of it)."""
    return m.kind == "view_out" and m.consumer in INPLACE


def _gate_pool_group(c: Choices) -> list[Member]:
    """2..4 tasks of an MMoE/PLE block: each pools one experts tensor with ``softmax(Linear(s))``.
    Mostly one spelling and one experts tensor per block (what batch_gate_pool batches); sometimes
    a task spelled otherwise or pooling the other experts tensor (a group the rule must split), a
    task that writes the experts in place after its pooling (no pooling may move across it), and
    grad-mode/autocast regions around some tasks or the whole block (the multiply-sum form is
    batched only without a gradient, and never under autocast)."""
    form, experts = c.choice(tuple(GATE_FORMS)), c.choice(EXPERTS_DRAWN)
    block = _weighted(c, BLOCK_REGIONS, 3) if c.integer(0, 1) else None
    members = []
    for _ in range(c.integer(2, 4)):
        m = _member(c, "gate_pool", c.choice(SOURCES))
        m = replace(
            m,
            variant=form if c.integer(0, 4) else c.choice(tuple(GATE_FORMS)),
            shared=experts if c.integer(0, 5) else c.choice(EXPERTS_DRAWN),
            writes=c.integer(0, 7) == 0,
            region=m.region if block is None else block,
        )
        members.append(legalize(m))
    return members


def _slice_matmul_group(c: Choices) -> list[Member]:
    """2..4 DCN-Mix experts: ``s @ P[e]`` over slices of one parameter. The slices are consecutive
    (from 0 or from 1), reversed, or have a gap (the rule batches only a consecutive run); a slice
    may be read by something else (``read``: a penalty on it) or returned (``keep``); sometimes a
    member slices the other parameter. Regions: one around the whole group, or per member."""
    form, param = c.choice(tuple(SLICE_FORMS)), c.choice(tuple(SLICED))
    block = _weighted(c, REGIONS, 1) if c.integer(0, 1) else None
    n = c.integer(2, 4)
    order = c.choice(SLICE_ORDERS)
    slots = list(range(1 if order == "from_one" else 0, n + (order == "from_one")))
    if order == "reversed":
        slots.reverse()
    elif order == "gap":
        slots = [e + (e >= n // 2) for e in slots]  # 0, 2 / 0, 2, 3 / 0, 1, 3, 4
    members = []
    for e in slots:
        m = _member(c, "slice_matmul", c.choice(SOURCES))
        m = replace(
            m,
            variant=form if c.integer(0, 4) else c.choice(tuple(SLICE_FORMS)),
            shared=param if c.integer(0, 5) else c.choice(tuple(SLICED)),
            slot=e,
            region=m.region if block is None else block,
        )
        members.append(legalize(m))
    return members


def _feature_lookup_group(c: Choices) -> list[Member]:
    """2..14 per-feature lookups ``F.embedding(ids[:, c:c+1].long(), table)`` of one id tensor:
    DeepCTR's input layer. Columns consecutive (from 0 or 1), reversed or with a gap (only a run
    of adjacent slices is one conversion); sometimes a member converts otherwise or reads the other
    id tensor, or the converted column is also read ("read")."""
    cast, ids = c.choice(("long", "to", "int")), c.choice(tuple(IDS))
    # mostly one region around the whole layer and ten or more columns: what batching takes
    block = _weighted(c, REGIONS, 1) if c.integer(0, 3) else None
    n = c.integer(10, 14) if c.integer(0, 2) else c.integer(2, 9)
    order = c.choice(SLICE_ORDERS)
    slots = list(range(1 if order == "from_one" else 0, n + (order == "from_one")))
    if order == "reversed":
        slots.reverse()
    elif order == "gap":
        slots = [e + (e >= n // 2) for e in slots]
    members = []
    for e in slots:
        m = _member(c, "feature_lookup", "z")
        m = replace(
            m,
            # one member in twenty converts otherwise or reads the other ids: a layer of twelve
            # is then still one run about half the time
            variant=cast if c.integer(0, 19) else c.choice(tuple(CASTS)),
            shared=ids if c.integer(0, 19) else c.choice(tuple(IDS)),
            slot=e,
            region=m.region if block is None else block,
            # DeepCTR concatenates the lookups as they are: a consumer (an in-place one keeps its
            # member out of the batch) on one in twelve
            consumer=m.consumer if c.integer(0, 11) == 0 else "",
        )
        members.append(legalize(m))
    # DeepCTR concatenates the layer's lookups (``torch.cat(sparse_embedding_list, dim=-1)``); the
    # pieces are returned as well, so the cat of a batched lookup's pieces is seen beside them
    if c.integer(0, 1):
        members = [replace(m, joined=True) for m in members]
    return members


def _pairwise_group(c: Choices) -> list[Member]:
    """1..2 PNN inner-product layers, each over the pieces of one source (``variant``)."""
    members = []
    for _ in range(c.integer(1, 2)):
        m = _member(c, "pairwise", c.choice(SOURCES))
        members.append(legalize(replace(m, variant=c.choice(PAIR_SOURCES))))
    return members


LATE_GROUPS = {"feature_lookup": _feature_lookup_group, "pairwise": _pairwise_group}


def _checkpointed_group(c: Choices) -> list[Member]:
    """2..4 parallel towers, each run under ``torch.utils.checkpoint.checkpoint``: mostly one form
    and one middle op per group (what a user writes for a stack of towers), sometimes a tower
    checkpointed otherwise; a consumer (an in-place one included: the tower ends in a Linear, whose
    backward does not read its output) on one in four."""
    call, middle = c.choice(tuple(CHECKPOINT_CALLS)), c.choice(tuple(CHECKPOINT_MIDDLE))
    block = _weighted(c, REGIONS, 3) if c.integer(0, 1) else None
    src = c.choice(SOURCES)
    members = []
    for _ in range(c.integer(2, 4)):
        m = _member(c, "checkpointed", src if c.integer(0, 3) else c.choice(SOURCES))
        m = replace(
            m,
            variant=middle if c.integer(0, 5) else c.choice(tuple(CHECKPOINT_MIDDLE)),
            shared=call if c.integer(0, 5) else c.choice(tuple(CHECKPOINT_CALLS)),
            region=m.region if block is None else block,
            consumer=m.consumer if c.integer(0, 3) == 0 else "",
        )
        members.append(legalize(m))
    return members


def _bn_expert_group(c: Choices) -> list[Member]:
    """2..6 parallel experts ``Linear -> BatchNorm1d -> ReLU -> Dropout`` over one source: mostly one
    BatchNorm setting and one dropout per group (an MMoE's experts), sometimes a member set apart."""
    setting, p = c.choice(tuple(BN_SETTINGS)), c.choice(BN_DROPOUT)
    src = c.choice(SOURCES)
    members = []
    for _ in range(c.integer(2, 6)):
        m = _member(c, "bn_expert", src if c.integer(0, 3) else c.choice(SOURCES))
        m = replace(
            m,
            variant=setting if c.integer(0, 5) else c.choice(tuple(BN_SETTINGS)),
            shared=p,
            region=m.region if c.integer(0, 2) == 0 else "",
        )
        members.append(legalize(m))
    return members


# Group generators of GROUP_KINDS (kind k is drawn when bit k of the last draw of :func:`generate` is set).
GROUPS = {"gate_pool": _gate_pool_group, "slice_matmul": _slice_matmul_group}


def generate(c: Choices, max_groups: int = 3) -> Spec:
    """A program of 1..``max_groups`` groups of members of one kind (2..8 towers, linears or split
    pieces: batching pays from about six members; 1..3 of the other kinds) (same-kind members are
    what the horizontal rules fuse); members that write into a source run first, so no op has
    saved that source for backward before it changes."""
    members: list[Member] = []
    for _ in range(c.integer(1, max_groups)):
        # half the groups are parallel towers / linears / split pieces: what the horizontal rules fuse
        kind = c.choice(FUSABLE) if c.integer(0, 1) else c.choice(KINDS)
        src = c.choice(SOURCES)
        # per-feature lookups pay from about ten tables (the index check costs four ops)
        many = c.integer(9, 12) if kind == "embedding" else c.integer(2, 8)
        for _ in range(many if kind in FUSABLE else c.integer(1, 3)):
            members.append(_member(c, kind, src if c.integer(0, 3) else c.choice(SOURCES)))
    if len(members) > 1 and c.integer(0, 2) == 0:  # interleave the groups
        order = [c.integer(0, 1000) for _ in members]
        members = [m for _, m in sorted(zip(order, members, strict=True), key=lambda t: t[0])]
    members.sort(key=lambda m: not mutates_source(m))  # stable: writers first
    spec = Spec(
        members=tuple(members),
        batch=c.choice((2, 3, 4)),
        width=c.choice((4, 6, 8)),
        hidden=c.choice((4, 8)),
        train=c.integer(0, 4) > 0,
        shared_blocks=c.integer(0, 1) == 1,
    )
    # Drawn last, so that each seed's program above is what it was before these kinds existed:
    # 0 none, 1 an MMoE block, 2 a DCN-Mix expert group, 3 both.
    groups = c.integer(0, 3)
    more = [m for k, kind in enumerate(GROUP_KINDS) if groups & (1 << k) for m in GROUPS[kind](c)]
    if more:
        members = [*spec.members, *more]
        if groups & 1 and c.integer(0, 1):
            # a batch where batching the poolings pays in training: on CPU the bmm's backward
            # costs per batch row, and T pooling matmuls cost T times that (batch_gate_pool)
            spec = replace(spec, batch=BIG_BATCH)
        # stable: the writers of a source first, then the tasks that write their experts (which
        # are built after the sources' writes: a Linear saves its input for backward)
        members.sort(key=lambda m: (not mutates_source(m), not m.writes))
        spec = replace(spec, members=tuple(members))
    # Drawn after everything above: 0 none, 1 a lookup input layer, 2 pairwise layers, 3 both.
    late = c.integer(0, 3)
    more = [m for k, kind in enumerate(LATE_GROUP_KINDS) if late & (1 << k) for m in LATE_GROUPS[kind](c)]
    if more:
        members = [*spec.members, *more]
        members.sort(key=lambda m: (not mutates_source(m), not m.writes))
        spec = replace(spec, members=tuple(members))
    # Drawn after everything above: a group of checkpointed towers in one program in three.
    if c.integer(0, 2) == 0:
        members = [*spec.members, *_checkpointed_group(c)]
        members.sort(key=lambda m: (not mutates_source(m), not m.writes))
        spec = replace(spec, members=tuple(members))
    # Drawn last: in one program in three the towers' results that nothing else reads are
    # concatenated into one over-arch input (``tw``), as a ranker's dense arch does, not returned;
    # the towers of one kind then share one activation, as one family's towers do
    if c.integer(0, 2) == 0:
        act = {m.kind: m.variant for m in reversed(spec.members) if _joins_towers(m)}
        joined = tuple(
            replace(m, joined=True, variant=act[m.kind]) if _joins_towers(m) else m for m in spec.members
        )
        spec = replace(spec, members=joined)
    # Drawn after that: in one program in three with stacked one-layer experts, they are two-layer
    if any(m.shared == "stack" for m in spec.members if m.kind == "gate_pool") and c.integer(0, 2) == 0:
        two = tuple(
            replace(m, shared="mlp") if m.kind == "gate_pool" and m.shared == "stack" else m
            for m in spec.members
        )
        spec = replace(spec, members=two)
    # Drawn last, so that each seed's program above is what it was before: the lookup layer under
    # one context (frozen or inference-only tables, low-precision lookups) in one program in two
    # that has one, a slice of one piece of each concatenation in one in two that has one; either
    # makes the checks train the model a few steps and compare the parameters
    lookups = [m for m in spec.members if m.kind == "feature_lookup"]
    if lookups and c.integer(0, 1):
        mode = c.choice(LOOKUP_MODES)
        if mode == "inference_mode" and any(m.consumer in INPLACE or m.keep for m in lookups):
            mode = "no_grad"  # an in-place write to an inference tensor outside it raises in eager
        members = [replace(m, region=mode) if m.kind == "feature_lookup" else m for m in spec.members]
        spec = replace(spec, members=tuple(members), lookup_mode=mode)
    joins = [m for m in spec.members if m.joined and (_joins_towers(m) or m.kind == "feature_lookup")]
    if len(joins) > 1 and c.integer(0, 1):
        spec = replace(spec, sliced=c.choice(SLICES))
    if spec.sliced or spec.lookup_mode:
        spec = replace(spec, train_steps=2)
    # Drawn after everything above: a group of BatchNorm experts in one program in three.
    if c.integer(0, 2) == 0:
        members = [*spec.members, *_bn_expert_group(c)]
        members.sort(key=lambda m: (not mutates_source(m), not m.writes))
        spec = replace(spec, members=tuple(members))
    # Drawn after everything above: 1..2 field input layers in one program in three.
    if c.integer(0, 2) == 0:
        members = [*spec.members, *_field_cat_group(c)]
        members.sort(key=lambda m: (not mutates_source(m), not m.writes))
        spec = replace(spec, members=tuple(members))
    return spec


def _field_cat_group(c: Choices) -> list[Member]:
    """1..2 RecBole input layers: each a cat of its source's columns (or rows), unsqueezed."""
    return [
        legalize(replace(_member(c, "field_cat", c.choice(SOURCES)), variant=c.choice(tuple(FIELD_FORMS))))
        for _ in range(c.integer(1, 2))
    ]


def _joins_towers(m: Member) -> bool:
    """A tower or gated tower whose result is read by nothing but the program's return."""
    return m.kind in ("tower", "gated") and not m.consumer


def random_spec(seed: int, max_groups: int = 3) -> Spec:
    return generate(RandomChoices(seed), max_groups)


def generate_over_arch(c: Choices) -> Spec:
    """A small program of its own: 2..4 members of different kinds (towers, linears, ``s @ W``,
    lookups, ``Linear(1, N)``), each computed from parameters of its own, concatenated into one
    over-arch input ``tw`` that is read only through a slice of one piece (``Spec.sliced``),
    then trained with AdamW and SGD with momentum.

    WHY its own generator: in :func:`generate` the concatenated towers or lookups are of one kind,
    so the horizontal rules batch them first and every piece is a view of one batched value; a
    slice then drops no parameter, and ``cat_split`` never cuts one off the gradient path (the
    rewrite that turns a zero gradient into None). Pieces of different kinds stay apart, so the
    slice leaves the other pieces' parameters with zero gradients in eager, which the optimizer
    steps move (weight decay, momentum) and a None would not. Small sizes and few members keep
    an example cheap enough for thousands of runs."""
    members: list[Member] = []
    ids = c.choice(tuple(IDS))
    for j in range(c.integer(2, 4)):
        kind = c.choice(OVER_ARCH_KINDS)
        m = _member(c, kind, "z" if kind == "feature_lookup" else c.choice(SOURCES))
        # mostly outside any region (a member under no_grad gives eager no gradient to keep)
        m = replace(m, region=m.region if c.integer(0, 4) == 0 else "", consumer="", keep=False, joined=True)
        if kind == "feature_lookup":
            m = replace(m, variant=c.choice(("long", "to", "int")), shared=ids, slot=j)
        members.append(legalize(m))
    spec = Spec(
        members=tuple(members),
        batch=c.choice((2, 3, 4)),
        width=c.choice((4, 6)),
        hidden=c.choice((2, 4)),
        train=c.integer(0, 4) > 0,
        shared_blocks=c.integer(0, 1) == 1,
        sliced=c.choice(OVER_ARCH_SLICES),
        train_steps=2,
        mixed_cat=True,
        head=_weighted(c, OVER_ARCH_HEADS, 3),
    )
    lookups = [m for m in spec.members if m.kind in ("feature_lookup", "embedding")]
    if lookups and c.integer(0, 2) == 0:  # frozen, inference-only or low-precision lookups
        mode = c.choice(LOOKUP_MODES)
        members = [
            replace(m, region=mode) if m.kind in ("feature_lookup", "embedding") else m for m in spec.members
        ]
        spec = replace(spec, members=tuple(members), lookup_mode=mode)
    return spec


def over_arch_spec(seed: int) -> Spec:
    return generate_over_arch(RandomChoices(seed))


def features(spec: Spec) -> set[str]:
    """Names of the constructs a program uses ("region:no_grad", "kind:bn_twice", "consumer:view",
    "view:w_t", "random:rrelu", ...): what a run covered, and what the gating in the tests reads."""
    out: set[str] = set()
    for m in spec.members:
        out.add(f"kind:{m.kind}")
        if m.region:
            out.add(f"region:{m.region}")
        if m.consumer:
            out.add(f"consumer:{m.consumer}")
        if m.keep:
            out.add("keep")
        if m.kind in ("random_dup", "random_unused"):
            out.add(f"random:{m.variant}")
        if m.kind in ("view_out", "alias_inplace", "split_cat", "stack_unbind"):
            out.add(f"{m.kind}:{m.variant}")
        if m.kind in GROUP_KINDS:
            out |= {f"{m.kind}:{m.variant}", f"{m.kind}:{m.shared}"}
        if m.writes:
            out.add(f"{m.kind}:writes")
        if m.kind in (*LATE_GROUP_KINDS, *CHECKPOINT_KINDS):
            out.add(f"{m.kind}:{m.variant}")
        if m.kind in CHECKPOINT_KINDS:
            out.add(f"{m.kind}:{m.shared}")
        if m.kind in BN_KINDS:
            out |= {f"{m.kind}:{m.variant}", f"{m.kind}:dropout{m.shared}"}
        if m.kind in FIELD_KINDS:
            out.add(f"{m.kind}:{m.variant}")
        if m.joined:
            out.add(f"{m.kind}:joined")
    for kind in GROUP_KINDS:
        group = [m for m in spec.members if m.kind == kind]
        if len({m.region for m in group}) > 1:
            out.add(f"{kind}:regions")  # some members in another grad-mode/autocast region
    for kind in ("slice_matmul", "feature_lookup"):
        slots = [m.slot for m in spec.members if m.kind == kind]
        if len(slots) > 1:
            if sorted(slots) != list(range(min(slots), min(slots) + len(slots))):
                out.add(f"{kind}:gap")
            elif slots != sorted(slots):
                out.add(f"{kind}:reversed")
    if len({m.shared for m in spec.members if m.kind == "feature_lookup"}) > 1:
        out.add("feature_lookup:two_sources")
    if spec.lookup_mode:
        out.add(f"lookup_mode:{spec.lookup_mode}")
    if spec.sliced:
        out.add(f"sliced:{spec.sliced}")
    if spec.mixed_cat:
        out.add("over_arch:mixed")
        out.add(f"over_arch:head_{spec.head or 'none'}")
    if spec.train_steps:
        out.add("trained")
    return out


# ----------------------------------------------------------------------------------------------
# source code


_RANDOM_CODE = {
    "dropout": "F.dropout({s}, 0.5, True)",
    "dropout_module": "self.drop{i}({s})",
    "rrelu": "torch.rrelu({s}, training=True)",
    "alpha_dropout": "F.alpha_dropout({s}, 0.5, True)",
    "feature_alpha_dropout": "F.feature_alpha_dropout({s}, 0.5, True)",
    "feature_dropout": "torch.feature_dropout({s}, 0.5, True)",
    "native_dropout": "torch.native_dropout({s}, 0.5, True)[0]",
    "bernoulli": "torch.bernoulli(torch.sigmoid({s}))",
    "rand_like": "torch.rand_like({s})",
}
_ACT_CODE = {
    "tanh": "torch.tanh({})",
    "gelu": "F.gelu({})",
    "silu": "F.silu({})",
    "sigmoid": "torch.sigmoid({})",
    "relu": "torch.relu({})",
    "neg": "torch.neg({})",
}


def _view_code(variant: str, s: str, i: int, spec: Spec) -> str:
    b, d = spec.batch, spec.width
    return {
        "slice": f"{s}[:, : {d // 2}]",
        "slice_all": f"{s}[:, :]",
        "view": f"{s}.view({b}, {d})",
        "reshape": f"{s}.reshape({b}, {d})",
        "t": f"{s}.t()",
        "contiguous": f"{s}.contiguous()",
        "plain": s,
        "dropout_eval": f"F.dropout({s}, 0.5, training=False)",
        "dropout_p0": f"F.dropout({s}, 0.0, training=True)",
        "w_t": f"self.w{i}.t()",
    }[variant]


def _consume(consumer: str, v: str, spec: Spec) -> list[str]:
    """Statements that read ``v`` with ``consumer`` (rebinding ``v`` where the result is new)."""
    if consumer == "view":
        return [f"{v} = {v}.view(-1)"]
    if consumer == "as_strided":
        return [f"{v} = {v}.as_strided({v}.shape, ({v}.shape[1], 1))"]
    if consumer == "t_view":
        return [f"{v} = {v}.unsqueeze(0).transpose(0, 1).view(-1)"]
    if consumer == "add_":
        return [f"{v}.add_(1.0)"]
    if consumer == "relu_":
        return [f"{v}.relu_()"]
    if consumer == "iadd":
        return [f"{v} += 1.0"]
    return []


def _gate_pool_lines(m: Member, i: int) -> tuple[list[str], list[str]]:
    """(statements, extra returned values) of task ``i`` of an MMoE block: its gate, its pooling
    of the experts, the write of the experts, its task head (``keep``: the pooled value is returned
    too, raw: its strides and memory are the caller's to see)."""
    ex = f"ex_{m.shared}"
    gate = (
        f"torch.softmax(self.tg{i}({m.src}), dim=-1)" if i % 2 else f"F.softmax(self.tg{i}({m.src}), dim=1)"
    )
    lines = [f"g{i} = {gate}", f"p{i} = {GATE_FORMS[m.variant].format(g=f'g{i}', ex=ex)}"]
    lines += [f"{ex}.mul_(0.5)"] if m.writes else []
    return [*lines, f"o{i} = self.head{i}(p{i})"], [f"p{i}"] if m.keep else []


def _slice_matmul_lines(m: Member, i: int) -> tuple[list[str], list[str]]:
    """(statements, extra returned values) of expert ``m.slot`` of a DCN-Mix layer: its matmul
    with the slice, then ``tanh`` (``gelu`` when an in-place consumer follows: tanh's backward
    reads its output). ``keep`` returns the raw product too; ``read`` also returns a penalty on
    the slice."""
    w = SLICED[m.shared].format(e=m.slot)
    lines, outs = [], []
    if m.variant == "read":
        lines += [f"w{i} = {w}", f"n{i} = (w{i} * w{i}).sum()"]
        outs += [f"n{i}"]
        w = f"w{i}"
    lines += [f"y{i} = {SLICE_FORMS[m.variant].format(s=m.src, w=w)}"]
    outs += [f"y{i}"] if m.keep else []
    act = "F.gelu" if m.consumer in INPLACE else "torch.tanh"
    return [*lines, f"o{i} = {act}(y{i})"], outs


def _pairwise_lines(m: Member, i: int, spec: Spec) -> list[str]:
    """PNN's inner products over the F = width // 2 pieces [B, 2] of the source: one cat of the
    left piece of every pair, one of the right, multiplied ("written": the source is a fresh
    tensor written in place after both cats read it)."""
    b, f = spec.batch, spec.width // 2
    pairs = [(a, c) for a in range(f) for c in range(a + 1, f)]
    src = {"view": f"{m.src}.view({b}, {f}, 2)", "reshape": f"{m.src}.reshape({b}, {f}, 2)"}
    lines = []
    if m.variant in ("fresh", "written"):
        lines += [f"u{i} = ({m.src} * 1.0).view({b}, {f}, 2)"]
    lines += [f"e{i} = torch.unbind({src.get(m.variant, f'u{i}')}, 1)"]
    lines += [f"p{i} = torch.cat([{', '.join(f'e{i}[{a}]' for a, _ in pairs)}], 1)"]
    lines += [f"q{i} = torch.cat([{', '.join(f'e{i}[{c}]' for _, c in pairs)}], 1)"]
    lines += [f"u{i}.mul_(2.0)"] if m.variant == "written" else []
    return [*lines, f"o{i} = p{i} * q{i}"]


def _emit_member(m: Member, i: int, spec: Spec) -> tuple[list[str], list[str]]:
    """(statements, names of the values returned) of member ``i``."""
    s, o = m.src, f"o{i}"
    lines: list[str] = []
    outs: list[str] = []
    act = _ACT_CODE.get(m.variant, "torch.tanh({})")
    if m.kind == "tower":
        lines += [f"m{i} = self.lin{i}({s})", f"{o} = {act.format(f'self.ln{i}(m{i})')}"]
        outs += [f"m{i}"] if m.keep else []
    elif m.kind == "gated":
        lines += [f"{o} = {act.format(f'self.lin{i}({s})')} * torch.sigmoid(self.gate{i}({s}))"]
    elif m.kind == "linear":
        lines += [f"{o} = self.lin{i}({s})"]
    elif m.kind == "split_pw":
        half = spec.width // 2
        lines += [f"a{i}, b{i} = torch.split({s}, {half}, dim=1)", f"{o} = {act.format(f'a{i}')}"]
        lines += [f"p{i} = {act.format(f'b{i}')}"]
        outs += [f"p{i}"]
    elif m.kind == "split_cat":
        src = _view_code(m.variant, s, i, spec)
        lines += [f"q{i} = torch.split({src}, 2, dim=1)", f"{o} = torch.cat([*q{i}], dim=1)"]
    elif m.kind == "stack_unbind":
        src = _view_code(m.variant, s, i, spec)
        # members at odd positions stack on another dim (stack_unbind's moved form): chosen by
        # position, not drawn, so every seed's other draws stay as they were
        lines += [f"r{i} = torch.unbind({src}, 1)", f"{o} = torch.stack([*r{i}], {1 if i % 2 == 0 else 0})"]
    elif m.kind == "bn_twice":
        lines += [f"{o} = self.bn{i}({s}) + self.bn{i}({s})"]
    elif m.kind == "bn_unused":
        lines += [f"self.bn{i}({s})"]
        o = ""
    elif m.kind == "random_dup":
        r = _RANDOM_CODE[m.variant].format(s=s, i=i)
        lines += [f"{o} = {r} - {r}"]
    elif m.kind == "random_unused":
        lines += [_RANDOM_CODE[m.variant].format(s=s, i=i)]
        o = ""
    elif m.kind == "embedding":
        rows = 5 + i
        lines += [f"{o} = F.embedding(({s}[:, 0].detach().abs() * 3).long() % {rows}, self.e{i})"]
    elif m.kind == "matmul_param":
        lines += [f"{o} = {MATMUL_FORMS[m.variant].format(s=s, i=i)}"]
    elif m.kind == "size1":
        col = i % spec.width
        lines += [f"{o} = self.lin{i}({s}[:, {col}:{col + 1}])"]
    elif m.kind == "gate_pool":
        more, outs = _gate_pool_lines(m, i)
        lines += more
    elif m.kind == "slice_matmul":
        more, outs = _slice_matmul_lines(m, i)
        lines += more
    elif m.kind == "feature_lookup":
        col = m.slot % (4 * spec.width)
        lines += [f"c{i} = {CASTS[m.variant].format(c=f'{m.shared}[:, {col}:{col + 1}]')}"]
        lines += [f"e{i} = F.embedding(c{i}, self.f{i})", f"{o} = e{i}.flatten(1)"]
        if m.variant == "read":
            lines += [f"n{i} = c{i}.float().mean()"]
            outs += [f"n{i}"]
    elif m.kind == "bn_expert":
        lines += [f"{o} = self.bx{i}({s})"]
    elif m.kind == "field_cat":
        lines += [f"{o} = {FIELD_FORMS[m.variant].format(s=s, n=min(spec.width, 4), b=spec.batch)}"]
    elif m.kind == "checkpointed":
        call = CHECKPOINT_CALLS[m.shared]
        lines += [f"{o} = torch.utils.checkpoint.checkpoint(self.ck{i}, {s}, {call})"]
    elif m.kind == "pairwise":
        lines += _pairwise_lines(m, i, spec)
        outs += [f"p{i}"] if m.keep else []  # the cat's own result: its layout is the caller's to see
    elif m.kind == "view_out":
        lines += [f"{o} = {_view_code(m.variant, s, i, spec)}"]
        if writes_under_no_grad(m):  # the write is the effect; autograd forbids reading the view
            return [*lines, *_consume(m.consumer, o, spec)], []
    elif m.kind == "alias_inplace":
        lines += [
            f"e{i} = torch.tanh({s})",
            f"c{i} = {s} * 1.0",
            f"y{i} = {_view_code(m.variant, f'c{i}', i, spec)}",
            f"y{i}.add_(1.0)",
            f"{o} = torch.tanh(c{i})",
        ]
        outs += [f"e{i}"]
    else:
        raise ValueError(f"unknown member kind {m.kind!r}")
    if o:
        if m.keep and m.kind not in ("tower", "gate_pool", "slice_matmul", "pairwise"):
            lines.append(f"k{i} = {o}")
            outs.append(f"k{i}")
        lines += _consume(m.consumer, o, spec)
        outs.append(o)
    return lines, outs


_REGION_HEAD = {
    "no_grad": ["with torch.no_grad():"],
    "enable_grad": ["with torch.no_grad():", "    with torch.enable_grad():"],
    "autocast": ['with torch.autocast("cpu", dtype=torch.bfloat16):'],
    "inference_mode": ["with torch.inference_mode():"],
}


def forward_source(spec: Spec) -> str:
    """The body of ``forward(self, x, z)`` as Python source."""
    body = []
    outs: list[str] = []
    k = 0
    members = spec.members
    pending = {m.shared for m in members if m.kind == "gate_pool"}  # experts not built yet

    def builds_experts(j: int) -> bool:
        return members[j].kind == "gate_pool" and members[j].shared in pending

    while k < len(members):
        region = members[k].region
        block = [k]
        if region:  # neighbours share the block (members of one group always: one `with` per block)
            while (
                block[-1] + 1 < len(members)
                and members[block[-1] + 1].region == region
                and not builds_experts(block[-1] + 1)
                and (spec.shared_blocks or members[k].kind == members[block[-1] + 1].kind in ONE_BLOCK_KINDS)
            ):
                block.append(block[-1] + 1)
        if builds_experts(k):  # outside any region, after the members that write the sources
            body.append(
                f"ex_{members[k].shared} = {EXPERTS[members[k].shared].format(e=N_EXPERTS, d=spec.hidden)}"
            )
            pending.discard(members[k].shared)
        lines: list[str] = []
        for j in block:
            more, names = _emit_member(members[j], j, spec)
            lines += more
            outs += names
        head = _REGION_HEAD.get(region, [])
        pad = "    " * len(head)
        body += head + [pad + line for line in lines]
        k = block[-1] + 1
    for name in sorted({m.shared for m in members if m.kind == "feature_lookup"}, reverse=True):
        body.insert(0, f"{name} = {IDS[name]}")
    if not outs or any(m.src == "h" for m in members):
        body.insert(0, "h = x * 1.5")
    if spec.mixed_cat:  # one over-arch input of every joined member, read through a slice
        pieces = [f"o{j}" for j, m in enumerate(members) if m.joined and not m.consumer]
        outs = [o for o in outs if o not in pieces]
        if pieces:
            cat = f"torch.cat([{', '.join(pieces)}], 1)"
            cut = _slice_expr(spec.sliced, cat, len(pieces), spec.hidden)
            body.append(f"tw = {OVER_ARCH_HEAD_CODE[spec.head].format(cut)}")
            outs.append("tw")
        outs = outs or ["h"]
        body.append(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        return "\n".join(body)
    joined = [
        f"e{j}" for j, m in enumerate(members) if m.joined and m.kind == "feature_lookup" and not m.consumer
    ]
    if len(joined) > 1:  # DeepCTR: torch.cat(sparse_embedding_list, dim=-1), then flattened
        cut = _slice_of(spec.sliced, joined, ":, :", spec.hidden)
        if cut:  # the pieces are read only through the slice
            outs = [o for o in outs if o not in {"o" + e[1:] for e in joined}]
        body.append(f"lk = torch.flatten(torch.cat([{', '.join(joined)}], -1){cut}, 1)")
        outs.append("lk")
    towers = [f"o{j}" for j, m in enumerate(members) if m.joined and _joins_towers(m)]
    if towers:  # the over-arch input: the towers' results side by side, each returned only there
        outs = [o for o in outs if o not in towers]
        cut = _slice_of(spec.sliced, towers, ":", spec.hidden) if len(towers) > 1 else ""
        body.append(f"tw = torch.cat([{', '.join(towers)}], 1){cut}")
        outs.append("tw")
    outs = outs or ["h"]  # every program returns something
    body.append(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    return "\n".join(body)


def _slice_of(sliced: str, pieces: list[str], lead: str, width: int) -> str:
    """The subscript reading only the first ("head") or last ("tail") piece of a concatenation of
    pieces ``width`` wide along its last dim (``lead``: what comes before that dim)."""
    if sliced == "head":
        return f"[{lead}, :{width}]"
    if sliced == "tail":
        return f"[{lead}, {width * (len(pieces) - 1)}:]"
    return ""


OVER_ARCH_HEAD_CODE = {"top": "self.top({})", "tanh": "torch.tanh({})", "": "{}"}


def _slice_width(spec: Spec) -> int:
    """How wide the over-arch input's slice is (what the top Linear reads)."""
    return max(spec.hidden // 2, 1) if spec.sliced == "part" else spec.hidden


def _slice_expr(sliced: str, cat: str, n: int, width: int) -> str:
    """``cat`` (``n`` pieces ``width`` wide along dim 1) read through one slice of one piece
    (:data:`OVER_ARCH_SLICES`); "middle" is the second piece when there are three or more."""
    if sliced == "middle" and n >= 3:
        return f"{cat}[:, {width}:{2 * width}]"
    if sliced == "part":
        return f"{cat}[:, :{max(width // 2, 1)}]"  # as _slice_width
    if sliced == "narrow":
        return f"{cat}.narrow(1, 0, {width})"
    if sliced == "split":
        return f"torch.split({cat}, {width}, 1)[0]"
    if sliced == "tail":
        return f"{cat}[:, {width * (n - 1)}:]"
    return f"{cat}[:, :{width}]"


def init_source(spec: Spec) -> str:
    """The body of ``__init__``: the submodules and parameters the members use."""
    d, hdim, b = spec.width, spec.hidden, spec.batch
    lines = ["super().__init__()"]
    for i, m in enumerate(spec.members):
        if m.kind == "tower":
            lines += [f"self.lin{i} = nn.Linear({d}, {hdim})", f"self.ln{i} = nn.LayerNorm({hdim})"]
        elif m.kind == "gated":
            lines += [f"self.lin{i} = nn.Linear({d}, {hdim})", f"self.gate{i} = nn.Linear({d}, {hdim})"]
        elif m.kind == "linear":
            lines += [f"self.lin{i} = nn.Linear({d}, {hdim}, bias={m.variant == 'bias'})"]
        elif m.kind == "embedding":
            lines += [f"self.e{i} = nn.Parameter(torch.randn({5 + i}, {hdim}))"]
        elif m.kind == "matmul_param":
            lines += [f"self.m{i} = nn.Parameter(torch.randn({d}, {hdim}) * 0.3)"]
        elif m.kind == "feature_lookup":
            lines += [f"self.f{i} = nn.Parameter(torch.randn({ID_ROWS}, {hdim}))"]
        elif m.kind == "checkpointed":
            middle = CHECKPOINT_MIDDLE[m.variant]
            lines += [
                f"self.ck{i} = nn.Sequential(nn.Linear({d}, {hdim}), {middle}, nn.Linear({hdim}, {hdim}))"
            ]
        elif m.kind == "size1":
            lines += [f"self.lin{i} = nn.Linear(1, {hdim}, bias={m.variant == 'bias'})"]
        elif m.kind in ("bn_twice", "bn_unused"):
            lines += [f"self.bn{i} = nn.BatchNorm1d({d})"]
        elif m.kind == "bn_expert":
            bn = ", ".join(v for v in (str(BN_WIDTH), BN_SETTINGS[m.variant]) if v)
            lines += [
                f"self.bx{i} = nn.Sequential(nn.Linear({d}, {BN_WIDTH}), nn.BatchNorm1d({bn}), "
                f"nn.ReLU(), nn.Dropout({m.shared}))"
            ]
        elif m.kind in ("random_dup", "random_unused") and m.variant == "dropout_module":
            lines += [f"self.drop{i} = nn.Dropout(0.5)"]
        elif m.kind == "gate_pool":
            lines += [
                f"self.tg{i} = nn.Linear({d}, {N_EXPERTS})",
                f"self.head{i} = nn.Linear({hdim}, {hdim})",
            ]
        if "w_t" in (m.variant,) and m.kind in ("view_out", "split_cat", "stack_unbind"):
            lines += [f"self.w{i} = nn.Parameter(torch.randn({d}, {b}))"]
    if spec.mixed_cat and spec.head == "top":
        lines += [f"self.top = nn.Linear({_slice_width(spec)}, {hdim})"]
    return "\n".join(lines + _shared_init(spec))


def _shared_init(spec: Spec) -> list[str]:
    """The tensors group members share: the experts of an MMoE block, the sliced parameters."""
    d, hdim, e = spec.width, spec.hidden, N_EXPERTS
    pooled = {m.shared for m in spec.members if m.kind == "gate_pool"}
    lines = []
    if "stack" in pooled or "mlp" in pooled:
        lines += [f"self.experts = nn.ModuleList([nn.Linear({d}, {hdim}) for _ in range({e})])"]
    if "mlp" in pooled:
        lines += [f"self.experts2 = nn.ModuleList([nn.Linear({hdim}, {hdim}) for _ in range({e})])"]
    if "view" in pooled:
        lines += [f"self.experts_all = nn.Linear({d}, {e * hdim})"]
    for name in sorted({m.shared for m in spec.members if m.kind == "slice_matmul"}):
        n = 1 + max(m.slot for m in spec.members if m.kind == "slice_matmul" and m.shared == name)
        shape = f"{n}, {d}, {hdim}" if name == "P" else f"2, {n}, {d}, {hdim}"
        lines += [f"self.{name} = nn.Parameter(torch.randn({shape}) * 0.3)"]
    return lines


def module_source(spec: Spec) -> str:
    def indent(text: str) -> str:
        return "\n".join("        " + line for line in text.splitlines())

    return (
        "class FuzzModule(nn.Module):\n"
        "    def __init__(self):\n"
        f"{indent(init_source(spec))}\n\n"
        "    def forward(self, x, z):\n"
        f"{indent(forward_source(spec))}\n"
    )


def build(spec: Spec, dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    """A fresh module running ``spec`` (parameters from ``seed``), in train or eval mode, in ``dtype``.
    Its class is compiled from :func:`module_source`; the source is registered with ``linecache``
    so tracebacks and Dynamo's messages show the program's lines."""
    src = module_source(spec)
    filename = f"<fuzz {hashlib.sha1(src.encode()).hexdigest()[:12]}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace: dict[str, Any] = {"torch": torch, "nn": nn, "F": F}
    exec(compile(src, filename, "exec"), namespace)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = namespace["FuzzModule"]()
    module.to(dtype)
    return module.train(spec.train)


def make_inputs(spec: Spec, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(spec.batch, spec.width, generator=gen, dtype=torch.float64).to(dtype)
    z = torch.randn(spec.batch, spec.width, generator=gen, dtype=torch.float64).to(dtype)
    return x.requires_grad_(True), z


def repro(spec: Spec, dtype: torch.dtype = torch.float32) -> str:
    """A standalone script building the program and its inputs (what a failure report shows)."""
    dt = str(dtype).replace("torch.", "")
    return (
        "import torch\nimport torch.nn.functional as F\nimport torch.utils.checkpoint\nfrom torch import nn\n\n"
        f"{module_source(spec)}\n"
        f"torch.manual_seed(0)\nm = FuzzModule().to(torch.{dt}).train({spec.train})\n"
        f"x = torch.randn({spec.batch}, {spec.width}, dtype=torch.{dt}, requires_grad=True)\n"
        f"z = torch.randn({spec.batch}, {spec.width}, dtype=torch.{dt})\n"
    )
