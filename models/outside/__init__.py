"""Models this repository did not write: the outside corpus of.

WHY: the rules' claim is generality. Measured only on our own families it cannot fail, so this
package builds recommendation models from elsewhere, as their own docs show: DeepCTR-Torch's zoo
(``deepctr_zoo``), torch-rechub's (``rechub_zoo``) and RecBole's context-aware models
(``recbole_zoo``), optional dev installs (``requirements/dev-nodeps.txt``), and torchrec's own
models (``torchrec_zoo``). The same
architecture written by two or three zoos is what keeps a rule from fitting one zoo's style. Each entry builds ``(module, example_inputs)`` on seeded synthetic data:
no network, no downloaded weights.

    from models import outside
    module, inputs = outside.build("deepctr.MMOE", seed=0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

Builder = Callable[[int], tuple[nn.Module, tuple[Any, ...]]]


class OutsideModelError(ValueError):
    """An unknown corpus name, or a zoo that is not installed (one line)."""


# One architecture, each zoo's implementation of it (corpus names). Where three zoos write one
# architecture, a rule that fits only one zoo's way of writing it shows in the per-zoo figures.
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "DeepFM": ("deepctr.DeepFM", "rechub.DeepFM", "recbole.DeepFM", "torchrec.SimpleDeepFMNN"),
    "Wide&Deep": ("deepctr.WDL", "rechub.WideDeep", "recbole.WideDeep"),
    "DCN": ("deepctr.DCN", "rechub.DCN", "recbole.DCN"),
    # DCN-V2's cross network; torchrec's DLRM_DCN puts its low-rank form over DLRM's interaction
    "DCN-V2": ("deepctr.DCNMix", "rechub.DCNv2", "recbole.DCNV2", "torchrec.DLRM_DCN"),
    "AutoInt": ("deepctr.AutoInt", "rechub.AutoInt", "recbole.AutoInt"),
    "xDeepFM": ("deepctr.xDeepFM", "recbole.xDeepFM"),
    "NFM": ("deepctr.NFM", "recbole.NFM"),
    "PNN": ("deepctr.PNN", "recbole.PNN"),
    "FiBiNET": ("deepctr.FiBiNET", "rechub.FiBiNet"),
    "MMoE": ("deepctr.MMOE", "rechub.MMOE"),
    "PLE": ("deepctr.PLE", "rechub.PLE"),
    "ESMM": ("deepctr.ESMM", "rechub.ESMM"),
    "SharedBottom": ("deepctr.SharedBottom", "rechub.SharedBottom"),
}


def _zoos() -> tuple[Any, ...]:
    from . import deepctr_zoo, recbole_zoo, rechub_zoo, torchrec_zoo

    return (deepctr_zoo, rechub_zoo, recbole_zoo, torchrec_zoo)


def zoos() -> list[str]:
    """Every zoo's prefix (the part of a corpus name before the dot), installed or not."""
    return [zoo.PREFIX for zoo in _zoos()]


def zoo_of(name: str) -> str:
    """The zoo a corpus name belongs to: ``"rechub.MMOE"`` -> ``"rechub"``."""
    return name.split(".", 1)[0]


def catalog() -> dict[str, Builder]:
    """Every corpus model whose zoo is installed, by ``zoo.Name``."""
    found: dict[str, Builder] = {}
    for zoo in _zoos():
        if zoo.available():
            found.update({f"{zoo.PREFIX}.{name}": builder for name, builder in zoo.MODELS.items()})
    return found


def names() -> list[str]:
    return sorted(catalog())


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    """``(module in train mode, example inputs)`` of one corpus model."""
    models = catalog()
    if name not in models:
        raise OutsideModelError(
            f"unknown outside model {name!r}; installed: {', '.join(sorted(models)) or 'none'}"
        )
    return models[name](seed)
