"""The installed stack works: torch, torchrec and fbgemm_gpu (CPU build) train a sparse arch."""

from __future__ import annotations

import torch
import torchrec
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from harness import env_check


def test_environment_matches_recipe() -> None:
    problems = env_check.find_problems("cpu")
    assert problems == [], [p.message for p in problems]


def test_fbgemm_is_the_cpu_distribution() -> None:
    import fbgemm_gpu

    assert fbgemm_gpu.__file__ is not None
    dists = env_check.installed_distributions()
    assert "fbgemm-gpu-cpu" in dists
    assert "fbgemm-gpu" not in dists


def test_env_check_flags_cuda_fbgemm_and_nvidia() -> None:
    fake = {
        "torch": "2.13.0+cpu",
        "fbgemm-gpu-cpu": "1.8.0",
        "torchrec": "1.8.0",
        "fbgemm-gpu": "1.8.0",
        "nvidia-cublas-cu12": "12.8",
    }
    messages = " ".join(p.message for p in env_check.find_problems("cpu", fake))
    assert "CUDA fbgemm-gpu" in messages
    assert "nvidia-cublas-cu12" in messages
    wrong_torch = {"torch": "2.14.1", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"}
    assert any("2.14.1" in p.message for p in env_check.find_problems("cpu", wrong_torch))


def test_env_check_knows_the_triton_pin() -> None:
    ok = {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0", "triton": "3.6.0"}
    assert env_check.find_problems("cpu", ok) == []
    for triton in (None, "3.7.0"):
        pkgs = {k: v for k, v in ok.items() if k != "triton"}
        if triton is not None:
            pkgs["triton"] = triton
        messages = [p.message for p in env_check.find_problems("cpu", pkgs)]
        assert messages == [f"triton {triton} installed, recipe pins {env_check.TRITON_VERSION}"]
    gpu = {"torch": "2.13.0", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"}
    assert [p.message for p in env_check.find_problems("gpu", gpu)] == [
        "triton is not installed (the CUDA torch should bring it)"
    ]
    assert env_check.find_problems("gpu", {**gpu, "triton": "3.7.1"}) == []


def test_two_table_ebc_forward_backward() -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=50, feature_names=["f0"]),
            EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=30, feature_names=["f1"]),
        ],
        device=torch.device("cpu"),
    )
    # batch of 3: f0 lengths [2, 0, 1], f1 lengths [1, 3, 1]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"],
        values=torch.tensor([1, 7, 3, 0, 5, 9, 2, 8]),
        lengths=torch.tensor([2, 0, 1, 1, 3, 1]),
    )
    pooled = ebc(kjt)
    assert isinstance(pooled, torchrec.KeyedTensor)
    assert pooled.values().shape == (3, 12)
    as_dict = pooled.to_dict()
    assert as_dict["f0"].shape == (3, 8) and as_dict["f1"].shape == (3, 4)
    # Sum pooling: sample 1 of f0 has no ids, so its pooled row is zero.
    assert torch.all(as_dict["f0"][1] == 0)
    pooled.values().pow(2).sum().backward()
    grads = {name: p.grad for name, p in ebc.named_parameters()}
    assert len(grads) == 2
    for name, g in grads.items():
        assert g is not None, name
        assert g.abs().sum() > 0, name
    # Only rows that were looked up get gradient.
    w0 = dict(ebc.named_parameters())["embedding_bags.t0.weight"].grad
    assert w0 is not None
    touched = w0.abs().sum(dim=1).nonzero().flatten().tolist()
    assert touched == [1, 3, 7]
