"""Notice, in O(1) per call, that the module ``optimize()`` captured was changed after the
capture: a submodule, parameter or buffer added, deleted or replaced by another object.

WHY: an exported graph reads the parameter and buffer objects it saw at capture (its
``get_attr`` targets are those objects). After ``model.head = nn.Linear(...)``,
``model.w = nn.Parameter(...)``, ``model.load_state_dict(sd, assign=True)`` or
``register_buffer(...)``, eager uses the new objects, and so does ``torch.compile`` (it guards on
them); the captured graph would go on reading the old ones, silently. Comparing every
parameter's identity on every call costs O(parameters): milliseconds at scale large. Instead,
once, each module's ``_parameters``, ``_buffers`` and ``_modules`` dict is swapped for a
:class:`WatchedDict` with the same entries (its hook dicts for a :class:`WatchedOrderedDict`),
which counts every write into the :class:`Writes` counters watching it; a call compares one
count with the count its graph was captured at (:class:`optimus.capture.specialized.CallGuard`).

The modules' hook dicts (``register_forward_hook``, ``register_forward_pre_hook``,
``register_full_backward_hook``, ...; :data:`HOOK_NAMES`) are watched too: a hook added or
removed after the capture is a change (``torch.compile`` does not see those by default,
``skip_nnmodule_hook_guards``; ``torch.nn.utils.prune`` works through one). An empty hook dict
is swapped like the others; one that holds hooks at capture is not (each hook's
``RemovableHandle`` holds a weak reference to that dict object, so a copy would turn
``handle.remove()`` into a no-op): it is *pinned*, and each call compares its keys with the
pinned ones, which costs per call only as much as the hooks the model had. Not seen: the
process-wide hooks of ``torch.nn.modules.module.register_module_forward_hook`` and friends,
and a write that bypasses the dicts (``module.__dict__`` edited by hand). In-place changes need
nothing (``load_state_dict`` without ``assign``, an optimizer step, ``.to()``, which swaps
``.data``): the graph reads the same objects.

Pickling a watched model saves plain dicts (a model saved after ``optimize()`` loads without
optimus); ``copy.deepcopy`` keeps the watch, with counters of its own.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

from torch import nn

DICT_NAMES = ("_parameters", "_buffers", "_modules")
# a module's forward and backward hooks (OrderedDicts: the order is the call order)
HOOK_NAMES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


class Writes:
    """How many times a watched dict was written (one counter per watching ``CallGuard``), and the
    hook dicts that could not be swapped (they held hooks, whose handles point at them), with
    the hooks each held when last pinned."""

    __slots__ = ("count", "pinned")

    def __init__(self) -> None:
        self.count = 0
        self.pinned: list[tuple[dict[Any, Any], tuple[Any, ...]]] = []

    def same_hooks(self) -> bool:
        """The pinned hook dicts hold the hooks they held when pinned (in order)."""
        return all(tuple(d) == keys for d, keys in self.pinned)

    def same_since(self, count: int) -> bool:
        """Nothing written since the count was ``count``, and the pinned hooks as pinned."""
        return self.count == count and (not self.pinned or self.same_hooks())


_MISSING = object()


class _Counting:
    """Counts every write of the dict it is mixed into (order changes too: hooks run in order)."""

    __slots__ = ()
    watchers: list[Writes]

    def _wrote(self) -> None:
        for w in self.watchers:
            w.count += 1

    def __setitem__(self, key: Any, value: Any) -> None:
        # the same object put back is no change (``Module._apply`` re-assigns every buffer,
        # ``.to()`` of the dtype a buffer already has returns the buffer itself)
        if super().get(key, _MISSING) is not value:  # type: ignore[misc]
            self._wrote()
        super().__setitem__(key, value)  # type: ignore[misc]

    def __delitem__(self, key: Any) -> None:
        self._wrote()
        super().__delitem__(key)  # type: ignore[misc]

    def __ior__(self, other: Any) -> Any:
        self._wrote()
        return super().__ior__(other)  # type: ignore[misc]

    def pop(self, *args: Any) -> Any:
        self._wrote()
        return super().pop(*args)  # type: ignore[misc]

    def popitem(self, *args: Any) -> Any:
        self._wrote()
        return super().popitem(*args)  # type: ignore[misc]

    def clear(self) -> None:
        self._wrote()
        super().clear()  # type: ignore[misc]

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._wrote()
        super().update(*args, **kwargs)  # type: ignore[misc]

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:  # type: ignore[operator]
            self._wrote()
        return super().setdefault(key, default)  # type: ignore[misc]

    def move_to_end(self, key: Any, last: bool = True) -> None:  # OrderedDict (prepend=True hooks)
        self._wrote()
        super().move_to_end(key, last)  # type: ignore[misc]

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        new: Any = type(self)()
        memo[id(self)] = new
        new.watchers = copy.deepcopy(self.watchers, memo)
        items: Any = self.items()  # type: ignore[attr-defined]
        base: Any = OrderedDict if isinstance(self, OrderedDict) else dict
        base.update(new, [(k, copy.deepcopy(v, memo)) for k, v in items])  # no counted writes
        return new

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """Pickled as the plain dict it replaced: a saved model never needs optimus to load."""
        base = OrderedDict if isinstance(self, OrderedDict) else dict
        return (base, (list(self.items()),))  # type: ignore[attr-defined]


class WatchedDict(_Counting, dict):  # type: ignore[type-arg]
    """A module's ``_parameters``/``_buffers``/``_modules`` dict that counts its writes."""

    __slots__ = ("watchers",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.watchers = []  # first: OrderedDict's __init__ writes through update()
        dict.__init__(self, *args, **kwargs)


class WatchedOrderedDict(_Counting, OrderedDict):  # type: ignore[type-arg]
    """A module's hook dict (``_forward_hooks``, ...) that counts its writes."""

    __slots__ = ("watchers",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.watchers = []  # first: OrderedDict's __init__ writes through update()
        OrderedDict.__init__(self, *args, **kwargs)


def watch(root: nn.Module, writes: Writes | None = None) -> Writes:
    """Count writes to the dicts of ``root`` and of every module under it into ``writes`` (a new
    counter if None) and return it. Modules already watched by ``writes`` are left as they are,
    so calling it again after a change watches only the modules added since."""
    writes = Writes() if writes is None else writes
    writes.pinned = []
    for module in root.modules():
        state = module.__dict__
        for name in (*DICT_NAMES, *HOOK_NAMES):
            d = state.get(name)
            if not isinstance(d, dict):
                continue
            if not isinstance(d, _Counting):
                if name in HOOK_NAMES and d:
                    # a hook's RemovableHandle holds a weak reference to this very dict: a copy
                    # would make handle.remove() a silent no-op. Compared per call instead.
                    writes.pinned.append((d, tuple(d)))
                    continue
                d = WatchedOrderedDict(d) if isinstance(d, OrderedDict) else WatchedDict(d)
                state[name] = d
            if not any(w is writes for w in d.watchers):
                d.watchers.append(writes)
    return writes


__all__ = ["DICT_NAMES", "HOOK_NAMES", "WatchedDict", "WatchedOrderedDict", "Writes", "watch"]
