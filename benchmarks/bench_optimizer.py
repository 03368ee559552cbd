"""The optimizer's own cost: pass time and memory of ``optimus.optimize`` on large graphs.

Timed by asv itself (``time_``/``peakmem_``): this is the Optimus pass alone, eager, no
Inductor, so the figure is the optimizer's cost and not the compiler's.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import families, widths
from benchmarks.synthetic import build_towers


def _optimus() -> Any:
    try:
        import optimus
    except ImportError as err:  # a commit before the optimizer existed
        raise NotImplementedError(f"optimus not importable: {err}") from err
    if not hasattr(optimus, "optimize"):
        raise NotImplementedError("this commit's optimus has no optimize()")
    return optimus


class OptimizeSynthetic:
    """``optimus.optimize`` on a per-feature-tower graph of N parallel branches."""

    params = (widths(),)
    param_names = ("branches",)
    number = 1
    repeat = (1, 5, 60.0)
    timeout = 600.0

    def setup(self, branches: int) -> None:
        self.optimus = _optimus()
        self.module, self.inputs = build_towers(branches)

    def time_optimize(self, branches: int) -> None:
        self.optimus.optimize(self.module, self.inputs)

    def peakmem_optimize(self, branches: int) -> None:
        self.optimus.optimize(self.module, self.inputs)

    def track_nodes_after(self, branches: int) -> int:
        """FX nodes left after optimizing (fusion should collapse the N branches)."""
        return int(self.optimus.optimize(self.module, self.inputs).optimus_report.nodes_after)

    track_nodes_after.unit = "nodes"  # type: ignore[attr-defined]


class OptimizeModelDense:
    """``optimus.optimize`` on each family's dense arch at the largest default-grid scale."""

    params = (families(), ["small"])
    param_names = ("family", "scale")
    number = 1
    repeat = (1, 5, 60.0)
    timeout = 600.0

    def setup(self, family: str, scale: str) -> None:
        self.optimus = _optimus()
        try:
            import models
        except ImportError as err:
            raise NotImplementedError(f"models not importable: {err}") from err
        if not hasattr(models, "build"):
            raise NotImplementedError("this commit's models has no build()")
        built = models.build(family, scale=scale, device="cpu", seed=0)
        self.module = built.module.dense
        self.inputs = built.dense_inputs(built.batches[0])

    def time_optimize(self, family: str, scale: str) -> None:
        self.optimus.optimize(self.module, self.inputs)
