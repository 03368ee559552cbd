"""models/synthetic_towers.py: each configuration its users rely on computes what it says, and bad
options fail at construction with one line naming what is allowed."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from models.synthetic_towers import Towers


def test_default_is_split_linear_norm_tanh_cat() -> None:
    torch.manual_seed(0)
    m, x = Towers(3, 4, 5), torch.randn(2, 12)
    want = torch.cat(
        [
            torch.tanh(F.layer_norm(F.linear(x[:, 4 * i : 4 * i + 4], lin.weight, lin.bias), (5,)))
            for i, lin in enumerate(m.linears)
        ],
        dim=1,
    )
    torch.testing.assert_close(m(x), want)
    narrow = Towers(3, 4, 5, slices="narrow")
    narrow.load_state_dict(m.state_dict())
    torch.testing.assert_close(narrow(x), want)


def test_stacked_inputs_tuple_join_and_head() -> None:
    torch.manual_seed(0)
    m, x = Towers(3, 4, 2, slices="unbind", body=("linear",), join="tuple"), torch.randn(3, 5, 4)
    out = m(x)
    assert isinstance(out, tuple) and len(out) == 3
    torch.testing.assert_close(out[1], m.linears[1](x[1]))
    deep = Towers(3, 4, 6, body=("linear", "relu", "linear", "relu", "norm"), head=1)
    assert deep(torch.randn(5, 12)).shape == (5, 1) and len(deep.linears2) == 3


def test_parameters_are_drawn_step_by_step() -> None:
    """Every tower's first Linear, then every tower's second: the order the replaced copies used."""
    torch.manual_seed(0)
    m = Towers(2, 4, 4, body=("linear", "relu", "linear"))
    torch.manual_seed(0)
    first = [torch.nn.Linear(4, 4) for _ in range(2)]
    torch.testing.assert_close(m.linears[1].weight, first[1].weight)


@pytest.mark.parametrize(
    "kw",
    [{"slices": "diagonal"}, {"join": "list"}, {"body": ("linear", "gelu")}, {"body": ("norm", "linear")},
     {"body": ("linear",) * 3}, {"head": 1, "join": "tuple"}, {"n": 0}],
)  # fmt: skip
def test_bad_options_are_one_clear_error(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"allowed|must"):
        Towers(**kw)  # type: ignore[arg-type]
