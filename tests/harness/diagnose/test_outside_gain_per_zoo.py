"""The outside-gain report's per-zoo figures and its rules x zoos table, from a run's JSON
(no corpus model is built or timed here): medians per zoo and pooled, the lowest row, the
targets, the rows without a figure, and ``--from-json``; and ``--guard``, on a stand-in corpus
of one small model whose guard is given a fake measure (its verdict is fixed, not timed)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import optimus
from harness.diagnose import outside_gain
from optimus.config import OptimusConfig
from optimus.params.relayout import RelayoutParams


def _row(fwd: float, bwd: float, rules: dict[str, int]) -> dict[str, Any]:
    def gain(x: float) -> dict[str, Any]:
        return {"speedup": x, "ci95": [x - 0.05, x + 0.05], "capture_ms": 1.0, "rules_ms": 1.0 / x}

    parity = {
        "values": True,
        "grads": True,
        "buffers": True,
        "nodes_before": 10,
        "nodes_after": 8,
        "rules_fired": rules,
        "declined_reasons": {},
        "capture": "export",
        "capture_reason": "",
    }
    return {"parity": parity, "gain": {"forward": gain(fwd), "forward+backward": gain(bwd)}}


def _per_call(rules: dict[str, int]) -> dict[str, Any]:
    row = _row(1.0, 1.0, rules)
    row["parity"]["capture"] = "dynamo-subgraphs"
    row["gain"] = {"skipped": f"capture 'dynamo-subgraphs': {outside_gain.SKIP_WHY}"}
    return row


def _doc() -> dict[str, Any]:
    models = {
        "deepctr.A": _row(1.5, 1.3, {"batch_linear": 2, "cse": 4}),
        "deepctr.B": _row(1.3, 1.25, {"cse": 1}),
        "deepctr.C": _row(1.25, 1.21, {"batch_linear": 1}),
        "rechub.A": _row(1.1, 1.2, {"cse": 3}),
        "rechub.B": _row(0.95, 1.05, {"batch_embedding": 1, "batch_linear": 0}),
        "recbole.A": _per_call({"cse": 2}),
        "recbole.B": {"error": "RuntimeError: boom"},
    }
    return {
        "schema": outside_gain.SCHEMA,
        "torch": "x",
        "threads": 1,
        "rounds": 3,
        "steps": 2,
        "models": models,
    }


def test_each_zoo_has_its_own_medians_lowest_row_and_targets() -> None:
    zoos = outside_gain.per_zoo(_doc())
    assert list(zoos) == ["deepctr", "rechub", "recbole", "all"]
    deepctr, rechub, recbole, pooled = zoos["deepctr"], zoos["rechub"], zoos["recbole"], zoos["all"]
    assert (deepctr["forward"], deepctr["forward+backward"]) == (1.3, 1.25)
    assert deepctr["lowest"] == {"model": "deepctr.C", "phase": "forward+backward", "speedup": 1.21}
    assert deepctr["targets_met"] is True
    assert rechub["forward"] == pytest.approx(1.025) and rechub["forward+backward"] == pytest.approx(1.125)
    assert rechub["lowest"] == {"model": "rechub.B", "phase": "forward", "speedup": 0.95}
    assert rechub["targets_met"] is False
    # a zoo with no timed row: counted, no figure, and why
    assert recbole == {"models": 2, "measured": 0, "per_call": 1}
    # pooled: the five timed rows; it passes the medians while one zoo misses them
    assert (pooled["models"], pooled["measured"]) == (7, 5)
    assert pooled["forward"] == 1.25 and pooled["forward+backward"] == 1.21


def test_one_zoo_alone_has_no_pooled_row() -> None:
    doc = _doc()
    doc["models"] = {k: v for k, v in doc["models"].items() if k.startswith("deepctr.")}
    assert list(outside_gain.per_zoo(doc)) == ["deepctr"]


def test_rules_are_counted_per_zoo_by_the_models_they_fired_on() -> None:
    counts = outside_gain.rules_by_zoo(_doc())
    assert counts == {
        "batch_embedding": {"rechub": 1},
        "batch_linear": {"deepctr": 2},  # a zero count is not a firing
        "cse": {"deepctr": 2, "rechub": 1, "recbole": 1},
    }


def test_the_report_puts_the_zoo_tables_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = outside_gain.markdown(_doc())
    assert text.index("## Per zoo") < text.index("## Which rules fire") < text.index("## Per model")
    assert "| deepctr | 3 (3) | 1.25x | 1.30x | 1.21x (deepctr.C, forward+backward) | met |" in text
    assert "| rechub | 2 (2) | 1.12x | 1.02x | 0.95x (rechub.B, forward) | missed |" in text
    assert "| recbole | 2 (0) | - | - | - | no figure (1 on the per-call Dynamo path) |" in text
    assert "| rule | deepctr (3) | rechub (2) | recbole (1) |" in text
    assert "| cse | 2 | 1 | 1 |" in text
    run = tmp_path / "outside-gain.json"
    run.write_text(json.dumps(_doc()))
    assert outside_gain.main(["--from-json", str(run)]) == 0
    assert capsys.readouterr().out.strip() == text.strip()


def test_a_file_that_is_not_a_run_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"torch": "x", "threads": 1, "rounds": 1, "steps": 1, "models": 3}')
    assert outside_gain.main(["--from-json", str(bad)]) == 2
    assert outside_gain.main(["--from-json", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("not a readable outside-gain run" in line for line in err)


def test_runs_of_disjoint_models_measured_alike_join_into_one_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc()
    parts = []
    for zoo in ("deepctr", "rechub", "recbole"):
        part = {**doc, "models": {k: v for k, v in doc["models"].items() if k.startswith(zoo + ".")}}
        parts.append(tmp_path / f"{zoo}.json")
        parts[-1].write_text(json.dumps(part))
    assert outside_gain.main(["--from-json", *map(str, parts)]) == 0
    assert capsys.readouterr().out.strip() == outside_gain.markdown(doc).strip()
    # the same model twice, or runs measured with other rounds, are not one report
    assert outside_gain.main(["--from-json", str(parts[0]), str(parts[0])]) == 2
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(parts[1].read_text()), "rounds": 9}))
    assert outside_gain.main(["--from-json", str(parts[0]), str(other)]) == 2
    err = capsys.readouterr().err
    assert "deepctr.A is in two runs" in err and "measured with another rounds" in err


def test_one_architecture_is_shown_side_by_side_in_each_zoo() -> None:
    doc = _doc()
    doc["models"] = {
        "deepctr.DeepFM": _row(1.4, 1.3, {}),
        "rechub.DeepFM": _row(1.0, 1.1, {}),
        "recbole.DeepFM": _per_call({}),
        "deepctr.DCN": _row(1.2, 1.2, {}),  # alone of its architecture: no row
    }
    lines = outside_gain.architecture_markdown(doc)
    assert (
        lines[-1]
        == "| DeepFM | deepctr.DeepFM 1.30x / 1.40x; rechub.DeepFM 1.10x / 1.00x; recbole.DeepFM n/a |"
    )
    assert not any(line.startswith("| DCN |") for line in lines)
    assert outside_gain.architecture_markdown(_doc()) == []  # no real corpus name: no table


class _Towers(torch.nn.Module):
    """Four small towers on one input: the rules rewrite them (they merge the Linears)."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = torch.nn.ModuleList(torch.nn.Linear(8, 4) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([t(x).relu() for t in self.towers], dim=1)


def _towers(seed: int) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    torch.manual_seed(seed)
    return _Towers().train(), (torch.randn(16, 8),)


def _slower_rewrite() -> Callable[[torch.fx.GraphModule, Callable[[], object], int], float]:
    """A ``guard_measure`` that runs nothing and prices the rewritten graph at twice the plain
    capture: the guard measures the plain graph first (``optimus.guard.paired_speedup``)."""
    plain: list[int] = []

    def measure(gm: torch.fx.GraphModule, step: Callable[[], object], calls: int) -> float:
        plain[:] = plain or [id(gm)]
        return calls * (1.0 if id(gm) == plain[0] else 2.0)

    return measure


@pytest.fixture
def towers_corpus(monkeypatch: pytest.MonkeyPatch) -> list[OptimusConfig]:
    """The corpus as one model, ``rechub.Towers``; every config ``optimize`` is given is
    recorded, and a guarded one gets :func:`_slower_rewrite` as its ``guard_measure``."""
    monkeypatch.setattr(outside_gain.outside, "catalog", lambda: {"rechub.Towers": _towers})
    configs: list[OptimusConfig] = []
    real = optimus.optimize

    def optimize(model: torch.nn.Module, inputs: Any, rules: Any = None, *, config: OptimusConfig) -> Any:
        configs.append(config)
        if config.guard != "off":
            config = config.with_(guard_measure=_slower_rewrite())
        return real(model, inputs, rules=rules, config=config)

    monkeypatch.setattr(outside_gain.optimus, "optimize", optimize)
    return configs


def _run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    args = ["--out-dir", str(tmp_path), "--models", "rechub.Towers", "--rounds", "1", "--steps", "1"]
    assert outside_gain.main([*args, *extra]) == 0
    return dict(json.loads((tmp_path / "outside-gain.json").read_text()))


def test_the_guard_option_reaches_the_optimus_side_and_the_run_records_it(
    tmp_path: Path, towers_corpus: list[OptimusConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _run(tmp_path, "--guard", "rules")
    # parity, then per phase: plain capture (never guarded, it rewrites nothing), the Optimus side
    assert [c.guard for c in towers_corpus] == ["rules", "off", "rules", "off", "rules"]
    assert all(isinstance(c.layout, RelayoutParams) for c in towers_corpus)
    assert doc["guard"] == "rules"
    row = doc["models"]["rechub.Towers"]
    # the fake measure makes every rewrite slower: the guard returns the plain capture
    assert row["parity"]["guard"] == "rejected" and row["parity"]["rules_fired"] == {}
    assert set(row["parity"]["guard_rejected"]) - {"dce"}  # a rewrite rule fired and was taken out
    assert [row["gain"][ph]["guard"] for ph in ("forward", "forward+backward")] == ["rejected"] * 2
    out = capsys.readouterr().out
    assert "Guard: rules (OptimusConfig(guard='rules')" in out and ", guard rejected)" in out
    # the saved run prints the same, guard included
    assert outside_gain.main(["--from-json", str(tmp_path / "outside-gain.json")]) == 0
    assert capsys.readouterr().out.strip() == out.strip()


def test_without_the_option_the_run_is_unguarded(
    tmp_path: Path, towers_corpus: list[OptimusConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _run(tmp_path)
    assert [c.guard for c in towers_corpus] == ["off"] * 5
    assert doc["guard"] == "off"
    row = doc["models"]["rechub.Towers"]
    assert set(row["parity"]["rules_fired"]) - {"dce"} and row["parity"]["guard"] == "off"
    assert all("guard" not in row["gain"][ph] for ph in ("forward", "forward+backward"))
    assert "Guard: off" in capsys.readouterr().out


def test_a_run_from_before_the_option_reads_as_unguarded_and_joins_no_guarded_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc()  # no "guard" key, as runs before the option
    assert outside_gain.guard_of(doc) == "off" and "Guard: off" in outside_gain.markdown(doc)
    old, guarded = tmp_path / "old.json", tmp_path / "guarded.json"
    old.write_text(json.dumps({**doc, "models": {"deepctr.A": doc["models"]["deepctr.A"]}}))
    guarded.write_text(
        json.dumps({**doc, "guard": "rules", "models": {"rechub.A": doc["models"]["rechub.A"]}})
    )
    assert outside_gain.main(["--from-json", str(old), str(guarded)]) == 2
    assert "measured with another guard" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        outside_gain.main(["--guard", "sometimes", "--from-json", str(old)])
    assert exit_.value.code == 2 and "--guard: invalid choice: 'sometimes'" in capsys.readouterr().err


def test_a_block_lasts_at_least_block_ms_and_the_run_records_each_phases_count(
    tmp_path: Path, towers_corpus: list[OptimusConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _run(tmp_path, "--block-ms", "5")
    assert doc["block_ms"] == 5.0 and doc["steps"] == 1
    for phase in ("forward", "forward+backward"):
        g = doc["models"]["rechub.Towers"]["gain"][phase]
        # more than one step a block: a step of the stand-in model is far below 5 ms
        assert g["steps"] > 1 and g["steps"] * min(g["capture_ms"], g["rules_ms"]) > 2.5
    assert "interleaved rounds of blocks of at least 5 ms (at least 1 steps" in capsys.readouterr().out
    exact = _run(tmp_path, "--block-ms", "0")
    assert all(
        exact["models"]["rechub.Towers"]["gain"][ph]["steps"] == 1 for ph in ("forward", "forward+backward")
    )


def test_runs_of_other_block_lengths_do_not_join(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc()  # no "block_ms", as runs before the option: a fixed count of steps
    assert "interleaved rounds of 2 steps" in outside_gain.markdown(doc)
    old, blocked = tmp_path / "old.json", tmp_path / "blocked.json"
    old.write_text(json.dumps({**doc, "models": {"deepctr.A": doc["models"]["deepctr.A"]}}))
    blocked.write_text(
        json.dumps({**doc, "block_ms": 25.0, "models": {"rechub.A": doc["models"]["rechub.A"]}})
    )
    assert outside_gain.main(["--from-json", str(old), str(blocked)]) == 2
    assert "measured with another block_ms" in capsys.readouterr().err
    assert outside_gain.main(["--out-dir", str(tmp_path), "--block-ms", "-1"]) == 2
    assert "--block-ms >= 0" in capsys.readouterr().err
