"""Speed figures are measured, never asserted; what is checked is that they are computed right."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runner.core.paths import repo_root

pytestmark = pytest.mark.vm


def test_perf_json_counts_every_round_trip_of_every_sandbox() -> None:
    r = subprocess.run([sys.executable, "-m", "runner", "-q", "perf", "--json", "--no-model"],
                       capture_output=True, text=True, timeout=900, cwd=repo_root())
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)  # one JSON document
    # Three restored sandboxes, twenty commands each: the median is over all sixty
    # (it used to be over the last sandbox's twenty only).
    assert figures["command_rtt_samples"] == 60
    assert figures["command_rtt_ms"] > 0 and figures["restore_ready_s"] > 0
    assert figures["replay_cassettes"] >= 35
