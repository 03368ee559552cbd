"""`import models` and every family's dense arch without torchrec or fbgemm (the GPU machine).

Each test runs a fresh interpreter with tests/blocked_imports first on PYTHONPATH, where
`torchrec` and `fbgemm_gpu` are packages whose import raises ImportError, so the installed ones
cannot be reached, by this process or any it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ROOT / "tests" / "blocked_imports"


def run_blocked(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BLOCKED), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_blocker_blocks() -> None:
    r = run_blocked("import torchrec")
    assert r.returncode != 0 and "blocked for this test" in r.stderr


def test_import_models_and_every_dense_arch_without_torchrec() -> None:
    r = run_blocked(
        """
        import sys, torch, models
        from models import dense_only, presets, sparse
        from models.registry import family
        assert "torchrec" not in sys.modules or sys.modules["torchrec"] is None
        for name in models.FAMILIES:
            cfg = presets.resolve(name, "tiny")
            lay = sparse.layout(cfg)
            dense = family(name).build_dense(cfg, lay)
            out = dense(torch.randn(cfg["batch_size"], cfg["num_dense_features"]),
                        torch.randn(cfg["batch_size"], lay.pooled_dim))
            assert out.shape == (cfg["batch_size"], cfg["num_tasks"]), (name, out.shape)
            b = dense_only.build(name, "tiny", seed=0)
            logits = b.module(*b.batches[0].inputs)
            b.loss(logits, b.batches[0].labels).backward()
            assert logits.shape == out.shape and b.meta["dense_nodes"] > 0
            print("ok", name)
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [w for f in ("dlrm", "dcn", "towers", "mmoe") for w in ("ok", f)]


def test_sparse_build_without_torchrec_is_one_clear_line() -> None:
    r = run_blocked(
        """
        import models
        try:
            models.build("towers", "tiny")
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("models.build worked without torchrec")
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "needs torchrec" in lines[0] and "models.dense_only:build" in lines[0]


def test_dense_only_matches_the_full_build_in_shapes() -> None:
    """Same config, same dense parameter shapes as `models.build` (the values differ by design)."""
    import models
    from models import dense_only

    for name in models.FAMILIES:
        full = models.build(name, "tiny", seed=0, count_nodes=False)
        alone = dense_only.build(name, "tiny", seed=0, count_nodes=False)
        assert full.meta["config"] == alone.meta["config"]
        shapes = [(n, p.shape) for n, p in full.module.dense.named_parameters()]
        assert shapes == [(n, p.shape) for n, p in alone.module.dense.named_parameters()]
        assert [t.shape for t in full.dense_inputs(full.batches[0])] == [
            t.shape for t in alone.dense_inputs(alone.batches[0])
        ]
