"""Flat calling convention for exported GraphModules whose inputs and outputs are flat tuples.

WHY: ``torch._dynamo.export`` wraps every call in ``fx_pytree.tree_flatten_spec`` (inputs) and
``pytree.tree_unflatten`` (outputs). For a model with 32 outputs that is ~40 us of pure Python per
call (measured with optimus-bench headroom: a third of a fused 32-tower forward), more than
the batched kernel it wraps. When the input spec is ``((leaf, ..., leaf), {})`` and the output
spec a tuple/list of leaves (or one leaf), flattening is the identity and unflattening is
``tuple(...)``: the generated code binds the arguments directly and returns a tuple literal.
Anything nested (dicts, KeyedJaggedTensor inputs, nested outputs) keeps the pytree code.
"""

from __future__ import annotations

from typing import Any

from torch import fx
from torch.fx.graph import _PyTreeCodeGen
from torch.utils import _pytree as pytree


def _flat_inputs(spec: pytree.TreeSpec | None, n_args: int) -> bool:
    if spec is None or spec.type is not tuple or spec.num_children != 2:
        return False
    args, kwargs = spec.child(0), spec.child(1)
    return (
        args.type is tuple
        and args.num_children == n_args
        and all(args.child(i).is_leaf() for i in range(n_args))
        and kwargs.type is dict
        and kwargs.num_children == 0
    )


def _flat_outputs(spec: pytree.TreeSpec | None) -> str | None:
    """ "tuple"/"list"/"leaf" when unflattening is trivial, else None."""
    if spec is None:
        return None
    if spec.is_leaf():
        return "leaf"
    if spec.type in (tuple, list) and all(spec.child(i).is_leaf() for i in range(spec.num_children)):
        return spec.type.__name__
    return None


class FlatPyTreeCodeGen(_PyTreeCodeGen):
    """``_PyTreeCodeGen`` with direct bindings/returns where the specs are flat (see module doc)."""

    def gen_var_bindings(self, fn_args: list[str], free_vars: list[str], expanded_def: bool) -> str:
        info = self.pytree_info
        names = [v.split(":")[0].split("#")[0].strip() for v in free_vars]
        if (
            _flat_inputs(info.in_spec, len(info.orig_args))
            and len(names) == len(info.orig_args)
            and not any(":" in v for v in free_vars)
        ):
            return "".join(f"\n    {n} = {a}" for n, a in zip(names, info.orig_args, strict=True))
        return super().gen_var_bindings(fn_args, free_vars, expanded_def)

    def generate_output(self, output_args: Any, *, descs: Any = None, repr_fn: Any = None) -> str:
        spec = self.pytree_info.out_spec if self.pytree_info else None
        kind = _flat_outputs(spec)
        fmt = repr_fn or repr
        if kind == "leaf" and isinstance(output_args, (list, tuple)) and len(output_args) == 1:
            return f"return {fmt(output_args[0])}"
        n = spec.num_children if spec is not None and kind in ("tuple", "list") else -1
        if kind in ("tuple", "list") and isinstance(output_args, (list, tuple)) and len(output_args) == n:
            body = ", ".join(fmt(a) for a in output_args)
            if kind == "list":
                return f"return [{body}]"
            return f"return ({body},)" if n == 1 else f"return ({body})"
        return super().generate_output(output_args, descs=descs, repr_fn=repr_fn)


def use_flat_codegen(gm: fx.GraphModule) -> bool:
    """Switch an exported GraphModule to :class:`FlatPyTreeCodeGen` (same calling convention);
    returns whether it did (only plain ``_PyTreeCodeGen``, the one Dynamo export uses)."""
    codegen = gm.graph._codegen
    if type(codegen) is not _PyTreeCodeGen or codegen.pytree_info is None:
        return False
    gm.graph._codegen = FlatPyTreeCodeGen(codegen.pytree_info)
    gm.recompile()
    return True
