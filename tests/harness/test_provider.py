"""`--provider package.module:function`: bad specs are one line and BAD_INPUT; torchrec's own
DLRM_DCN (a model this repository did not write) runs end to end through `optimus-bench run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli, exit_codes, provider

TORCHREC_DLRM = "harness.providers.torchrec_dlrm:build"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("models.build", "expected 'package.module:function'"),
        ("no_such_pkg.mod:build", "cannot import module 'no_such_pkg.mod'"),
        ("models:no_such_fn", "has no attribute 'no_such_fn'"),
        ("models:FAMILIES", "not callable"),
    ],
)
def test_bad_spec_is_one_line_and_bad_input(
    spec: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(provider.ProviderError, match=needle):
        provider.load(spec)
    for argv in (["run", "--provider", spec], ["ab", "--model", "towers", "--provider", spec]):
        assert cli.main(argv) == exit_codes.BAD_INPUT
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err


def test_torchrec_dlrm_dcn_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "dlrm_dcn.json"
    argv = ["run", "--provider", TORCHREC_DLRM, "--models", "dlrm_dcn", "--scale", "tiny",
            "--modes", "eager,eager+optimus", "--device", "cpu", "--warmup", "1", "--min-iters", "2",
            "--max-iters", "3", "--budget-s", "0.2", "--no-progress", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == exit_codes.OK
    doc = json.loads(out.read_text())
    cells = {(c["mode"], c["phase"]): c for c in doc["cells"]}
    assert set(cells) == {(m, p) for m in ("eager", "eager+optimus") for p in ("infer", "train")}
    for cell in cells.values():
        assert cell["status"] == "ok", cell.get("error")
        assert cell["meta"]["provider"] == "torchrec.models.dlrm" and cell["latency_ms"]["median"] > 0
    assert cells[("eager+optimus", "train")]["parity"]["grads_compared"] > 0
