"""The distinct failing constructs the fuzzers found (minimal programs), by issue-13 item.

Each entry is ``name -> (issue-13 item, Spec)``: the smallest program of that construct that the
fuzz runner's shrinker (or a hand reduction of it) kept failing on the engine at dbcb301.
``test_user_program_properties.test_known_failure`` runs them as regression tests (they failed
before their fixes and pass after); ``python tests/optimus/fuzz_known_failures.py`` prints, for each one,
which checks fail on which path and which rule is responsible, plus its source.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_programs import Member, Spec


def _many(n: int, **kw: object) -> tuple[Member, ...]:
    return tuple(Member(**kw) for _ in range(n))  # type: ignore[arg-type]


KNOWN: dict[str, tuple[str, Spec]] = {
    # 1. regions: grad mode and autocast
    "towers_no_grad_and_grad": (
        "regions",
        Spec(
            _many(3, kind="tower", region="no_grad", variant="tanh") + _many(3, kind="tower", variant="tanh")
        ),
    ),
    "gated_autocast_and_fp32": (
        "regions",
        Spec(
            (
                Member("gated", variant="sigmoid"),
                Member("gated", region="autocast", variant="sigmoid"),
            )
        ),
    ),
    "split_pieces_no_grad_and_grad": (
        "regions",
        Spec((Member("split_pw", variant="gelu"), Member("split_pw", region="no_grad", variant="gelu"))),
    ),
    "raise_inside_no_grad_leaks_grad_mode": (
        "regions",
        Spec(_many(3, kind="linear", region="no_grad", consumer="view", variant="nobias")),
    ),
    # found 2026-12-05 (fuzz seed 46): experts read only by poolings under no_grad keep .grad None;
    # the batched pooling (a node a rule made, no recorded requires_grad) made them look reached
    "experts_pooled_only_under_no_grad": (
        "regions",
        Spec(
            (
                Member("tower", "x", variant="neg"),
                Member("gate_pool", "x", region="no_grad", variant="mul_sum", shared="stack"),
                Member("gate_pool", "x", region="no_grad", variant="mul_sum", keep=True, shared="stack"),
            ),
            batch=48,
            width=4,
            hidden=8,
            train=False,
        ),
    ),
    # found 2026-12-05 (fuzz seed 362): LayerNorms of bfloat16 linears under autocast keep bfloat16;
    # the batched affine step promoted to the float32 weights (the batched linear's meta said float32)
    "autocast_towers_layer_norm_dtype": (
        "regions",
        Spec(
            (
                Member("tower", "z", region="autocast", consumer="relu_", variant="neg", keep=True),
                Member("tower", "x", region="autocast", variant="neg"),
                Member("tower", "x", region="autocast", consumer="t_view", variant="neg"),
            ),
            batch=4,
            width=6,
            hidden=8,
        ),
    ),
    # 3. effects: BatchNorm, random ops (CSE / DCE)
    "bn_train_twice": ("effects", Spec((Member("bn_twice", "z"),))),
    "bn_train_unused": ("effects", Spec((Member("bn_unused", "z"),))),
    **{
        f"random_twice_{op}": ("effects", Spec((Member("random_dup", "z", variant=op),)))
        for op in ("rrelu", "feature_dropout", "native_dropout")  # CSE merges these, not dropout
    },
    "random_unused_native_dropout": (
        "effects",
        Spec((Member("random_unused", "z", variant="native_dropout"),)),
    ),
    "identical_outputs_merged": ("aliasing", Spec(_many(2, kind="alias_inplace", src="z", variant="view"))),
    # 2. aliasing: fresh cat/stack turned into views, and the reverse
    **{
        f"split_cat_of_{v}": ("aliasing", Spec((Member("split_cat", "z", variant=v),)))
        for v in ("view", "contiguous", "slice", "w_t")
    },
    "stack_unbind_of_view": ("aliasing", Spec((Member("stack_unbind", "z", variant="view"),))),
    "dropout_p0_alias_written": (
        "aliasing",
        Spec(_many(2, kind="alias_inplace", src="z", variant="dropout_p0")),
    ),
    "dropout_eval_alias_written": (
        "aliasing",
        Spec(_many(2, kind="alias_inplace", src="z", variant="dropout_eval")),
    ),
    # 9. layout of fused results
    "qkv_view": ("layout", Spec(_many(3, kind="linear", consumer="view", variant="nobias"))),
    "qkv_as_strided": ("layout", Spec(_many(3, kind="linear", consumer="as_strided", variant="nobias"))),
    "qkv_transpose_view": ("layout", Spec(_many(3, kind="linear", consumer="t_view", variant="nobias"))),
    # 7. capture / api: optimize() runs forward on the example inputs
    "optimize_updates_bn_stats": ("capture/api", Spec((Member("bn_unused", "z"), Member("linear")))),
    "optimize_advances_rng": ("capture/api", Spec((Member("random_dup", "z", variant="rand_like"),))),
    "optimize_writes_inputs": (
        "capture/api",
        Spec((Member("view_out", "z", variant="slice", consumer="add_"),)),
    ),
    # 8. relayout (RelayoutParams makes these rewrites pay on tiny groups)
    "relayout_linears_autocast_and_fp32": (
        "relayout",
        Spec(
            tuple(
                Member("linear", "xzh"[i % 3], region="autocast" if i < 3 else "", variant="bias")
                for i in range(6)
            )
        ),
    ),
    "relayout_shared_input_linears_view": (
        "relayout",
        Spec(tuple(Member("linear", "xzh"[i % 3], consumer="view", variant="bias") for i in range(6))),
    ),
}


def main() -> None:
    import torch
    from fuzz_checks import FAST_PATHS, blame, reference, run_path
    from fuzz_programs import forward_source

    warnings.filterwarnings("ignore")
    for name, (item, spec) in KNOWN.items():
        ref = reference(spec, torch.float32)
        assert ref.error is None, (name, ref.error)
        found: dict[str, list[str]] = {}
        for path in FAST_PATHS:
            for m in run_path(spec, path, ref=ref).mismatches:
                if path not in found.setdefault(m.check, []):
                    found[m.check].append(path)
        own = [c for c in found if not c.startswith("optimize_")]  # optimize_*: capture (issue item 7)
        first = own[0] if own else next(iter(found), None)
        who = blame(spec, found[first][0], first) if first else "-"
        checks = "; ".join(f"{c} ({','.join(p)})" for c, p in found.items()) or "PASSES"
        print(f"\n## {name} [{item}] -> {checks} | blame ({first}): {who}")
        print(forward_source(spec))


if __name__ == "__main__":
    main()
