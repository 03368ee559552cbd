"""harness.diagnose.profile_cell: the breakdown arithmetic, the table, the command's errors, and one real
CPU run of a tiny model (both modes profiled, each op counted once per step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.diagnose import profile_cell as pc


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("aten::mm", "matmul"),
        ("aten::baddbmm", "matmul"),
        ("void gemmSN_TN_kernel<float>", "matmul"),
        ("aten::cat", "copy/stack/cat"),
        ("Memcpy HtoD (Pinned -> Device)", "copy/stack/cat"),
        ("triton_per_fused_native_layer_norm_0", "normalization"),
        ("triton_poi_fused_relu_3", "fused pointwise"),
        ("graph_0_cpp_fused_relu_sigmoid_1", "fused pointwise"),
        ("graph_0_cpp_fused_native_layer_norm_0", "normalization"),
        ("graph_1_cpp_fused_cat_relu_2", "copy/stack/cat"),
        ("TorchDynamo Cache Lookup", "other"),
    ],
)
def test_kind_of_names(name: str, kind: str) -> None:
    assert pc.kind_of(name) == kind


def test_breakdown_is_per_step_and_ranked() -> None:
    rows = [
        {"name": "aten::mm", "self_us": 40.0, "count": 4},
        {"name": "aten::cat", "self_us": 10.0, "count": 2},
        {"name": "aten::addmm", "self_us": 20.0, "count": 2},
    ]
    b = pc.breakdown(rows, steps=2, top=2)
    assert b["self_us_per_step"] == 35.0
    assert b["kinds_us_per_step"] == {"matmul": 30.0, "copy/stack/cat": 5.0}
    assert list(b["kinds_us_per_step"]) == ["matmul", "copy/stack/cat"]  # largest first
    assert b["ops_per_step"] == 4.0
    assert [t["name"] for t in b["top"]] == ["aten::mm", "aten::addmm"]
    assert b["top"][0]["calls_per_step"] == 2.0


def test_bad_options_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert pc.main(["--model", "towers", "--modes", "nope", "--out-dir", str(tmp_path)]) == 2
    assert "unknown mode" in capsys.readouterr().err
    assert pc.main(["--model", "towers", "--steps", "0", "--out-dir", str(tmp_path)]) == 2
    assert not (tmp_path / "profile.json").exists()


def test_profiles_a_tiny_model_on_cpu(tmp_path: Path) -> None:
    rc = pc.main(
        [
            "--provider",
            "models.dense_only:build",
            "--model",
            "dcn",
            "--modes",
            "eager,eager+optimus",
            "--steps",
            "3",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    d = json.loads((tmp_path / "profile.json").read_text())
    assert [m["mode"] for m in d["modes"]] == ["eager", "eager+optimus"]
    eager, opt = d["modes"]
    assert eager["self_us_per_step"] > 0 and eager["step_ms_median"] > 0
    assert eager["kinds_us_per_step"]["matmul"] > 0
    assert opt["rules_fired"]  # eager+optimus rewrote the dcn dense arch
    assert opt["ops_per_step"] < eager["ops_per_step"]  # fused: fewer ops per step
    md = (tmp_path / "profile.md").read_text()
    assert "| matmul us |" in md and "## eager+optimus" in md and "rules fired:" in md
    for m in (eager, opt):  # what holds each mode's peak (harness.diagnose.peak_live)
        live = m["peak_live"]
        assert live["peak_step_bytes"] > 0 and live["groups"], live
        assert sum(g["bytes"] for g in live["groups"]) == live["live_bytes"]
    assert md.count("live at the step's peak (") == 2


def test_a_training_profile_names_the_backward_in_the_live_set(tmp_path: Path) -> None:
    rc = pc.main(
        ["--provider", "models.dense_only:build", "--model", "towers", "--phase", "train", "--modes",
         "eager", "--steps", "2", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert rc == 0
    (eager,) = json.loads((tmp_path / "profile.json").read_text())["modes"]
    places = [g["where"] for g in eager["peak_live"]["groups"]]
    assert any("Backward" in p for p in places), places


def test_compiled_kernels_are_rows_of_their_own_on_cpu(tmp_path: Path) -> None:
    """Inductor's C++ kernels appear by name (``cpp_fused_*``), not only as the opaque
    ``## Call CompiledFxGraph ##`` row around them."""
    rc = pc.main(
        [
            "--provider",
            "models.dense_only:build",
            "--model",
            "towers",
            "--modes",
            "compile",
            "--steps",
            "2",
            "--top",
            "50",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    (compiled,) = json.loads((tmp_path / "profile.json").read_text())["modes"]
    kernels = [t for t in compiled["top"] if "cpp_fused" in t["name"]]
    assert kernels, [t["name"] for t in compiled["top"]]
    assert all(t["kind"] != "other" for t in kernels)
