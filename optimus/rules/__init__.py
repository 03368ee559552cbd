"""The rule registry: one table, name -> rule class. Adding a rule = one file in the family's
folder (``batch/``, ``splitcat/`` or ``cleanup/``) + two lines here (its import and its entry
below; docs/optimus.md, "Adding a rule").

Order matters only for tie-breaking: when the cost model rates two candidates equal, the rule
listed first wins (the driver is deterministic). Cleanup rules run at the start of every round.
"""

from __future__ import annotations

from optimus.engine.rule import Rule
from optimus.rules.batch.batch_batch_norm import BatchBatchNorm
from optimus.rules.batch.batch_embedding import BatchEmbedding
from optimus.rules.batch.batch_gate_pool import BatchGatePool
from optimus.rules.batch.batch_layer_norm import BatchLayerNorm
from optimus.rules.batch.batch_linear import BatchLinear
from optimus.rules.batch.batch_pointwise import BatchBinary, BatchUnary
from optimus.rules.batch.batch_size1_linear import BatchSize1Linear
from optimus.rules.batch.batch_slice_matmul import BatchSliceMatmul
from optimus.rules.batch.embedding_index_select import EmbeddingIndexSelect
from optimus.rules.batch.group_linear import GroupLinear
from optimus.rules.batch.merge_shared_linear import MergeSharedLinear
from optimus.rules.batch.vector_matmul import VectorMatmul
from optimus.rules.cleanup.cleanup import CommonSubexpression, DeadCode
from optimus.rules.cleanup.functionalize_inplace import FunctionalizeInplace
from optimus.rules.cleanup.matmul_as_linear import MatmulAsLinear
from optimus.rules.cleanup.noop_dropout import NoopDropout
from optimus.rules.splitcat.cat_gather import CatGather
from optimus.rules.splitcat.cat_pieces import CatPieces
from optimus.rules.splitcat.cat_split import CatSplit
from optimus.rules.splitcat.flatten_cats import FlattenCats
from optimus.rules.splitcat.merge_splits import MergeSplits
from optimus.rules.splitcat.noop_split_cat import NoopSplitCat
from optimus.rules.splitcat.normalize_split_cat import NormalizeSplitCat
from optimus.rules.splitcat.reshape_pieces import ReshapePieces
from optimus.rules.splitcat.split_cat import SplitCat
from optimus.rules.splitcat.split_squeeze import SplitSqueeze
from optimus.rules.splitcat.stack_cast_pieces import StackCastPieces
from optimus.rules.splitcat.stack_pieces import StackPieces
from optimus.rules.splitcat.stack_unbind import StackUnbind
from optimus.rules.splitcat.unbind_cat import UnbindCat
from optimus.rules.splitcat.unsqueeze_cat import UnsqueezeCat

REGISTRY: dict[str, type] = {
    # cleanup (run at the start of every round; functionalize_inplace first: it unpins what dce/cse
    # and every later rule may then touch)
    "functionalize_inplace": FunctionalizeInplace,
    "matmul_as_linear": MatmulAsLinear,  # x @ W with W a parameter: a linear the rules below see
    "noop_dropout": NoopDropout,  # dropout with p = 0 or training off returns its input itself
    "dce": DeadCode,
    "cse": CommonSubexpression,
    # shared-input merge (listed before batch_linear: it wins ties on the same linears)
    "merge_shared_linear": MergeSharedLinear,
    # horizontal batch fusion
    "batch_linear": BatchLinear,
    "batch_size1_linear": BatchSize1Linear,  # Linear(1, N) per feature: one broadcast multiply-add
    "group_linear": GroupLinear,  # different-shape linears: one grouped launch (Triton on CUDA)
    "batch_layer_norm": BatchLayerNorm,
    "batch_batch_norm": BatchBatchNorm,  # BatchNorm1d side by side on the channels (train: stats copied back)
    "batch_embedding": BatchEmbedding,  # per-feature lookups: one gather over the tables laid end to end
    # a trained lookup on CPU: index_select's backward (one index_add_) beats embedding's sort
    "embedding_index_select": EmbeddingIndexSelect,
    "batch_unary": BatchUnary,
    "batch_binary": BatchBinary,
    "batch_gate_pool": BatchGatePool,  # T gate poolings of one experts tensor: one bmm (before vector_matmul)
    "vector_matmul": VectorMatmul,  # bmm with one row (MMoE's gate pooling), in training on CPU
    "batch_slice_matmul": BatchSliceMatmul,  # matmuls with slices P[e] of one tensor: one bmm over P
    # split/cat family (normalize_split_cat is a cleanup: it runs at the start of every round)
    "normalize_split_cat": NormalizeSplitCat,
    "split_cat": SplitCat,
    "cat_split": CatSplit,
    "merge_splits": MergeSplits,
    "flatten_cats": FlattenCats,
    "noop_split_cat": NoopSplitCat,
    "stack_unbind": StackUnbind,
    "unbind_cat": UnbindCat,
    "stack_pieces": StackPieces,
    "stack_cast_pieces": StackCastPieces,  # stack of x[.., i:i+1].long() pieces: one conversion of a view
    "cat_pieces": CatPieces,  # cat of adjacent equal pieces along another dim: one clone
    "cat_gather": CatGather,  # cat of repeated/permuted unbind pieces (pairwise layers): one gather
    "reshape_pieces": ReshapePieces,  # stack/cat of equally reshaped adjacent pieces: one reshape, one clone
    "unsqueeze_cat": UnsqueezeCat,  # cat of unsqueezes on its dim (RecBole's field inputs): one stack
    "split_squeeze": SplitSqueeze,  # size-1 split pieces squeezed on the split dim: an unbind (cleanup)
}


def resolve(names: object) -> list[Rule]:
    """Instantiate rules by name (None: all). ValueError names unknown ones and lists valid ones."""
    if names is None:
        chosen = list(REGISTRY)
    else:
        if isinstance(names, str) or not hasattr(names, "__iter__"):
            raise ValueError(f"rules must be a list of rule names or None, got {names!r}")
        chosen = list(names)  # type: ignore[call-overload]
        unknown = [n for n in chosen if n not in REGISTRY]
        if unknown:
            raise ValueError(f"unknown rule name(s) {unknown}; valid rules: {sorted(REGISTRY)}")
    return [REGISTRY[n]() for n in chosen]


__all__ = ["REGISTRY", "resolve"]
