"""The GraphModule ``optimize()`` returns on the export path: it checks, per call, that the graph
it runs was captured for this call's inputs, for the model's current train/eval mode, and for
the model's current parameters, buffers, submodules and hooks (:mod:`optimus.capture.structure_watch`).

WHY: an exported graph is specialized (see :mod:`optimus.capture.call_signature`): a call with another
batch size, another Python scalar, or after ``model.eval()`` must not reuse it silently. On a
call that does not match, the module re-captures and re-optimizes the *original* module for
the new inputs and mode (as torch.compile recompiles), keeps that graph for the next such call,
and logs why (logger ``optimus``). At most :data:`MAX_SPECIALIZATIONS` graphs are made (the
first included); past that, calls that match none of them run the original module eagerly
(always correct, never silently wrong), with a warning once. After the model itself changed, every kept graph is
dropped and the next call re-captures. A re-capture that no longer exports runs the original
module eagerly (it never runs ``forward`` for real, so a side effect is not doubled).

``gm.train(mode)`` / ``gm.eval()`` also set the original module's mode: the mode that selects
the graph is the original module's (``gm`` shares its parameters and submodules' state).
The first graph is ``gm.graph``; the others are in ``gm.optimus_specializations``.
"""

from __future__ import annotations

import copy
import inspect
import logging
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from optimus.capture import numpy_constants, structure_watch
from optimus.capture.call_signature import InputSignature, forward_names, mode_sensitive_modules, modes
from optimus.params import contract as relayout_contract

log = logging.getLogger("optimus")

GUARD = "_optimus_guard"
MAX_SPECIALIZATIONS = 8  # graphs made per optimize() call, the first included (torch.compile: 8)
CHANGED = (
    "the model's parameters, buffers or submodules were replaced since capture (a new object "
    "assigned, load_state_dict(assign=True), a module added or deleted)"
)
ARRAYS_CHANGED = (
    "a NumPy array the graph reads was replaced by one of another dtype or shape, or its "
    "attributes no longer hold one array, since capture"
)

Recapture = Callable[[nn.Module, tuple[Any, ...]], Callable[..., Any]]


class CallGuard:
    """What one GraphModule was specialized to, and the other graphs made since."""

    def __init__(
        self,
        source: nn.Module,
        inputs: tuple[Any, ...],
        recapture: Recapture,
        graph: Any = None,
    ) -> None:
        self.source = source
        self.sensitive = mode_sensitive_modules(source)
        self.modes = modes(self.sensitive)
        self.names = forward_names(source)
        self.signature = InputSignature(inputs, self.names)
        self.recapture = recapture
        self.variants: dict[Any, Callable[..., Any]] = {}
        # (modes, signature, graph, writes) per variant, for the per-call check of a known variant
        self.known: list[tuple[tuple[bool, ...], InputSignature, Callable[..., Any], int]] = []
        self.reasons: list[str] = []
        self.warned = False
        self.forward_signature: inspect.Signature | None = None  # made at the first keyword call
        # parameters, buffers and submodules replaced since capture (optimus.capture.structure_watch):
        # ``at`` is the count the first graph was captured at (-1 once a change made it stale),
        # ``epoch`` the count the kept variants were captured at
        self.writes = structure_watch.watch(source)
        self.at = self.epoch = self.writes.count
        # the graphs' reads of NumPy arrays (optimus.capture.numpy_constants): an array of
        # another dtype or shape counts as a change of the model (every graph kept is dropped)
        self.arrays = numpy_constants.ArrayWatch()
        self.arrays.add(graph)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a guard pickled before ``known`` held four fields: slow path only
        state["known"] = [k for k in state.get("known", []) if len(k) == 4]
        state.setdefault("arrays", numpy_constants.ArrayWatch())
        self.__dict__.update(state)
        if "writes" not in state or not isinstance(
            getattr(self.source, "_parameters", None), structure_watch.WatchedDict
        ):  # unpickled: the model's dicts are plain again (structure_watch pickles them so)
            self.writes = structure_watch.watch(self.source)
            self.at = self.epoch = self.writes.count

    def matches(self, args: tuple[Any, ...]) -> bool:
        return (
            self.writes.same_since(self.at)
            and self.arrays.same()
            and self.modes == modes(self.sensitive)
            and self.signature.matches(args)
        )

    def variant_for(self, args: tuple[Any, ...]) -> Callable[..., Any] | None:
        """The graph already optimized for this call's inputs and modes, by the same cheap check
        as :meth:`matches` (None if there is none). Why: a model called with two batch sizes
        (the last, smaller batch of an epoch) would otherwise pay the slow path's signature
        build and dispatch at every such call; it doubled the headroom benchmark's step."""
        if not self.known or not self.writes.same_since(self.epoch) or not self.arrays.same():
            return None
        now = modes(self.sensitive)
        for key_modes, signature, graph, _ in self.known:
            if key_modes == now and signature.matches(args):
                return graph
        return None

    def why(self, key_modes: tuple[bool, ...], signature: InputSignature) -> str:
        if key_modes != self.modes:
            changed = [
                f"{type(m).__name__}.training={m.training}"
                for m, was in zip(self.sensitive, self.modes, strict=True)
                if m.training != was
            ]
            return f"train/eval mode changed ({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''})"
        return self.signature.difference(signature)

    def dispatch(self, own: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """The slow path: another graph for this call (made now if new), or the eager module."""
        arrays_changed = not self.arrays.same()
        if arrays_changed:  # the graphs hold the old values: counted as a change of the model
            log.info("optimus: NumPy array(s) %s changed since capture", self.arrays.changed())
            self.arrays.refresh()
            self.writes.count += 1
        changed = not self.writes.same_since(self.epoch)
        if changed:  # every graph kept reads objects the model no longer holds
            self.at = -1
            self.variants.clear()
            self.known.clear()
        now = modes(self.sensitive)
        signature = InputSignature(args, self.names)
        key = (now, signature.key)
        if self.at == self.writes.count and key == (self.modes, self.signature.key):
            return own(*args)
        graph = self.variants.get(key)
        if graph is None:
            reason = (ARRAYS_CHANGED if arrays_changed else CHANGED) if changed else self.why(now, signature)
            if len(self.reasons) + 1 >= MAX_SPECIALIZATIONS:
                if not self.warned:
                    self.warned = True
                    warnings.warn(
                        f"optimus: this module {reason}, and {MAX_SPECIALIZATIONS} graphs were already "
                        "optimized for it; running the original module eagerly for such calls. Call "
                        "optimus.optimize again with inputs of the shape you use.",
                        stacklevel=3,
                    )
                return self.source(*args)
            log.info("optimus: %s; re-optimizing the original module for this call", reason)
            structure_watch.watch(self.source, self.writes)  # submodules added since: watched too
            graph = self.recapture(self.source, args)
            self.arrays.add(graph)
            # the capture itself may write the dicts (it restores what forward assigned)
            self.epoch = self.writes.count
            self.variants[key] = graph
            self.known.append((now, signature, graph, self.epoch))
            self.reasons.append(reason)
        return graph(*args)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """Keyword arguments as positional ones (None if they cannot be)."""
        try:
            if self.forward_signature is None:
                self.forward_signature = inspect.signature(self.source.forward)
            bound = self.forward_signature.bind(*args, **kwargs)
        except (TypeError, ValueError):
            return None
        return None if bound.kwargs else tuple(bound.args)


def _recapture(guard: CallGuard, gm: fx.GraphModule, call: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Restore a re-laid-out group whose members were changed (``.to()``, ``assign=True``), then
    dispatch to a new or kept graph. Why the restore first: the forward pre-hook that does it per
    call runs only inside ``call``, after a re-capture has already read the members."""
    relayout_contract.sync(gm)
    return guard.dispatch(call, args)


# Under torch.compile, Dynamo traces __call__'s check (it becomes guards); a call that does not
# match re-optimizes outside the compiled graph (a graph break; an error under fullgraph=True,
# whose message is this reason).
_dispatch = torch.compiler.disable(
    _recapture,
    reason=(
        "optimus: this optimized module was called with inputs or a train/eval mode its graph was "
        "not captured for, or after the model's parameters or submodules were replaced, and "
        "re-optimizes outside torch.compile; call optimus.optimize again for them, or compile "
        "without fullgraph=True"
    ),
)


class SpecializedGraphModule(fx.GraphModule):
    """A GraphModule whose calls are checked against what its graph was specialized to."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        guard: CallGuard | None = self.__dict__.get(GUARD)
        if guard is None:
            return super().__call__(*args, **kwargs)
        if kwargs:
            bound = guard.bind(args, kwargs)
            if bound is None:
                return super().__call__(*args, **kwargs)
            args = bound
        if guard.matches(args):
            return super().__call__(*args)
        known = guard.variant_for(args)
        if known is not None:
            return known(*args)
        return _dispatch(guard, self, super().__call__, args)

    def train(self, mode: bool = True) -> SpecializedGraphModule:
        """Set this module's mode and the original module's (whose mode selects the graph)."""
        super().train(mode)
        guard: CallGuard | None = self.__dict__.get(GUARD)
        if guard is not None and not getattr(guard, "_in_train", False):
            guard._in_train = True  # type: ignore[attr-defined]
            try:
                guard.source.train(mode)
            finally:
                guard._in_train = False  # type: ignore[attr-defined]
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> fx.GraphModule:
        """A copy that keeps checking its calls (GraphModule's own copy drops unknown attributes);
        the guard's original module is copied along with the parameters it shares (one memo)."""
        res = super().__deepcopy__(memo)
        guard = self.__dict__.get(GUARD)
        if guard is not None:
            specialize_with(res, copy.deepcopy(guard, memo))
        return res

    def __copy__(self) -> fx.GraphModule:
        res = super().__copy__()
        guard = self.__dict__.get(GUARD)
        if guard is not None:
            return specialize_with(res, guard)
        return res

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickling (``torch.save(gm)``) keeps the guard: GraphModule's own reduce rebuilds a plain
        GraphModule from the code and drops attributes the graph does not use."""
        fn, args = super().__reduce__()
        return (_unpickle, (fn, args))

    @property
    def optimus_specializations(self) -> dict[Any, Callable[..., Any]]:
        """The graphs optimized after the first one, keyed by (modes, input signature)."""
        guard: CallGuard | None = self.__dict__.get(GUARD)
        return dict(guard.variants) if guard is not None else {}


def specialize(
    gm: fx.GraphModule, source: nn.Module, inputs: tuple[Any, ...], recapture: Recapture
) -> fx.GraphModule:
    """Turn ``gm`` (captured from ``source`` on ``inputs``) into a :class:`SpecializedGraphModule`
    in place (same object, attributes and parameters) and return it."""
    return specialize_with(gm, CallGuard(source, inputs, recapture, gm))


def _unpickle(fn: Callable[..., fx.GraphModule], args: tuple[Any, ...]) -> fx.GraphModule:
    gm = fn(*args)
    guard = args[0].get(GUARD) if args and isinstance(args[0], dict) else None
    return specialize_with(gm, guard) if isinstance(guard, CallGuard) else gm


def _own_call() -> Callable[..., Any]:
    """``SpecializedGraphModule.__call__`` with a code object of its own. Why: Dynamo keeps its
    compiled entries, and counts them against ``recompile_limit`` (8), per code object, and each
    optimized module is a class of its own (a type guard per entry): with one shared ``__call__``
    the ninth optimized module compiled in a process ran uncompiled, or failed under
    ``fullgraph=True``."""
    f = SpecializedGraphModule.__call__
    return types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)


def specialize_with(gm: fx.GraphModule, guard: CallGuard) -> fx.GraphModule:
    gm.__class__ = type("GraphModuleImpl", (SpecializedGraphModule,), {"__call__": _own_call()})
    object.__setattr__(gm, GUARD, guard)
    gm.recompile()
    return gm
