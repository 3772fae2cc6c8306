"""Speed figures are measured, never asserted; what is checked is that they are computed right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Cli, quick_specs

from runner.app.perf import PUBLISHED
from runner.core.episode import PHASES

pytestmark = pytest.mark.vm


@pytest.mark.long(minutes=2)
def test_perf_json_counts_every_round_trip_of_every_sandbox(cli: Cli, tmp_path: Path) -> None:
    # --no-scale: its two oracle benches (eight episodes, each with its reboot re-check) were
    # a quarter of an hour; --jobs 2's behaviour is tested in test_scale.py. The oracle's three
    # episodes run copies of the published specs without the re-check, read where perf reads
    # scenarios ($ROOTBENCH_SPECS): the figures' arithmetic is the test, not the reboot's cost.
    specs = quick_specs(tmp_path / "specs", PUBLISHED, "perf's figures")
    r = cli("-q", "perf", "--format", "json", "--no-model", "--no-verify", "--no-scale", timeout=1800,
            env={"ROOTBENCH_SPECS": str(specs)})
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)  # one JSON document
    # Three restored sandboxes, twenty commands each: the median is over all sixty
    # (it used to be over the last sandbox's twenty only).
    assert figures["command_rtt_samples"] == 60
    assert figures["command_rtt_ms"] > 0 and figures["restore_ready_s"] > 0
    assert figures["replay_cassettes"] >= 35
    assert "jobs2_speedup" not in figures  # --no-scale
    # A restored QEMU's private memory is a part of its resident memory.
    assert 0 < figures["qemu_private_mib"] <= figures["vm_rss_mib"]
    assert 0 < figures["qemu_private_cold_mib"] <= figures["qemu_rss_cold_mib"]
    # The ratios the targets are set on come from figures of the same run.
    assert figures["qemu_floor_s"] > 0 and figures["guest_spawn_ms"] > 0
    assert figures["restore_floor_ratio"] == round(figures["restore_ready_s"] / figures["qemu_floor_s"], 2)
    # The restore in two parts that add up: QEMU's side and the guest's wake.
    assert 0 < figures["restore_wake_s"] < figures["restore_ready_s"]
    assert figures["restore_qemu_s"] > 0
    assert figures["restore_qemu_floor_ratio"] == round(figures["restore_qemu_s"] / figures["qemu_floor_s"], 2)
    assert figures["guest_daemon_reload_ms"] > 0
    assert figures["rtt_spawn_ratio"] == round(figures["command_rtt_ms"] / figures["guest_spawn_ms"], 2)
    # The oracle passes the three published scenarios, and the dominant phase is one of the six.
    assert figures["oracle_passes"] == 3 and figures["oracle_episode_s"] > 0
    assert set(figures["oracle_phases_s"]) == set(PHASES)
    assert figures["oracle_dominant_phase"].split(" ")[0] in PHASES
    assert "verify_suite_s" not in figures  # --no-verify
    print(json.dumps(figures, indent=1, sort_keys=True))  # the figures, for docs/performance.md (with -s)
