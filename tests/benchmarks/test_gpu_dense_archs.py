"""scripts/gpu_dense_archs.py on its CPU dry path at a tiny size, the way the GPU machine runs it:
without torchrec (hidden in a subprocess, so the stub never leaks into this process), the torchrec
stub in place, every cell ok and equal to eager. Also: the dense arch it builds has the parameter
shapes of ``models.build(...).module.dense``, and the stub's placeholders refuse to be used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import gpu_dense_archs

ROOT = Path(__file__).resolve().parents[2]

# torchrec made unimportable (sys.modules[name] = None: find_spec -> None, import -> ImportError),
# as on the GPU machine; then the script's main with --force-stub
HIDDEN_TORCHREC = """
import sys
sys.modules["torchrec"] = None
sys.modules["fbgemm_gpu"] = None
sys.path.insert(0, "scripts")
import gpu_dense_archs
gpu_dense_archs.main(sys.argv[1:])
assert sys.modules["torchrec"].__gpu_dense_archs_stub__ is True
"""


@pytest.mark.compile
def test_dry_run_cpu_without_torchrec(tmp_path: Path) -> None:
    out = tmp_path / "gpu_dense_archs.json"
    args = [
        "--device=cpu",
        "--families=towers",
        "--scales=tiny",
        "--modes=eager,eager+optimus",
        "--phases=infer,train",
        "--rounds=2",
        "--iters=2",
        "--warmup=1",
        "--threads=1",
        "--force-stub",
        f"--out={out}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", HIDDEN_TORCHREC, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert payload["finished"] is True
    assert payload["torchrec_stub"]["used"] is True
    assert payload["torchrec_stub"]["torchrec_missing"] is True
    assert payload["archs"]["towers/tiny"]["input_shapes"] == [[16, 4], [16, 32]]
    cells = {(c["phase"], c["mode"]): c for c in payload["cells"]}
    assert set(cells) == {(p, m) for p in ("infer", "train") for m in ("eager", "eager+optimus")}
    for key, c in cells.items():
        assert c["status"] == "ok", (key, c.get("error"))
        assert (c["family"], c["scale"]) == ("towers", "tiny"), key
        assert c["parity_ok"] is True, key
        assert c["n"] == 2 and c["median_us"] > 0, key
        if key[0] == "train":
            assert c["grad_ok"] is True, key
    report = cells["infer", "eager+optimus"]
    assert report["nodes_before"] > report["nodes_after"] > 0
    assert isinstance(report["rules_fired"], dict) and report["rules_fired"]


def test_dense_arch_matches_models_build() -> None:
    """Same parameter and buffer names and shapes as models.build's dense arch (torchrec is installed
    here). Not the same values: models.build draws the EBC from the seeded RNG first."""
    models, stub = gpu_dense_archs.load_models()
    assert stub["used"] is False
    for family in gpu_dense_archs.FAMILIES:
        dense, inputs, facts = gpu_dense_archs.build_dense_arch(models, family, "tiny", torch.device("cpu"))
        ref = models.build(family, "tiny", count_nodes=False)
        want = ref.module.dense
        got_p = {k: v.shape for k, v in dense.named_parameters()}
        assert got_p == {k: v.shape for k, v in want.named_parameters()}, family
        assert {k: v.shape for k, v in dense.named_buffers()} == {
            k: v.shape for k, v in want.named_buffers()
        }, family
        ref_inputs = ref.dense_inputs(ref.batches[0])
        assert [t.shape for t in inputs] == [t.shape for t in ref_inputs], family
        assert facts["dense_params"] == sum(p.numel() for p in want.parameters()), family
        assert dense(*inputs).shape == (ref.meta["batch_size"], ref.meta["num_tasks"]), family


def test_stub_placeholders_refuse() -> None:
    stub = gpu_dense_archs.make_torchrec_stub()
    for name in gpu_dense_archs.TORCHREC_NAMES:
        with pytest.raises(RuntimeError, match="torchrec is not installed"):
            getattr(stub, name)()
    with pytest.raises(RuntimeError, match=r"PoolingType\.SUM"):
        _ = stub.PoolingType.SUM


def test_work_order_most_valuable_first() -> None:
    order = gpu_dense_archs.work_order(["towers", "mmoe", "dcn", "dlrm"], ["medium", "large"])
    assert [c.name for c in order] == [
        "towers/medium",
        "mmoe/medium",
        "towers/large",
        "mmoe/large",
        "dcn/medium",
        "dlrm/medium",
        "dcn/large",
        "dlrm/large",
    ]
