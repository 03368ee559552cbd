"""`corpus-ab` (harness/diagnose/corpus_ab.py): the per-zoo tables from ab files (medians, the
lowest row, models below the target and wholly below it, error rows), one real ab in its own
process, an ab that fails as an error row with its one line, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli, exit_codes
from harness.diagnose import corpus_ab


def ab_doc(
    model: str, phase: str, speedup: float, ci: tuple[float, float], base_ms: float = 2.0, processes: int = 1
) -> dict:
    spread = {"process_spread": 0.05} if processes > 1 else {}
    return {
        "kind": "ab", "model": model, "scale": "small", "phase": phase, "base": "compile",
        "config": {"rounds": 21, "steps": 20, "processes": processes},
        "modes": {
            "compile": {"median_ms": base_ms, "first_call_s": 20.0, **spread},
            "compile+optimus": {"median_ms": base_ms / speedup, "first_call_s": 10.0, "speedup_vs_base": speedup,
                                "speedup_ci95": list(ci), "parity_vs_base": {"ok": True, "max_abs_err": 0.0},
                                **spread},
        },
    }  # fmt: skip


def write_ab(
    out: Path, model: str, phase: str, speedup: float, ci: tuple[float, float], processes: int = 1
) -> None:
    path = corpus_ab.ab_path(out, model, phase, confirm=processes > 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ab_doc(model, phase, speedup, ci, processes=processes)))


def test_the_tables_per_zoo(tmp_path: Path) -> None:
    write_ab(tmp_path, "rechub.MMOE", "infer", 1.10, (1.05, 1.15))
    write_ab(tmp_path, "rechub.MMOE", "train", 0.97, (0.95, 0.99))  # below, not wholly
    write_ab(tmp_path, "rechub.PLE", "infer", 1.30, (1.20, 1.40))
    write_ab(tmp_path, "rechub.PLE", "train", 0.90, (0.85, 0.95))  # wholly below
    write_ab(tmp_path, "deepctr.DCN", "infer", 1.50, (1.40, 1.60))
    doc = corpus_ab.collect(tmp_path, {"deepctr.DCN/train": "compile worker 0 failed 'prepare': boom"})
    zoos = corpus_ab.per_zoo(doc)
    rechub = zoos["rechub"]
    assert rechub["models"] == 2 and rechub["errors"] == 0
    assert rechub["infer"] == pytest.approx(1.20) and rechub["train"] == pytest.approx(0.935)
    assert rechub["lowest"] == {
        "model": "rechub.PLE",
        "phase": "train",
        "speedup": 0.90,
        "ci95": [0.85, 0.95],
        "processes": 1,
    }
    assert rechub["below"] == ["rechub.MMOE/train", "rechub.PLE/train"]
    assert rechub["clearly_below"] == ["rechub.PLE/train"]
    assert zoos["deepctr"]["errors"] == 1 and zoos["deepctr"]["train"] is None
    assert zoos["all"]["models"] == 3 and zoos["all"]["infer"] == pytest.approx(1.30)
    text = corpus_ab.markdown(doc)
    assert "| rechub | 2 | 1.200x | 0.935x | 0.900x (0.850-0.950), rechub.PLE train | 2 | 1 |" in text
    assert "| deepctr.DCN | 1.500x (1.400-1.600) | error: compile worker 0 failed 'prepare': boom |" in text
    assert (
        "| rechub.MMOE | 1.100x (1.050-1.150) | 0.970x (0.950-0.990) | 2.00 / 2.00 | 0.50x / 0.50x |" in text
    )


def test_a_failing_ab_is_an_error_row_with_its_one_line(tmp_path: Path) -> None:
    why = corpus_ab.run_one(tmp_path, "nozoo.Model", "infer", rounds=2, steps=1)
    assert why is not None and "unknown 'nozoo.Model'" in why and "\n" not in why
    assert not corpus_ab.ab_path(tmp_path, "nozoo.Model", "infer").exists()


@pytest.mark.compile
def test_one_real_ab_in_its_own_process(tmp_path: Path) -> None:
    """The stand-in provider's model (the corpus's models compile for tens of seconds each)."""
    assert (
        corpus_ab.run_one(tmp_path, "mlp", "infer", rounds=2, steps=1, provider="tests.harness.fakes:build")
        is None
    )
    doc = json.loads(corpus_ab.ab_path(tmp_path, "mlp", "infer").read_text())
    row = corpus_ab.row_of(doc)
    assert row["parity_ok"] and row["speedup"] > 0 and row["ci95"][0] <= row["speedup"] <= row["ci95"][1]


def test_the_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        ["corpus-ab"],
        ["corpus-ab", "--from-dir", str(tmp_path)],
        ["corpus-ab", "--out-dir", str(tmp_path), "--zoos", "nozoo"],
        ["corpus-ab", "--out-dir", str(tmp_path), "--models", "nozoo.Model"],
        ["corpus-ab", "--out-dir", str(tmp_path), "--phases", "backward"],
        ["corpus-ab", "--out-dir", str(tmp_path), "--rounds", "1"],
        ["corpus-ab", "--out-dir", str(tmp_path), "--timeout-s", "0"],
        ["corpus-ab", "--out-dir", str(tmp_path), "--confirm-processes", "1"],
    ]
    for argv in cases:
        assert cli.main(argv) == exit_codes.BAD_INPUT, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("corpus_ab: "), (argv, err)


def test_from_dir_prints_the_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_ab(tmp_path, "rechub.MMOE", "infer", 1.10, (1.05, 1.15))
    assert cli.main(["corpus-ab", "--from-dir", str(tmp_path)]) == exit_codes.OK
    assert "| rechub.MMOE | 1.100x (1.050-1.150) | error: not run |" in capsys.readouterr().out


def test_a_cell_below_the_line_is_judged_by_its_measurement_again(tmp_path: Path) -> None:
    write_ab(tmp_path, "rechub.MMOE", "infer", 1.10, (1.05, 1.15))
    write_ab(tmp_path, "rechub.MMOE", "train", 0.90, (0.88, 0.92))  # one slow process
    write_ab(tmp_path, "rechub.MMOE", "train", 1.05, (1.02, 1.08), processes=2)  # not the rewrite
    write_ab(tmp_path, "rechub.PLE", "train", 0.95, (0.93, 0.97))
    write_ab(tmp_path, "rechub.PLE", "train", 0.96, (0.94, 0.97), processes=2)  # slower again
    write_ab(tmp_path, "rechub.DCN", "train", 1.20, (1.10, 1.30), processes=2)  # no first figure: not a cell
    doc = corpus_ab.collect(tmp_path)
    assert "rechub.DCN" not in doc["models"]
    z = corpus_ab.per_zoo(doc)["rechub"]
    assert z["train"] == pytest.approx(0.925)  # the medians: first figures, every cell measured alike
    assert z["below_first"] == ["rechub.MMOE/train", "rechub.PLE/train"]
    assert z["below"] == z["clearly_below"] == ["rechub.PLE/train"]
    assert z["confirmed"] == ["rechub.MMOE/train", "rechub.PLE/train"]
    assert z["lowest"] == {"model": "rechub.PLE", "phase": "train", "speedup": 0.96, "ci95": [0.94, 0.97],
                           "processes": 2}  # fmt: skip
    text = corpus_ab.markdown(doc)
    assert (
        "| rechub | 2 | 1.100x | 0.925x | 0.960x (0.940-0.970), rechub.PLE train | 1 (2 at first) | 1 |"
        in text
    )
    assert ("| rechub.MMOE | 1.100x (1.050-1.150) | 0.900x (0.880-0.920); again, 2 processes a mode: "
            "1.050x (1.020-1.080); processes apart 5.0% |") in text  # fmt: skip


def test_only_cells_below_the_line_are_measured_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first figures are present (a resumed run measures none of them again); the cell below
    the line is measured again with two processes a mode, once; a failed measurement again is an
    error on its row and exit 3, and the cell is judged by its first figure."""
    write_ab(tmp_path, "rechub.MMOE", "infer", 1.10, (1.05, 1.15))
    write_ab(tmp_path, "rechub.MMOE", "train", 0.90, (0.88, 0.92))
    write_ab(tmp_path, "rechub.PLE", "infer", 0.97, (0.90, 1.02))
    write_ab(tmp_path, "rechub.PLE", "train", 1.30, (1.20, 1.40))
    calls: list[tuple[str, str, int]] = []

    def fake_run_one(
        out_dir: Path, model: str, phase: str, rounds: int, steps: int, **kw: object
    ) -> str | None:
        calls.append((model, phase, int(kw["processes"])))  # type: ignore[call-overload]
        if model == "rechub.PLE":
            return "compile+optimus worker 1 failed 'prepare': boom"
        write_ab(out_dir, model, phase, 1.02, (0.99, 1.04), processes=int(kw["processes"]))  # type: ignore[call-overload]
        return None

    monkeypatch.setattr(corpus_ab, "run_one", fake_run_one)
    argv = ["corpus-ab", "--out-dir", str(tmp_path), "--models", "rechub.MMOE,rechub.PLE"]
    assert cli.main(argv) == exit_codes.INCOMPLETE
    assert sorted(calls) == [("rechub.MMOE", "train", 2), ("rechub.PLE", "infer", 2)]
    out = capsys.readouterr().out
    assert "0.900x (0.880-0.920); again, 2 processes a mode: 1.020x (0.990-1.040)" in out
    assert "| rechub.PLE | 0.970x (0.900-1.020); measured again: compile+optimus worker 1 failed" in out
    assert (
        "| rechub | 2 | 1.035x | 1.100x | 0.970x (0.900-1.020), rechub.PLE infer | 1 (2 at first) | 0 |"
        in out
    )
    calls.clear()
    assert cli.main([*argv, "--confirm-processes", "3"]) == exit_codes.INCOMPLETE
    assert calls == [("rechub.PLE", "infer", 3)]  # the confirmed cell is not measured again
    calls.clear()
    assert cli.main([*argv, "--confirm-processes", "0"]) == exit_codes.OK
    assert calls == []
