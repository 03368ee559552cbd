"""Synthetic industrial-scale recommendation models: torchrec sparse arch, plain-torch dense arch.

    import models
    b = models.build("towers", scale="tiny", device="cpu", seed=0)
    logits = b.module(*b.batches[0].inputs)          # [B, num_tasks]
    loss = b.loss(logits, b.batches[0].labels)

`b.module.sparse` is a torchrec EmbeddingBagCollection (runs eagerly); `b.module.dense` is plain
torch, compiles with `torch.compile(fullgraph=True)` and is what Optimus rewrites;
`b.dense_inputs(batch)` gives its inputs. `b.meta` keys: family, scale, seed, batch_size,
num_tasks, num_features, num_dense_features, num_tables, embedding_dim, params, dense_params,
embedding_bytes, dense_nodes, flops_per_sample, est_train_bytes, config. See docs/models.md.

`import models` needs only torch: torchrec (and fbgemm) are imported when `models.build` builds
the EBC and the KJT batches (models/torchrec_deps.py). `models.dense_only.build` has the same
contract and builds the dense arch alone, fed seeded pooled embeddings: the GPU machine's path.
"""

from types import ModuleType

from models.builder import build
from models.presets import SCALES
from models.registry import FAMILIES
from models.types import Batch, Built, RecModel

__all__ = ["FAMILIES", "SCALES", "Batch", "Built", "RecModel", "build", "catalog"]


def __getattr__(name: str) -> ModuleType:
    """`models.catalog` on first use (importing it eagerly breaks `python -m models.catalog`)."""
    if name == "catalog":
        import importlib

        return importlib.import_module("models.catalog")
    raise AttributeError(f"module 'models' has no attribute {name!r}")
