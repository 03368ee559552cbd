"""Process memory of an eager training step of each model, as asv measures it (max RSS).

asv's ``peakmem_`` is the peak resident size of the benchmark process, so it covers the
embedding tables, the dense arch and autograd buffers together: a coarse but stable
guard against a model or runtime change that blows up host memory.
"""

from __future__ import annotations

from benchmarks.common import families, scales


class EagerTrainStep:
    params = (families(), scales())
    param_names = ("family", "scale")
    timeout = 600.0

    def setup(self, family: str, scale: str) -> None:
        try:
            import models
        except ImportError as err:
            raise NotImplementedError(f"models not importable: {err}") from err
        if not hasattr(models, "build"):
            raise NotImplementedError("this commit's models has no build()")
        import torch

        torch.manual_seed(0)
        self.built = models.build(family, scale=scale, device="cpu", seed=0)
        self.opt = torch.optim.SGD(self.built.module.parameters(), lr=0.01)

    def peakmem_train_step(self, family: str, scale: str) -> None:
        batch = self.built.batches[0]
        loss = self.built.loss(self.built.module(*batch.inputs), batch.labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
