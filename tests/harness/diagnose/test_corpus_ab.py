"""`corpus-ab` (harness/diagnose/corpus_ab.py): the per-zoo tables from ab files (medians, the
lowest row, models below the target and wholly below it, error rows), one real ab in its own
process, an ab that fails as an error row with its one line, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli, exit_codes
from harness.diagnose import corpus_ab


def ab_doc(model: str, phase: str, speedup: float, ci: tuple[float, float], base_ms: float = 2.0) -> dict:
    return {
        "kind": "ab", "model": model, "scale": "small", "phase": phase, "base": "compile",
        "config": {"rounds": 21, "steps": 20},
        "modes": {
            "compile": {"median_ms": base_ms, "first_call_s": 20.0},
            "compile+optimus": {"median_ms": base_ms / speedup, "first_call_s": 10.0, "speedup_vs_base": speedup,
                                "speedup_ci95": list(ci), "parity_vs_base": {"ok": True, "max_abs_err": 0.0}},
        },
    }  # fmt: skip


def write_ab(out: Path, model: str, phase: str, speedup: float, ci: tuple[float, float]) -> None:
    path = corpus_ab.ab_path(out, model, phase)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ab_doc(model, phase, speedup, ci)))


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
    ]
    for argv in cases:
        assert cli.main(argv) == exit_codes.BAD_INPUT, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("corpus_ab: "), (argv, err)


def test_from_dir_prints_the_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_ab(tmp_path, "rechub.MMOE", "infer", 1.10, (1.05, 1.15))
    assert cli.main(["corpus-ab", "--from-dir", str(tmp_path)]) == exit_codes.OK
    assert "| rechub.MMOE | 1.100x (1.050-1.150) | error: not run |" in capsys.readouterr().out
