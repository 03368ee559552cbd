"""normalize_split_cat: every split/chunk/cat/stack/unbind call form -> one canonical form."""

from __future__ import annotations

import operator

import pytest
import torch
from split_cat_helpers import fired, run
from torch import fx

RULES = ["normalize_split_cat"]

# (y, d, n): split y along its last dim, given as d >= 0 or n < 0 (the last dim has size 8)
SPLITS = {
    "split_int_positional": lambda y, d, n: torch.split(y, 3, d),
    "split_method_negative": lambda y, d, n: y.split(3, n),
    "split_list_keyword": lambda y, d, n: torch.split(y, [2, 6], dim=n),
    "split_size_keyword": lambda y, d, n: torch.split(y, split_size_or_sections=4, dim=d),
    "chunk_uneven": lambda y, d, n: torch.chunk(y, 3, d),  # 8 -> 3, 3, 2
    "chunk_fewer_pieces": lambda y, d, n: y.chunk(6, dim=n),  # 8 -> 2, 2, 2, 2 (four, not six)
    "split_with_sizes": lambda y, d, n: y.split_with_sizes([5, 3], d),
    "tensor_split_sections": lambda y, d, n: torch.tensor_split(y, 3, n),  # 3, 3, 2
    "tensor_split_indices": lambda y, d, n: y.tensor_split([1, 6], dim=n),
    # NumPy's axis= (the argument parser's name for dim; torch.split, a Python function, has none)
    "chunk_axis": lambda y, d, n: torch.chunk(y, 2, axis=n),
    "chunk_method_axis": lambda y, d, n: y.chunk(4, axis=d),
    "tensor_split_axis": lambda y, d, n: torch.tensor_split(y, 3, axis=n),
    "split_with_sizes_axis": lambda y, d, n: y.split_with_sizes([5, 3], axis=n),
    # the ATen overloads written directly, by their schema names
    "aten_split_tensor": lambda y, d, n: torch.ops.aten.split.Tensor(y, 3, n),
    "aten_split_tensor_keywords": lambda y, d, n: torch.ops.aten.split.Tensor(y, split_size=5, dim=d),
    "aten_split_sizes": lambda y, d, n: torch.ops.aten.split.sizes(y, [2, 6], n),
    "aten_split_packet_list": lambda y, d, n: torch.ops.aten.split(y, [1, 7], d),
    "aten_split_packet_int": lambda y, d, n: torch.ops.aten.split(y, 4, n),
    "aten_split_with_sizes": lambda y, d, n: torch.ops.aten.split_with_sizes.default(y, [5, 3], n),
    "aten_split_with_sizes_keywords": lambda y, d, n: torch.ops.aten.split_with_sizes.default(
        y, split_sizes=[6, 2], dim=n
    ),
    "aten_chunk": lambda y, d, n: torch.ops.aten.chunk.default(y, 3, n),
    "aten_tensor_split_sections": lambda y, d, n: torch.ops.aten.tensor_split.sections(y, 3, n),
    "aten_tensor_split_indices": lambda y, d, n: torch.ops.aten.tensor_split.indices(y, [1, 6], d),
}


def _canonical_splits(gm: fx.GraphModule) -> list[fx.Node]:
    found = []
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method") and (
            "split" in str(n.target) or "chunk" in str(n.target)
        ):
            assert n.op == "call_function" and n.target is torch.split, n.format_node()
            assert isinstance(n.args[1], list) and all(isinstance(s, int) for s in n.args[1])
            assert n.kwargs["dim"] >= 0
            found.append(n)
    return found


@pytest.mark.parametrize("form", sorted(SPLITS))
@pytest.mark.parametrize("lead", [(4,), (2, 3)])
def test_split_forms_become_torch_split_with_sizes(form, lead) -> None:  # type: ignore[no-untyped-def]
    split = SPLITS[form]
    d = len(lead)
    count = len(split(torch.empty(*lead, 8), d, -1))

    def f(self, x):  # type: ignore[no-untyped-def]
        parts = split(x * 2.0, d, -1)
        return tuple(parts[i] * float(i + 1) for i in range(count))

    gm = run(f, [torch.randn(*lead, 8)], RULES)
    assert fired(gm, "normalize_split_cat") == 1
    (node,) = _canonical_splits(gm)
    assert node.kwargs["dim"] == d
    pieces = split(torch.empty(*lead, 8), d, -1)
    assert node.args[1] == [p.shape[d] for p in pieces]


@pytest.mark.parametrize(
    "form",
    [
        lambda a, b: torch.cat([a, b], -1),
        lambda a, b: torch.concat((a, b), dim=1),
        lambda a, b: torch.concatenate([a, b], axis=-1),
        lambda a, b: torch.stack([a, b], -1),
        lambda a, b: torch.stack((a, b), dim=2),
        lambda a, b: torch.cat([a, b], axis=-1),
        lambda a, b: torch.concat([a, b], axis=1),
        lambda a, b: torch.stack([a, b], axis=-1),
        lambda a, b: torch.ops.aten.cat.default([a, b], -1),
        lambda a, b: torch.ops.aten.cat([a, b], dim=1),
        lambda a, b: torch.ops.aten.concat.default([a, b], -1),
        lambda a, b: torch.ops.aten.concatenate.default([a, b], 1),
        lambda a, b: torch.ops.aten.stack.default([a, b], -1),
        lambda a, b: torch.ops.aten.stack([a, b], dim=2),
    ],
)
def test_cat_and_stack_forms_get_a_list_and_a_non_negative_dim(form) -> None:  # type: ignore[no-untyped-def]
    gm = run(lambda self, x, y: form(x * 1.0, y * 2.0), [torch.randn(2, 3), torch.randn(2, 3)], RULES)
    assert fired(gm, "normalize_split_cat") == 1
    (node,) = [n for n in gm.graph.nodes if n.target in (torch.cat, torch.stack)]
    assert isinstance(node.args[0], list) and node.kwargs["dim"] in (1, 2)


UNBINDS = {
    "method": lambda y: y.unbind(-1),
    "axis": lambda y: torch.unbind(y, axis=-1),
    "method_axis": lambda y: y.unbind(axis=1),
    "aten_int": lambda y: torch.ops.aten.unbind.int(y, -1),
    "aten_packet_keyword": lambda y: torch.ops.aten.unbind(y, dim=1),
}


@pytest.mark.parametrize("form", sorted(UNBINDS))
def test_unbind_forms_get_a_non_negative_dim(form: str) -> None:
    unbind = UNBINDS[form]

    def f(self, x):  # type: ignore[no-untyped-def]
        a, b, c = unbind(x * 1.0)
        return a + b + c

    gm = run(f, [torch.randn(2, 3)], RULES)
    assert fired(gm, "normalize_split_cat") == 1
    (node,) = [n for n in gm.graph.nodes if n.target is torch.unbind]
    assert node.kwargs == {"dim": 1}


def test_canonical_forms_are_left_alone() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b = torch.split(x * 1.0, [2, 2], dim=1)
        c = torch.cat([a, b], 0)  # positional dim: already canonical
        return torch.stack([c, c]), torch.unbind(c, dim=1)[0]

    gm = run(f, [torch.randn(2, 4)], RULES)
    assert fired(gm, "normalize_split_cat") == 0


def test_tensor_split_with_overlapping_indices_is_not_a_split() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b, c = torch.tensor_split(x * 1.0, [3, 1], 1)  # x[:, :3], x[:, 3:1] (empty), x[:, 1:]
        return a.sum() + c.sum(), b

    gm = run(f, [torch.randn(2, 5)], RULES)
    assert fired(gm, "normalize_split_cat") == 0


def test_mutated_values_are_left_alone() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 1.0
        y.add_(1.0)
        a, b = y.split(2, -1)
        return a * 1.0, b * 1.0

    gm = run(f, [torch.randn(2, 4)], RULES)
    assert fired(gm, "normalize_split_cat") == 0


@pytest.mark.parametrize("form", ["aten_split", "aten_unbind", "aten_cat"])
def test_mutated_aten_forms_are_left_alone(form: str) -> None:
    """The ATen forms bind to the canonical ops, and so fall under the same guard: a value written
    in place (and its views) is ordered, never rewritten."""

    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 1.0
        y.add_(1.0)
        if form == "aten_split":
            a, b = torch.ops.aten.split.Tensor(y, 2, -1)
            return a * 1.0, b * 1.0
        if form == "aten_unbind":
            a, b = torch.ops.aten.unbind.int(y, -1)
            return a * 1.0, b * 1.0
        return torch.ops.aten.cat.default([y, y], -1)

    gm = run(f, [torch.randn(2, 4) if form != "aten_unbind" else torch.randn(2, 2)], RULES)
    assert fired(gm, "normalize_split_cat") == 0


def test_tuple_slice_then_index_folds_to_one_index() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        parts = torch.split(x * 1.0, [1, 2, 3], dim=1)
        tail = parts[1:3]
        return tail[0] * 2.0, tail[1]

    gm = run(f, [torch.randn(2, 6)], RULES)
    assert fired(gm, "normalize_split_cat") == 2
    getitems = [n for n in gm.graph.nodes if n.target is operator.getitem]
    assert sorted(n.args[1] for n in getitems) == [1, 2]
