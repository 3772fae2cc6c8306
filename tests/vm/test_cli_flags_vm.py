"""The bench's command line on a real VM: what only a live bench can show (its estimate of the time
left).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import Cli


@pytest.mark.vm
def test_a_live_bench_estimates_the_time_left_from_its_finished_episodes(cli: Cli,
                                                                         tmp_path: Path) -> None:
    """Two live noop episodes, one at a time: the first line has nothing to go on; the second
    estimates from the first episode's wall time (which includes its restore and judging)."""
    r = cli("bench", "--agent", "noop", "--only", "nginx-stopped", "rogue-port-80", "--jobs", "1",
            "--runs-dir", str(tmp_path), timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    first, second = [ln for ln in r.stderr.splitlines() if re.match(r"\[bench\] \d/2 ", ln)]
    assert first == "[bench] 1/2 nginx-stopped (time left: estimating...)", first
    left = re.fullmatch(r"\[bench\] 2/2 rogue-port-80 \(about (\d+) (s|min) left\)", second)
    assert left is not None, second
    took = re.search(r"\[bench\] nginx-stopped: fail in ([\d.]+)s", r.stderr)
    assert took is not None, r.stderr
    estimate = int(left.group(1)) * (60 if left.group(2) == "min" else 1)
    assert estimate >= int(float(took.group(1))) - 30 * (left.group(2) == "min"), (second, took)
