"""scripts/gpu_check.py on its CPU dry path at a tiny size: every cell runs, agrees with eager, and the
JSON on disk is the returned payload; a spent budget skips work instead of failing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import gpu_check


@pytest.mark.compile
def test_dry_run_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    fx_cache = torch._inductor.config.fx_graph_cache
    payload = gpu_check.main(
        [
            "--device=cpu",
            "--configs=2x4x8",
            "--modes=eager,eager+optimus,compile+peer",
            "--rounds=2",
            "--iters=2",
            "--warmup=1",
            "--threads=1",
            f"--out={out}",
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(gpu_check.jsonable(payload)))
    assert payload["finished"] is True
    assert payload["settings"]["tf32"] == "off"
    cells = {(c["phase"], c["mode"]): c for c in payload["cells"]}
    assert set(cells) == {
        (p, m) for p in ("infer", "train") for m in ("eager", "eager+optimus", "compile+peer")
    }
    for key, c in cells.items():
        assert c["status"] == "ok", (key, c.get("error"))
        assert c["parity_ok"] is True, key
        assert c["n"] == 2 and c["median_us"] > 0, key
        if key[0] == "train":
            assert c["grad_ok"] is True, key
    report = cells["infer", "eager+optimus"]
    assert (
        report["nodes_before"] > 0 and report["nodes_after"] > 0 and isinstance(report["rules_fired"], dict)
    )
    assert cells["train", "compile+peer"]["graphs_compiled"] == 1
    assert cells["train", "compile+peer"]["recompiled_in_timing"] == 0
    assert {c["cost_model"] for c in payload["cost_model"]} == {"analytic", "measured"}
    assert all(c["status"] == "ok" for c in payload["cost_model"])
    assert torch._inductor.config.fx_graph_cache == fx_cache  # settings restored


def test_spent_budget_skips(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    payload = gpu_check.main(
        [
            "--device=cpu",
            "--configs=2x4x8",
            "--modes=eager",
            "--budget-s=1e-6",
            "--no-cost-models",
            f"--out={out}",
        ]
    )
    assert [c["status"] for c in payload["cells"]] == ["skipped: budget"] * 2
    assert json.loads(out.read_text())["finished"] is True
