"""``pair``: two commits measured side by side in worker processes (harness.run.paired,
pair_grid, checkouts), on scratch repositories (pair_repos.py)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from pair_repos import break_imports, copy_of_this_repo, fake_history

from harness.cli import main as cli_main
from harness.run import checkouts, pair_grid
from harness.run.paired import PairOptions, alternate, spread, summarize_rounds
from harness.store import results

FAST = PairOptions(rounds=8, steps=3, warmup=1, processes=2, max_processes=2, compiles=2, process_spread=10.0)


def grid(repo: Path, base: str, new: str, models: list[str], opt: PairOptions = FAST, out: str | None = None):
    with checkouts.checked_out(repo, [base, new]) as (b, n):
        cells = [(m, "tiny", "eager", "infer") for m in models]
        return pair_grid.run_grid(b, n, cells, opt, threshold=0.02, out=out, log=lambda _: None)


def test_a_slower_commit_is_slower_and_an_equal_one_is_not(tmp_path: Path) -> None:
    shas = fake_history(tmp_path / "repo", [1.0, 1.0, 1.4])
    same = grid(tmp_path / "repo", shas[0], shas[1], ["towers"])["cells"][0]
    slow = grid(tmp_path / "repo", shas[0], shas[2], ["towers"], out=str(tmp_path / "slow.json"))["cells"][0]
    assert same["status"] == "ok" and slow["status"] == "ok"
    assert same["paired"]["verdict"] != "slower"
    assert 0.9 < same["paired_ratio"] < 1.1
    assert slow["paired"]["verdict"] == "slower", slow["paired_ratio"]
    assert 1.25 < slow["paired_ratio"] < 1.6
    assert (slow["base_sha"], slow["new_sha"]) == (shas[0], shas[2])
    p = slow["paired"]
    assert p["rounds"] == 8 and len(p["base"]["ms"]) == len(p["new"]["ms"]) == 8
    assert all(len(row) == 2 for row in p["base"]["worker_ms"])  # two processes per side
    assert len(p["base"]["compile_s"]) == len(p["new"]["compile_s"]) == 2
    doc = results.load(tmp_path / "slow.json")  # a normal, valid results file
    assert doc["config"]["kind"] == "pair" and doc["cells"][0]["paired_ratio"] == slow["paired_ratio"]


def test_a_crashing_worker_ends_its_cell_with_the_side_named_and_the_grid_goes_on(tmp_path: Path) -> None:
    shas = fake_history(tmp_path / "repo", [0.5, 0.5], faulty=1)
    cells = grid(tmp_path / "repo", shas[0], shas[1], ["crash", "towers"])["cells"]
    assert cells[0]["status"] == "failed"
    assert "new worker" in cells[0]["error"] and "exited with status 7" in cells[0]["error"]
    assert cells[1]["status"] == "ok"


def test_each_turn_is_timed_after_untimed_steps_that_warm_the_idle_worker(tmp_path: Path) -> None:
    # "cold": a worker's first 8 steps after it idled take 3x as long. Without the warm-up every
    # timed step of a 3-step turn is a cold one; with 50 ms of untimed steps none is.
    shas = fake_history(tmp_path / "repo", [2.0, 2.0])
    warm = grid(tmp_path / "repo", shas[0], shas[1], ["cold"])["cells"][0]
    cold_opt = PairOptions(**{**FAST.__dict__, "round_warmup_ms": 0.0})
    cold = grid(tmp_path / "repo", shas[0], shas[1], ["cold"], cold_opt)["cells"][0]
    assert warm["status"] == cold["status"] == "ok"
    warm_ms = [ms for row in warm["paired"]["base"]["worker_ms"] for ms in row]
    cold_ms = [ms for row in cold["paired"]["base"]["worker_ms"] for ms in row]
    # medians: a step the machine preempts (other work on its cores) is slow warm or cold
    assert statistics.median(warm_ms) < 4.0 < 5.0 < statistics.median(cold_ms), (warm_ms, cold_ms)
    assert warm["paired"]["round_warmup_ms"] == 50.0 and cold["paired"]["round_warmup_ms"] == 0.0


def test_round_warmup_steps_fill_the_time_and_are_bounded() -> None:
    opt = PairOptions(round_warmup_ms=50.0)
    assert opt.round_warmup_steps(10.0) == 5
    assert opt.round_warmup_steps(80.0) == 1
    assert opt.round_warmup_steps(1e-6) == 200
    assert PairOptions(round_warmup_ms=0.0).round_warmup_steps(1.0) == 0
    with pytest.raises(ValueError, match="round_warmup_ms"):
        PairOptions(round_warmup_ms=-1.0).check()


def test_a_hanging_worker_is_killed_with_the_side_named(tmp_path: Path) -> None:
    shas = fake_history(tmp_path / "repo", [0.5, 0.5], faulty=0)
    opt = PairOptions(**{**FAST.__dict__, "prepare_timeout_s": 8.0})
    cell = grid(tmp_path / "repo", shas[0], shas[1], ["hang"], opt)["cells"][0]
    assert cell["status"] == "failed"
    assert "base worker" in cell["error"] and "hung" in cell["error"]


def test_a_commit_that_cannot_import_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    shas = fake_history(repo, [0.5])
    broken = break_imports(repo)
    rc = cli_main(["pair", shas[0], broken, "--repo", str(repo), "--models", "towers", "--modes", "eager"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "cannot be paired" in err and broken[:12] in err
    assert checkouts.git_worktrees(repo) == [str(repo)]


def test_revisions_that_name_no_commit_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    shas = fake_history(repo, [0.5])
    rc = cli_main(["pair", shas[0], "no-such-branch", "--repo", str(repo), "--models", "towers"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "'no-such-branch' is not a commit" in err and len(err.splitlines()) == 1


def test_a_real_pair_of_two_commits_of_this_project(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tracked files of this checkout as a scratch repository with two commits; a tiny model
    in eager mode (no compiler: the test is about the protocol across checkouts)."""
    repo = tmp_path / "repo"
    base, new = copy_of_this_repo(repo)
    out = tmp_path / "pair.json"
    rc = cli_main([
        "pair", base, new, "--repo", str(repo), "--models", "towers", "--modes", "eager", "--phases", "train",
        "--rounds", "4", "--steps", "2", "--compiles", "2", "--process-spread", "10", "--out", str(out),
    ])  # fmt: skip
    assert rc in (0, 1), capsys.readouterr().err
    cell = json.loads(out.read_text())["cells"][0]
    assert cell["status"] == "ok" and cell["max_abs_err"] == 0.0  # same code, same seed: same output
    assert (cell["base_sha"], cell["new_sha"]) == (base, new)
    assert cell["paired"]["base"]["peak_mem_bytes"] > 0 and cell["paired"]["peak_mem_ratio"] is not None
    assert "| towers/tiny/eager/train |" in capsys.readouterr().out
    assert checkouts.git_worktrees(repo) == [str(repo)]  # the temporary worktrees are gone


def test_round_figures() -> None:
    base = [[1.0, 1.2], [1.0, 1.2], [2.0, 2.4]]
    new = [[1.21, 1.21], [1.21, 1.21], [2.42, 2.42]]  # every round 10% slower
    fig = summarize_rounds(base, new)
    assert fig["ratio"] == pytest.approx(1.1)
    assert fig["process_ms"]["base"] == pytest.approx([1.0, 1.2]) and fig["process_spread"][
        "base"
    ] == pytest.approx(0.2)
    assert fig["process_spread"]["new"] == 0.0
    assert alternate(2) == [0, 1, 1, 0]
    assert spread([2.0, 3.0]) == pytest.approx(0.5)


def test_verdicts() -> None:
    v = lambda lo, hi, stable=True: pair_grid.verdict({"ci95": [lo, hi], "stable": stable}, 0.02)  # noqa: E731
    assert v(1.03, 1.05) == "slower"
    assert v(0.99, 1.01) == "not slower"
    assert v(1.01, 1.04) == "undecided"
    assert v(1.03, 1.05, stable=False) == "unstable"


def test_bisect_names_the_slow_commit_of_sixteen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A synthetic history of 16 commits, the step 40% slower from commit 11 on."""
    repo = tmp_path / "repo"
    shas = fake_history(repo, [1.0] * 11 + [1.4] * 5)
    out = tmp_path / "bisect.json"
    rc = cli_main([
        "bisect", shas[0], shas[-1], "--cell", "towers/tiny/eager/infer", "--repo", str(repo),
        "--rounds", "8", "--steps", "3", "--warmup", "1", "--processes", "1", "--compiles", "1", "--max-processes", "1",
        "--process-spread", "10", "--out", str(out),
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["first_slower"] == shas[11] and doc["parent"] == shas[10]
    assert len(doc["steps"]) == 5  # BAD first, then log2(15) rounded up
    assert f"first slower commit: {shas[11]}" in printed and "95%" in doc["confidence"]


def test_bisect_refuses_a_range_that_is_not_slower(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    shas = fake_history(repo, [1.0, 1.0])
    rc = cli_main([
        "bisect", shas[0], shas[1], "--cell", "towers/tiny/eager/infer", "--repo", str(repo),
        "--rounds", "6", "--steps", "3", "--processes", "1", "--compiles", "1", "--max-processes", "1", "--process-spread", "10",
    ])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "is not slower than GOOD" in err[-1]


@pytest.mark.parametrize("cell", ["towers/tiny/eager", "nosuch/tiny/eager/infer", "towers/tiny/fast/infer"])
def test_bisect_bad_cell_is_one_line(cell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bisect", "HEAD~1", "HEAD", "--cell", cell]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.compile
def test_reproduce_speedups_come_from_the_modes_side_by_side() -> None:
    """``pair_modes`` measures compile+optimus against compile in worker processes, and the
    paper table then shows that paired speedup (marked), not the ratio of the two cells."""
    from harness.report import paper
    from harness.run.paired_modes import pair_modes
    from tests.harness import synthetic

    cells = [synthetic.cell("mlp", m, "infer", ms, seed=i) for i, (m, ms) in
             enumerate([("compile", 5.0), ("compile+optimus", 50.0)])]  # fmt: skip
    doc = synthetic.doc(cells)
    opt = PairOptions(rounds=4, max_rounds=4, steps=2, warmup=1, processes=1, max_processes=1, compiles=1,
                      provider="tests.harness.fakes:build")  # fmt: skip
    doc["paired_speedups"] = pair_modes(doc, opt, log=lambda _: None)
    [p] = doc["paired_speedups"]
    assert (p["against"], p["mode"], p["rounds"]) == ("compile", "compile+optimus", 4)
    lo, hi = p["ci95"]
    assert lo <= p["speedup"] <= hi
    row = paper.paper_rows(doc)[0]["vs compile"]
    assert row["paired"] and row["x"] == p["speedup"]  # not the cells' 0.1x
    assert "‡" in paper.format_paper_table(paper.paper_rows(doc))
