"""The grouped-linear report a GPU machine writes (benchmarks/grouped_linear_report.py), run here
as its CPU dry run: every form that runs on CPU is timed and matches the loop of linears, the
CUDA-only ones say why they did not run, one failing form never loses the others, and a run cut
short by its time limit keeps the rows it measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import grouped_linear_report as gl

CPU_RUNS = ("loop", "padded_bmm", "foreach_mm", "grouped_mm", "bmm")


def test_the_cpu_dry_run_times_every_cpu_form_and_matches_the_loop(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    doc = gl.report("cpu", groups=(3,), dtypes=("float32",), iters=2, warmup=1, out=out)
    assert doc["complete"] and json.loads(out.read_text()) == json.loads(json.dumps(doc))
    rows = doc["rows"]
    expected = 2 * 2 * (len(gl.RAGGED_VARIANTS) + len(gl.EQUAL_VARIANTS))  # phases x modes x variants
    assert len(rows) == expected
    timed = [r for r in rows if r["mode"] == "eager" and r["variant"] in CPU_RUNS]
    # grouped_mm and bmm run on the equal problem only
    assert {(r["problem"], r["variant"]) for r in timed} == {
        *(("ragged", v) for v in CPU_RUNS[:3]),
        *(("equal", v) for v in CPU_RUNS),
    }
    for r in timed:
        assert r.get("median_ms", 0) > 0, r
        assert r["max_abs_err_vs_loop"] < 1e-4, r
    for r in rows:
        if r["mode"] == "cuda_graph":
            assert r["skipped"] == "CUDA graphs need CUDA"
        elif r["variant"] == "triton":
            assert "CUDA only" in r["skipped"]


def test_the_ragged_problem_mixes_the_wide_tower_widths() -> None:
    mnk = gl.shapes("ragged", 32)
    assert mnk == gl.shapes("ragged", 32)
    assert {k for _, k, _ in mnk} == set(gl.WIDTHS) and {n for _, _, n in mnk} == set(gl.WIDTHS)
    assert gl.shapes("equal", 4) == [(gl.BATCH, gl.EQUAL_WIDTH, gl.EQUAL_WIDTH)] * 4


def test_a_failing_form_is_a_row_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gl.variant

    def broken(name: str, *args: object) -> gl.Step:
        if name == "foreach_mm":
            raise RuntimeError("no kernel for this\nsecond line")
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(gl, "variant", broken)
    doc = gl.report("cpu", groups=(2,), dtypes=("float32",), iters=1, warmup=0)
    eager = {(r["problem"], r["phase"], r["variant"]): r for r in doc["rows"] if r["mode"] == "eager"}
    assert eager[("ragged", "forward", "foreach_mm")]["error"] == "RuntimeError: no kernel for this"
    assert eager[("equal", "forward", "bmm")]["median_ms"] > 0
    assert eager[("ragged", "forward", "loop")]["median_ms"] > 0


def test_the_time_limit_keeps_what_was_measured(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    doc = gl.report("cpu", groups=(2,), dtypes=("float32",), iters=1, warmup=0, limit_s=0.0, out=out)
    assert not doc["complete"] and doc["stopped"].startswith("--limit-s")
    assert json.loads(out.read_text())["complete"] is False
    assert gl.main([str(tmp_path / "r.json"), "--device", "cpu", "--groups", "2", "--iters", "1",
                    "--limit-s", "0"]) == 3  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gl.main([str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sees no CUDA device" in err
    assert not (tmp_path / "r.json").exists()


def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        gl.main(["x.json", "--groups", "0"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        gl.main(["x.json", "--dtypes", "int8"])
