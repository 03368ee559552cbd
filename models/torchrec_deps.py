"""The one place `models` imports torchrec: only when the sparse arch or KJT batches are built.

Why lazy: the dense archs are plain torch, and the GPU machine this project borrows has torch and
Triton but neither torchrec nor fbgemm. `import models`, the presets, the catalog and every
family's `build_dense` must work there; only `models.build` (EBC + KeyedJaggedTensor batches)
needs torchrec, and it then fails with one line that says what to do instead.
"""

from __future__ import annotations

from types import ModuleType

MISSING = (
    "models: building the sparse arch (EmbeddingBagCollection, KeyedJaggedTensor batches) needs "
    "torchrec, which does not import here ({why}); install requirements/nodeps.txt, or run the dense "
    "archs alone with the provider models.dense_only:build"
)


def torchrec() -> ModuleType:
    """The torchrec module, or ImportError with the one-line reason above."""
    try:
        import torchrec as module
    except ImportError as e:  # torchrec itself missing, or its fbgemm_gpu dependency
        raise ImportError(MISSING.format(why=f"{type(e).__name__}: {e}")) from None
    return module
