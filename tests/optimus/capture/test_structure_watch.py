"""The model changed after ``optimize()``: a parameter, buffer or submodule replaced, a state dict
loaded with ``assign=True``, a hook added or removed. The optimized module must give what the
model gives now (values and gradients), not what the captured graph read; in-place changes must
not cost a re-capture; a model saved after ``optimize()`` loads without optimus."""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict
from collections.abc import Callable

import pytest
import torch
import torch.nn.utils.parametrizations
import torch.nn.utils.parametrize
import torch.nn.utils.prune
from caller_world_models import CONFIGS, ScaledTowers, backward_grads
from torch import nn

import optimus
from optimus.capture import structure_watch
from optimus.capture.specialized import CHANGED


class Headed(ScaledTowers):
    """Batched towers, then a head Linear and a buffer the forward reads."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(128, 4)
        self.register_buffer("shift", torch.zeros(4))

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.head(super().forward(x, scale)) + self.shift


def _optimized(config: str) -> tuple[Headed, torch.fx.GraphModule, torch.Tensor]:
    torch.manual_seed(0)
    model = Headed()
    x = torch.randn(8, 256)
    gm = optimus.optimize(model, (x,), config=CONFIGS[config])
    assert gm.optimus_report.capture == "export"
    assert gm.optimus_report.rules_fired.get("batch_linear", 0) >= 1
    return model, gm, x


def _new_params(model: Headed) -> None:
    model.head.weight = nn.Parameter(torch.randn(4, 128))


def _new_head(model: Headed) -> None:
    model.head = nn.Linear(128, 4)


def _new_tower(model: Headed) -> None:
    model.linears[3] = nn.Linear(16, 16)


def _new_buffer(model: Headed) -> None:
    model.register_buffer("shift", torch.ones(4))


def _assign_load(model: Headed) -> None:
    state = {k: v + 0.5 for k, v in model.state_dict().items()}
    model.load_state_dict(state, assign=True)


def _forward_hook(model: Headed) -> None:
    model.linears[2].register_forward_hook(lambda m, i, o: o * 0.0)


def _pre_hook(model: Headed) -> None:
    model.head.register_forward_pre_hook(lambda m, i: (i[0] * 2.0,))


def _prune(model: Headed) -> None:
    torch.nn.utils.prune.l1_unstructured(model.head, "weight", amount=0.5)


def _weight_norm(model: Headed) -> None:
    torch.nn.utils.parametrizations.weight_norm(model.linears[1])


class _Scale(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * 3.0


def _parametrize(model: Headed) -> None:
    torch.nn.utils.parametrize.register_parametrization(model.head, "weight", _Scale())


CHANGES: dict[str, Callable[[Headed], None]] = {
    "parameter replaced": _new_params,
    "head module replaced": _new_head,
    "tower in a ModuleList replaced": _new_tower,
    "buffer replaced": _new_buffer,
    "load_state_dict(assign=True)": _assign_load,
    "forward hook added": _forward_hook,
    "forward pre-hook added": _pre_hook,
    "torch.nn.utils.prune": _prune,
    "parametrizations.weight_norm": _weight_norm,
    "parametrize.register_parametrization": _parametrize,
}


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
def test_the_optimized_module_follows_the_changed_model(config: str, change: str) -> None:
    model, gm, x = _optimized(config)
    gm(x)
    CHANGES[change](model)
    torch.testing.assert_close(gm(x), model(x))
    want = backward_grads(model, model, x)
    got = backward_grads(model, gm, x)
    assert all(g is not None for g in got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert gm.optimus_report.specializations == [CHANGED]
    gm(x)  # the same model and inputs again: the graph made for them, no new capture
    assert gm.optimus_report.specializations == [CHANGED]


def test_a_hook_removed_after_optimize_stops_running() -> None:
    torch.manual_seed(0)
    model = Headed()
    x = torch.randn(8, 256)
    handle = model.head.register_forward_hook(lambda m, i, o: o + 100.0)
    gm = optimus.optimize(model, (x,), config=CONFIGS["default"])
    torch.testing.assert_close(gm(x), model(x))
    handle.remove()
    torch.testing.assert_close(gm(x), model(x))
    assert float(gm(x).abs().max()) < 50.0


def test_a_hook_with_a_side_effect_runs_once_per_call() -> None:
    """The re-capture never runs forward for real: a hook that appends runs once per call (the
    call runs the original module eagerly when the hook keeps it from exporting)."""
    model, gm, x = _optimized("default")
    seen: list[int] = []
    model.linears[0].register_forward_hook(lambda m, i, o: seen.append(1))
    out = gm(x)
    assert seen == [1]
    torch.testing.assert_close(out, model(x))
    assert seen == [1, 1]
    gm(x)
    assert seen == [1, 1, 1]


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_in_place_changes_cost_no_re_capture(config: str) -> None:
    """What the graph reads is the same objects: loading values, an optimizer step, ``.to()``
    of the same dtype, train/eval of a model whose code does not read it."""
    model, gm, x = _optimized(config)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gm(x).sum().backward()
    opt.step()
    model.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()})
    model.to(torch.float32)
    torch.testing.assert_close(gm(x), model(x))
    assert gm.optimus_report.specializations == []
    assert gm.optimus_specializations == {}


def test_a_model_saved_after_optimize_has_plain_dicts() -> None:
    model, _gm, x = _optimized("default")
    assert isinstance(model.head.__dict__["_parameters"], structure_watch.WatchedDict)
    loaded = pickle.loads(pickle.dumps(model))
    for m in loaded.modules():
        assert type(m.__dict__["_parameters"]) is dict
        assert type(m.__dict__["_modules"]) is dict
        assert type(m.__dict__["_forward_hooks"]) is OrderedDict
    torch.testing.assert_close(loaded(x), model(x))


def test_a_deep_copy_watches_its_own_model() -> None:
    model, gm, x = _optimized("default")
    twin = copy.deepcopy(gm)
    source = twin._optimus_guard.source  # type: ignore[union-attr]
    assert source is not model
    source.head = nn.Linear(128, 4)  # the copy's model changes; the original's does not
    torch.testing.assert_close(twin(x), source(x))
    torch.testing.assert_close(gm(x), model(x))
    assert gm.optimus_report.specializations == []


def test_watched_dicts_count_every_kind_of_write() -> None:
    writes = structure_watch.Writes()
    module = nn.Sequential(nn.Linear(2, 2))
    structure_watch.watch(module, writes)
    structure_watch.watch(module, writes)  # watching twice: still one count per write
    before = writes.count
    module[0].register_forward_hook(lambda m, i, o: o, prepend=True)  # a set and a move_to_end
    module.append(nn.ReLU())
    del module[0].bias
    module[0].register_parameter("bias", None)
    module[0]._buffers.setdefault("b", torch.zeros(1))
    module[0]._buffers.setdefault("b", torch.ones(1))  # present: not a write
    module[0]._buffers.update(c=torch.zeros(1))
    module[0]._buffers.pop("c")
    module[0]._buffers |= {"d": torch.zeros(1)}
    module[0]._buffers.popitem()
    module[0]._buffers.clear()
    assert writes.count - before == 11


def test_a_hook_added_where_hooks_already_were() -> None:
    """A module with a hook at capture keeps its own hook dict (its handles point at it); a hook
    added there later is still seen."""
    torch.manual_seed(0)
    model = Headed()
    x = torch.randn(8, 256)
    model.head.register_forward_hook(lambda m, i, o: o + 1.0)
    gm = optimus.optimize(model, (x,), config=CONFIGS["default"])
    torch.testing.assert_close(gm(x), model(x))
    model.head.register_forward_hook(lambda m, i, o: o * 3.0)
    torch.testing.assert_close(gm(x), model(x))
    assert gm.optimus_report.specializations == [CHANGED]
