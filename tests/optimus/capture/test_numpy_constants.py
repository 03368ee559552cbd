"""NumPy array attributes that ``forward`` copies into tensors (RecBole's field offsets): one whole
graph holding them as constants, results and gradients as eager's, the module's arrays left as
they were; a use that may write the array declines; the graph reads the arrays at each call, eager
or compiled, and another dtype or shape re-captures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import optimus
from optimus.capture import numpy_constants as nc
from optimus.capture.numpy_constants import ArrayReader
from optimus.capture.specialized import ARRAYS_CHANGED, GUARD

pytestmark = pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")


class OffsetEmbedding(nn.Module):
    """RecBole's ``FMEmbedding``: one table for every field, offsets kept as a NumPy array."""

    def __init__(self, dims: list[int], dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(sum(dims), dim)
        self.offsets = np.array((0, *np.cumsum(dims)[:-1]), dtype=np.int64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding(x + x.new_tensor(self.offsets).unsqueeze(0))


class RecBoleStyle(nn.Module):
    """Offsets read two ways (``new_tensor`` in the table, ``torch.tensor(..., device=)`` here),
    one array shared by the model and its table, as RecBole's context-aware models do."""

    def __init__(self) -> None:
        super().__init__()
        self.table = OffsetEmbedding([7, 11, 5], 4)
        self.field_offsets = self.table.offsets
        self.scale = np.array([0.5, 1.5, 2.0], dtype=np.float32)
        self.head = nn.Linear(12, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.table(x) * torch.tensor(self.scale, device=x.device).view(1, 3, 1)
        return self.head(e.flatten(1)) + torch.tensor(self.field_offsets, device=x.device).sum()


def _pair() -> tuple[RecBoleStyle, RecBoleStyle, torch.Tensor]:
    torch.manual_seed(0)
    model, ref = RecBoleStyle(), RecBoleStyle()
    ref.load_state_dict(model.state_dict())
    x = torch.stack([torch.randint(0, d, (16,)) for d in (7, 11, 5)], 1)
    return model, ref, x


def test_numpy_offsets_give_one_whole_graph_equal_to_eager() -> None:
    model, ref, x = _pair()
    arrays = (model.table.offsets, model.scale)
    values = tuple(a.copy() for a in arrays)
    flags = tuple(a.flags.writeable for a in arrays)
    gm = optimus.optimize(model, (x,))
    rep = gm.optimus_report
    assert (rep.capture, rep.graphs) == ("export", 1), rep.capture_reason
    assert "table.offsets" in rep.capture_reason and "scale" in rep.capture_reason
    assert len(list(gm.graph.find_nodes(op="placeholder"))) == 1  # the arrays are no inputs
    # the module holds the very same arrays, with the same values and flags
    assert model.table.offsets is arrays[0] and model.field_offsets is arrays[0] and model.scale is arrays[1]
    assert all(np.array_equal(a, v) and a.dtype == v.dtype for a, v in zip(arrays, values, strict=True))
    assert tuple(a.flags.writeable for a in arrays) == flags
    assert not any(k.startswith("_optimus_ndarray_") for k in gm.state_dict())
    got, want = gm(x), ref(x)
    assert torch.equal(got, want) and got.dtype == want.dtype
    got.sum().backward()
    want.sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)


def test_a_read_only_array_is_left_read_only() -> None:
    """Dynamo sets a read-only array writeable while it traces it; the capture sets it back."""
    model, ref, x = _pair()
    model.scale.flags.writeable = False
    gm = optimus.optimize(model, (x,))
    assert not model.scale.flags.writeable
    assert gm.optimus_report.capture == "export"
    assert torch.equal(gm(x), ref(x))


def test_an_array_written_between_calls_is_not_read_stale() -> None:
    model, ref, x = _pair()
    gm = optimus.optimize(model, (x,))
    assert torch.equal(gm(x), ref(x))
    for m in (model, ref):
        m.table.offsets[2] -= 1  # in place, as eager sees it
    assert torch.equal(gm(x), ref(x))
    for m in (model, ref):
        m.scale = np.array([2.0, 1.0, 0.25], dtype=np.float32)  # another array, same dtype and shape
    assert torch.equal(gm(x), ref(x))
    assert getattr(gm, GUARD).reasons == []  # the graph reads the arrays: nothing to re-capture
    for m in (model, ref):
        m.scale = np.array([2.0, 1.0, 0.25], dtype=np.float16)  # another dtype
    got, want = gm(x), ref(x)
    assert torch.equal(got, want) and got.dtype == want.dtype
    assert getattr(gm, GUARD).reasons == [ARRAYS_CHANGED]
    assert torch.equal(gm(x), ref(x))  # unchanged since: the new graph, no second capture
    for m in (model, ref):
        m.field_offsets = m.field_offsets.copy()  # the two attributes no longer hold one array
        m.field_offsets[0] = 3
    assert torch.equal(gm(x), ref(x))
    assert getattr(gm, GUARD).reasons == [ARRAYS_CHANGED, ARRAYS_CHANGED]


class WritesThroughTensor(OffsetEmbedding):
    """``torch.from_numpy`` shares the array's memory: the graph could write the array."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offsets = torch.from_numpy(self.offsets)
        offsets.mul_(1)
        return self.embedding(x + offsets)


def test_an_array_forward_may_write_is_not_a_constant() -> None:
    torch.manual_seed(0)
    model = WritesThroughTensor([7, 11, 5], 4)
    ref = WritesThroughTensor([7, 11, 5], 4)
    ref.load_state_dict(model.state_dict())
    x = torch.stack([torch.randint(0, d, (16,)) for d in (7, 11, 5)], 1)
    gm = optimus.optimize(model, (x,))
    rep = gm.optimus_report
    assert rep.capture == "dynamo-subgraphs"
    assert "NotConstant" in rep.capture_reason and "NumPy array offsets" in rep.capture_reason
    assert torch.equal(gm(x), ref(x))


def test_under_torch_compile_the_arrays_are_read_as_they_are() -> None:
    """``torch.compile(optimize(model), fullgraph=True)``, as the harness compiles it: Dynamo
    traces the per-call check (it cannot read an array's values or dtype), and the graph reads
    the arrays at each call, so a write in place is read by the compiled graph without a
    re-capture."""
    torch._dynamo.reset()  # each optimized module is a type of its own: a fresh recompile budget
    model, ref, x = _pair()
    gm = optimus.optimize(model, (x,))
    reads = [m for m in gm.children() if isinstance(m, ArrayReader)]
    assert len(reads) == 2  # the offsets (two attributes, one array) and the scale
    assert {tuple(r().tolist()) for r in reads} == {(0, 7, 18), (0.5, 1.5, 2.0)}
    compiled = torch.compile(gm, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x), ref(x))
    for m in (model, ref):
        m.table.offsets[1] += 2
        m.scale[0] = -3.0
    got, want = compiled(x), ref(x)
    assert torch.equal(got, want)
    got.sum().backward()
    want.sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)
    for m in (model, ref):
        m.scale = np.array([1.0, 1.0, 1.0], dtype=np.float32)  # another array, same dtype and shape
    assert torch.equal(compiled(x), ref(x))
    # another dtype: a call the graph was not made for, which fullgraph refuses
    model.scale = np.array([1.0, 1.0, 1.0], dtype=np.float16)
    with pytest.raises(Exception, match=r"re-optimizes outside torch\.compile"):
        compiled(x)


def test_under_torch_compile_another_dtype_re_optimizes_outside_the_graph() -> None:
    torch._dynamo.reset()  # each optimized module is a type of its own: a fresh recompile budget
    model, ref, x = _pair()
    gm = optimus.optimize(model, (x,))
    compiled = torch.compile(gm, dynamic=False)  # not fullgraph: the re-capture runs eagerly
    assert torch.equal(compiled(x), ref(x))
    for m in (model, ref):
        m.scale = np.array([2.0, 1.0, 0.25], dtype=np.float16)
    assert torch.equal(compiled(x), ref(x))
    assert getattr(gm, GUARD).reasons == [ARRAYS_CHANGED]
    for m in (model, ref):
        m.scale[2] = 5.0  # the new array, in place
    assert torch.equal(compiled(x), ref(x))


def test_a_constant_a_pass_left_another_use_of_is_read_as_the_array() -> None:
    """A use other than ``torch.tensor`` (none of today's passes makes one): the reader gives
    the array's own memory, as the constant did."""
    owner = nn.Module()
    owner.offsets = np.array([1, 2, 3], dtype=np.int64)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    c = graph.get_attr("_optimus_ndarray_0")
    graph.output(graph.call_function(torch.add, (x, c)))
    gm = torch.fx.GraphModule({"_optimus_ndarray_0": torch.as_tensor(owner.offsets)}, graph)
    held = (nc.HeldArray(owner, "offsets", "offsets"),)
    object.__setattr__(gm, nc.GROUPS, {"_optimus_ndarray_0": held})
    nc.read_at_each_call(gm)
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_module", "call_function", "output"]
    owner.offsets[0] = 10
    assert gm(torch.zeros(3, dtype=torch.int64)).tolist() == [10, 2, 3]
    watch = nc.ArrayWatch()
    watch.add(gm)
    assert watch.same()
    owner.offsets = np.array([1.0, 2.0, 3.0])  # float64: not the dtype the graph was made for
    assert not watch.same() and watch.changed() == "offsets"


def test_a_deep_copy_and_an_unpickled_copy_read_their_own_arrays() -> None:
    import copy
    import pickle

    torch._dynamo.reset()  # each optimized module is a type of its own: a fresh recompile budget
    model, _, x = _pair()
    gm = optimus.optimize(model, (x,))
    for twin in (copy.deepcopy(gm), pickle.loads(pickle.dumps(gm))):  # pickle: as torch.save(model)
        source = getattr(twin, GUARD).source
        assert source is not model and source.table.offsets is not model.table.offsets
        compiled = torch.compile(twin, fullgraph=True, dynamic=False)
        assert torch.equal(compiled(x), source(x))
        source.table.offsets[1] += 2  # the copy's array: the copy reads it, the original does not
        source.scale[0] = 7.0
        assert torch.equal(compiled(x), source(x)) and torch.equal(twin(x), source(x))
        assert not torch.equal(gm(x), source(x)) and torch.equal(gm(x), model(x))
