"""The outside corpus (models/outside/) as a harness provider.

    optimus-bench ab --provider harness.providers.outside_corpus:build --model rechub.MMOE --scale small

Why: the corpus measurement (`harness.diagnose.outside_gain`) times the rules alone, in eager, on
the corpus models; a user decides from the harness's figures, which time what Inductor makes of
the graph with and without the rules (`ab`, compile against compile+optimus). This provider lets
every harness command run the corpus models as they are, through the same contract as
`models.build` (harness/provider.py).

The corpus models have no sparse/dense split: each zoo's module is the whole model, and the modes
prepare `module.dense`. So `module.dense` is the zoo's module behind a thin adapter that takes the
tensors of its example inputs flat (a zoo's inputs may be a dict of columns, or a
KeyedJaggedTensor) and rebuilds the zoo's own structure before calling it; `module.sparse` is an
empty placeholder. The harness's batches are the corpus's own seeded inputs (one per seed) at the
corpus's own sizes (batch 64, torchrec's 32), which is the one scale, named `small`; a batch whose
tensors' shapes differ from the first's (torchrec's KeyedJaggedTensor values vary in length from
seed to seed) is left out, as the modes compile for one set of shapes (`dynamic=False`). The training
loss is a synthetic one, as the corpus's: the mean squared error of the outputs against seeded
{0, 1} labels of the same shape (the zoos' outputs are probabilities or logits of 1-3 tasks).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from models import outside

SCALES: tuple[str, ...] = ("small",)
BATCHES = 3  # distinct seeded input sets per build (the harness cycles its batches)


def _families() -> tuple[str, ...]:
    try:
        return tuple(outside.names())
    except Exception:  # a zoo that fails to import must not break `--help` or `list`
        return ()


FAMILIES: tuple[str, ...] = _families()


class Layout:
    """Where the tensors sit in a zoo's inputs: the harness hands `dense` a tuple of tensors,
    while a zoo may take a dict of columns or a KeyedJaggedTensor. Leaves that are not tensors
    (a KJT's absent lengths) are kept as they were in the example inputs. A plain object, not a
    module: the modes replace `dense` with what they prepared, and the layout must outlive it."""

    def __init__(self, example: tuple[Any, ...]) -> None:
        leaves, self.spec = pytree.tree_flatten(example)
        self.tensor_at = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor))
        self.others = [None if isinstance(leaf, Tensor) else leaf for leaf in leaves]

    def flat(self, inputs: tuple[Any, ...]) -> tuple[Tensor, ...]:
        """The tensors of `inputs`, in the order `FlatInputs.forward` takes them."""
        leaves, spec = pytree.tree_flatten(inputs)
        if spec != self.spec:
            raise ValueError(f"outside corpus: inputs of another structure than the example's: {spec}")
        return tuple(leaves[i] for i in self.tensor_at)

    def rebuild(self, tensors: tuple[Tensor, ...]) -> Any:
        leaves = list(self.others)
        for i, t in zip(self.tensor_at, tensors, strict=True):
            leaves[i] = t
        return pytree.tree_unflatten(leaves, self.spec)


class FlatInputs(nn.Module):
    """The zoo's model, called with its inputs' tensors flat (`Layout`)."""

    def __init__(self, model: nn.Module, layout: Layout) -> None:
        super().__init__()
        self.model = model
        self.layout = layout

    def forward(self, *tensors: Tensor) -> Tensor:
        return self.model(*self.layout.rebuild(tensors))


class CorpusModel(nn.Module):
    """`module(*inputs)`: the zoo's model on its own inputs (through `dense`, which the modes
    prepare); `sparse` is empty: the corpus models hold their embeddings in the one module."""

    def __init__(self, model: nn.Module, layout: Layout) -> None:
        super().__init__()
        self.sparse = nn.Identity()
        self.dense = FlatInputs(model, layout)
        self.layout = layout

    def forward(self, *inputs: Any) -> Tensor:
        return self.dense(*self.layout.flat(inputs))


@dataclass
class Batch:
    inputs: tuple[Any, ...]
    labels: Tensor


@dataclass
class Built:
    module: CorpusModel
    batches: list[Batch]
    meta: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def loss(logits: Tensor, labels: Tensor) -> Tensor:
        return (logits.float() - labels).square().mean()

    def dense_inputs(self, batch: Batch) -> tuple[Tensor, ...]:
        return self.module.layout.flat(batch.inputs)


def _to(inputs: tuple[Any, ...], device: str) -> tuple[Any, ...]:
    return pytree.tree_map(lambda x: x.to(device) if isinstance(x, Tensor) else x, inputs)


def build(
    name: str, scale: str = "small", device: str = "cpu", seed: int = 0, count_nodes: bool = False
) -> Built:
    """The corpus model `name` (e.g. ``rechub.MMOE``), its weights from `seed`, and `BATCHES`
    seeded input sets of the corpus's own sizes. `count_nodes` is accepted and ignored (the
    harness counts the prepared graph's nodes itself)."""
    del count_nodes
    if scale not in SCALES:
        raise ValueError(
            f"scale: unknown {scale!r} for the outside corpus; allowed values: {', '.join(SCALES)}"
        )
    model, example = outside.build(name, seed)  # raises OutsideModelError (a ValueError): one line
    model = model.to(device)
    with torch.no_grad():  # the outputs' shape, from a copy: the model's own state stays as built
        shape = tuple(copy.deepcopy(model).eval()(*_to(example, device)).shape)
    layout = Layout(example)
    shapes = [t.shape for t in layout.flat(example)]
    batches = []
    for k in range(BATCHES):
        # the same weights for every batch: only the inputs come from the next seeds
        inputs = example if k == 0 else outside.build(name, seed + 1000 * k)[1]
        if [t.shape for t in layout.flat(inputs)] != shapes:
            continue  # a KJT's values vary in length: the modes are compiled for the first's shapes
        gen = torch.Generator().manual_seed(seed + 7 + k)
        labels = torch.randint(0, 2, shape, generator=gen).float().to(device)
        batches.append(Batch(_to(inputs, device), labels))
    module = CorpusModel(model, layout)
    meta = {
        "family": name,
        "zoo": outside.zoo_of(name),
        "scale": scale,
        "seed": seed,
        "batch_size": int(next(t for t in pytree.tree_leaves(example) if isinstance(t, Tensor)).shape[0]),
        "params": sum(p.numel() for p in model.parameters()),
    }
    return Built(module, batches, meta)
