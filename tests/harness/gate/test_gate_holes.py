"""The gate cannot go green by losing data, and bad input is one line with its own exit code.

Each test is one hole found by using the CLI as a new user would; each failed
on dbcb301 (exit 0, exit 1 shared with "regression", or a traceback). Nothing here measures:
``run_suite`` / ``run_ab`` are replaced by a tripwire, so "checked before measuring" is
checked by the tripwire never firing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness import cli, exit_codes
from harness.run import interleaved, runner
from tests.harness import synthetic

FAKES = "tests.harness.fakes:build"


def _pair(tmp_path: Path, new_cells: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    base = synthetic.doc(
        [
            synthetic.cell("towers", "compile", "infer", 5.0, seed=1),
            synthetic.cell("dlrm", "compile", "infer", 5.0, seed=2),
        ]
    )
    new = synthetic.doc(
        new_cells
        if new_cells is not None
        else [
            synthetic.cell("towers", "compile", "infer", 5.0, seed=3),
            synthetic.cell("dlrm", "compile", "infer", 5.0, seed=4),
        ]
    )
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "new.json").write_text(json.dumps(new))
    return str(tmp_path / "base.json"), str(tmp_path / "new.json")


def _main(argv: list[str]) -> int:
    """cli.main, with argparse's own usage errors (SystemExit) read as exit codes."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err
    assert lines, "no error message"
    return lines[-1]


@pytest.fixture
def tripwire(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace every measurement with a recorder that fails the test if reached."""
    calls: list[str] = []

    def measured(*args: Any, **kw: Any) -> Any:
        calls.append("measured")
        raise AssertionError("measured before the input was checked")

    monkeypatch.setattr(runner, "run_suite", measured)
    monkeypatch.setattr(interleaved, "run_ab", measured)
    return calls


# --------------------------------------------------------------------------- lost data


def test_compare_base_cell_missing_from_new_fails_the_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, new = _pair(tmp_path, [synthetic.cell("towers", "compile", "infer", 5.0, seed=3)])
    assert cli.main(["compare", base, new]) == exit_codes.INCOMPLETE
    captured = capsys.readouterr()
    assert "dlrm/tiny/compile/infer" in captured.out and "**missing**" in captured.out
    assert "incomplete" in _one_line(captured.err)


@pytest.mark.parametrize("field", ["median", "q1"])
def test_compare_non_finite_figure_fails_the_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    cells = [synthetic.cell(m, "compile", "infer", 5.0, seed=s) for m, s in (("towers", 3), ("dlrm", 4))]
    cells[1]["latency_ms"][field] = float("nan")  # json.dumps writes NaN, json.loads reads it back
    base, new = _pair(tmp_path, cells)
    assert cli.main(["compare", base, new]) == exit_codes.BAD_INPUT  # a malformed file
    line = _one_line(capsys.readouterr().err)
    assert "new.json" in line and f"cells[1].latency_ms.{field}" in line and "finite" in line


def test_compare_non_finite_in_memory_doc_is_non_finite_verdict() -> None:
    from harness.gate import compare

    base = synthetic.doc([synthetic.cell("towers", "compile", "infer", 5.0, seed=1)])
    new = synthetic.doc([synthetic.cell("towers", "compile", "infer", 5.0, seed=2)])
    new["cells"][0]["compile_s"] = float("inf")
    rows = compare.compare_docs(base, new)
    assert [(r.metric, r.verdict) for r in rows] == [("compile_s", "non-finite")]
    assert compare.exit_code(rows) == exit_codes.INCOMPLETE


@pytest.mark.parametrize("base_status", ["ok", "failed"])
def test_compare_failed_cell_in_new_run_is_incomplete_not_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], base_status: str
) -> None:
    failed = synthetic.cell("dlrm", "compile", "infer", 5.0, seed=4, status="timeout")
    failed["latency_ms"] = None
    base, new = _pair(tmp_path, [synthetic.cell("towers", "compile", "infer", 5.0, seed=3), failed])
    if base_status == "failed":
        doc = json.loads(Path(base).read_text())
        doc["cells"][1].update(status="failed", error="boom", latency_ms=None)
        Path(base).write_text(json.dumps(doc))
    assert cli.main(["compare", base, new]) == exit_codes.INCOMPLETE
    assert "**failed**" in capsys.readouterr().out


def test_incomplete_wins_over_regression(tmp_path: Path) -> None:
    base, new = _pair(
        tmp_path, [synthetic.cell("towers", "compile", "infer", 6.0, seed=3)]
    )  # +20%, dlrm lost
    assert cli.main(["compare", base, new]) == exit_codes.INCOMPLETE


def test_exit_codes_are_distinct() -> None:
    codes = [exit_codes.OK, exit_codes.REGRESSION, exit_codes.BAD_INPUT, exit_codes.INCOMPLETE,
             exit_codes.MISMATCH, exit_codes.TOOL_FAILED]  # fmt: skip
    assert len(set(codes)) == len(codes) and set(codes) <= set(exit_codes.MEANING)


# --------------------------------------------------------------------------- tracebacks -> one line


def test_compare_given_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = _pair(tmp_path)
    (tmp_path / "adir").mkdir()
    assert cli.main(["compare", base, str(tmp_path / "adir")]) == exit_codes.BAD_INPUT
    assert "adir: is a directory" in _one_line(capsys.readouterr().err)


def test_compare_out_into_missing_directory_is_created(tmp_path: Path) -> None:
    base, new = _pair(tmp_path)
    out = tmp_path / "not" / "yet" / "table.md"
    assert cli.main(["compare", base, new, "--out", str(out)]) == exit_codes.OK
    assert "| cell | metric |" in out.read_text()


@pytest.mark.parametrize("where", ["under_file", "a_directory", "read_only"])
def test_compare_unusable_out(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    base, new = _pair(tmp_path)
    out = _bad_out(tmp_path, where)
    assert cli.main(["compare", base, new, "--out", out]) == exit_codes.BAD_INPUT
    line = _one_line(capsys.readouterr().err)
    assert "--out" in line and out in line


def test_env_git_not_an_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, new = _pair(tmp_path)
    doc = json.loads(Path(new).read_text())
    doc["env"]["git"] = "0123abc"
    Path(new).write_text(json.dumps(doc))
    assert cli.main(["report", new, "--out-dir", str(tmp_path / "rep")]) == exit_codes.BAD_INPUT
    line = _one_line(capsys.readouterr().err)
    assert "new.json: env.git" in line and "must be an object" in line


def _bad_out(tmp_path: Path, where: str, name: str = "r.json") -> str:
    """An output path that cannot be written, of the kind ``where`` names."""
    if where == "under_file":
        (tmp_path / "plain").write_text("x")
        return str(tmp_path / "plain" / "sub" / name)
    if where == "a_directory":
        (tmp_path / "isdir").mkdir(exist_ok=True)
        return str(tmp_path / "isdir")
    if where == "read_only":
        # /proc refuses new files even to root (a chmod'ed directory does not stop root).
        return f"/proc/optimus-bench-test-{os.getpid()}/{name}"
    raise AssertionError(where)


@pytest.mark.parametrize("where", ["under_file", "a_directory", "read_only"])
def test_run_checks_out_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tripwire: list[str], where: str
) -> None:
    out = _bad_out(tmp_path, where)
    argv = [
        "run",
        "--provider",
        FAKES,
        "--models",
        "mlp",
        "--modes",
        "eager",
        "--phases",
        "infer",
        "--out",
        out,
    ]
    assert _main(argv) == exit_codes.BAD_INPUT
    assert tripwire == []
    assert out in _one_line(capsys.readouterr().err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 0555 directory")
def test_run_read_only_directory(tmp_path: Path, tripwire: list[str]) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    argv = ["run", "--provider", FAKES, "--models", "mlp", "--out", str(ro / "r.json")]
    assert _main(argv) == exit_codes.BAD_INPUT and tripwire == []


@pytest.mark.parametrize("where", ["under_file", "a_directory", "read_only"])
def test_ab_checks_out_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tripwire: list[str], where: str
) -> None:
    out = _bad_out(tmp_path, where)
    argv = ["ab", "--provider", FAKES, "--model", "mlp", "--modes", "eager,eager+optimus", "--out", out]
    assert _main(argv) == exit_codes.BAD_INPUT
    assert tripwire == []
    assert out in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("where", ["under_file", "read_only"])
def test_report_and_reproduce_check_out_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tripwire: list[str], where: str
) -> None:
    base, _ = _pair(tmp_path)
    out_dir = str(Path(_bad_out(tmp_path, where)).parent)
    assert cli.main(["report", base, "--out-dir", out_dir]) == exit_codes.BAD_INPUT
    assert "--out-dir" in _one_line(capsys.readouterr().err)
    argv = ["reproduce", "--provider", FAKES, "--models", "mlp", "--out", str(tmp_path / "r.json"),
            "--out-dir", out_dir]  # fmt: skip
    assert _main(argv) == exit_codes.BAD_INPUT and tripwire == []


def test_report_stem_cannot_escape_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = _pair(tmp_path)
    out_dir = tmp_path / "rep"
    assert (
        cli.main(["report", base, "--out-dir", str(out_dir), "--stem", "../escaped"]) == exit_codes.BAD_INPUT
    )
    assert "--stem '../escaped'" in _one_line(capsys.readouterr().err)
    assert not list(tmp_path.glob("escaped*"))


def test_report_of_no_cells_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, new = _pair(tmp_path, [])
    assert cli.main(["report", new, "--out-dir", str(tmp_path / "rep")]) == exit_codes.BAD_INPUT
    assert "new.json: no cells to report" in _one_line(capsys.readouterr().err)


# --------------------------------------------------------------------------- smaller holes


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "B", "N", "--latency-threshold", "nan"],
        ["compare", "B", "N", "--compile-abs-s", "inf"],
        ["run", "--provider", FAKES, "--models", "mlp", "--budget-s", "nan"],
        ["run", "--provider", FAKES, "--models", "mlp", "--timeout-s", "inf"],
        ["ab", "--provider", FAKES, "--model", "mlp", "--atol", "nan"],
    ],
)
def test_non_finite_options_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tripwire: list[str], argv: list[str]
) -> None:
    base, new = _pair(tmp_path)
    argv = [base if a == "B" else new if a == "N" else a for a in argv]
    assert _main([*argv, *(["--out", str(tmp_path / "o.json")] if argv[0] == "run" else [])]) == 2
    assert tripwire == []
    assert "finite" in _one_line(capsys.readouterr().err)


def test_run_config_refuses_non_finite_values() -> None:
    from harness.spec import RunConfig

    with pytest.raises(ValueError, match="budget_s: must be a finite number"):
        RunConfig(models=["mlp"], budget_s=float("inf"), provider=FAKES).validate()


def test_empty_models_is_an_error_not_every_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tripwire: list[str]
) -> None:
    argv = ["run", "--provider", FAKES, "--models", "", "--out", str(tmp_path / "r.json")]
    assert _main(argv) == exit_codes.BAD_INPUT
    assert tripwire == []
    assert "models: empty" in _one_line(capsys.readouterr().err)


def test_cuda_on_a_cpu_only_host_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tripwire: list[str]
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    for argv in (
        [
            "run",
            "--provider",
            FAKES,
            "--models",
            "mlp",
            "--device",
            "cuda",
            "--out",
            str(tmp_path / "r.json"),
        ],
        ["ab", "--provider", FAKES, "--model", "mlp", "--device", "cuda"],
    ):
        assert _main(argv) == exit_codes.BAD_INPUT
        assert "device: 'cuda' requested" in _one_line(capsys.readouterr().err)
    assert tripwire == []


def test_ab_mismatch_has_its_own_code(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = {"modes": {"eager": {}, "eager+optimus": {"parity_vs_base": {"ok": False}}}}
    monkeypatch.setattr(interleaved, "run_ab", lambda *a, **k: doc)
    monkeypatch.setattr(interleaved, "format_ab", lambda d: "table")
    argv = ["ab", "--provider", FAKES, "--model", "mlp", "--modes", "eager,eager+optimus"]
    assert cli.main(argv) == exit_codes.MISMATCH
