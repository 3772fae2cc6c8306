"""compare on real VMs: the oracle is better than noop, as the exact paired test says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import IDS, ROUNDS, Cli, _only_dir


@pytest.mark.vm
def test_oracle_is_better_than_noop(cli: Cli, oracle_run: Path, tmp_path: Path) -> None:
    r = cli("-q", "bench", "--agent", "noop", "--only", *IDS, "--repeat", str(ROUNDS),
            "--retry-infra", "1", "--runs-dir", str(tmp_path / "noop"), timeout=1800)
    assert r.returncode == 0, r.stderr
    noop = _only_dir(tmp_path / "noop")
    r = cli("compare", str(oracle_run), str(noop), "--format", "json")
    assert r.returncode == 0, r.stderr
    (c,) = json.loads(r.stdout)["comparisons"]
    assert (c["pairs"], c["a_only"], c["b_only"]) == (8, 8, 0)
    assert c["mcnemar_p"] == pytest.approx(2 / 256)
    assert c["pass_diff_ci"][0] > 0 and c["winner"] == "a"
    r = cli("compare", str(oracle_run), str(noop))
    assert "first tries: oracle is better than noop" in r.stdout
    r = cli("compare", str(noop), str(oracle_run))
    assert "first tries: oracle is better than noop" in r.stdout
