"""Graded scores on real VMs: fix tracking and its replay, and the hint ladder climbing for noop
and not for the oracle.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import quick_specs

from runner.app.agents import AgentChoice
from runner.app.bench import run_bench
from runner.app.episodes import RunOptions, run_one
from runner.app.replay import replay_one
from runner.core.cassette import Cassette
from runner.core.model import oracle
from runner.core.outcomes import AgentKind, Verdict
from runner.core.protocol import get_protocol
from runner.core.spec import (
    load_spec,
)


@pytest.mark.vm
def test_fix_tracking_on_a_real_vm_and_its_replay(tmp_path: Path) -> None:
    """The oracle fixes it with its last command; tracking says so, and replay says the same."""
    specs = quick_specs(tmp_path / "specs", ["rogue-port-80"], "fix tracking")
    s = load_spec(specs / "rogue-port-80.yaml")
    model = oracle(list(s.solution))
    cassette = tmp_path / "rogue-port-80.jsonl"
    ep = run_one(s, model, get_protocol("tools"), "test", RunOptions(track_fix=True), cassette)
    assert ep.verdict is Verdict.PASS, ep.reason
    assert ep.fixed_at is not None and ep.fixed_at["turn"] == len(s.solution)
    assert ep.regressed is False and ep.score == 1.0
    out = replay_one(cassette, offline=True, specs=[specs])
    assert out.same, out.note
    assert out.episode is not None and out.episode.fixed_at == ep.fixed_at


@pytest.mark.vm
def test_the_ladder_on_real_vms_climbs_for_noop_and_not_for_the_oracle(tmp_path: Path) -> None:
    # The suite's spec with two hints of this test's own (in place of its three), without the
    # reboot re-check (the ladder is the subject).
    specs = quick_specs(tmp_path / "specs", ["nginx-stopped"], "the hint ladder")
    text = (specs / "nginx-stopped.yaml").read_text().split("\nhints:")[0]
    lasting = (specs / "nginx-stopped.yaml").read_text().split("\nlasting:")[1]
    (specs / "nginx-stopped.yaml").write_text(
        text + "\nhints:\n  - Something is not running.\n  - systemctl start nginx\nlasting:" + lasting)
    s = load_spec(specs / "nginx-stopped.yaml")
    opts = RunOptions(ladder=True, track_fix=False)
    eps = run_bench([s], AgentChoice(kind=AgentKind.NOOP), opts, tmp_path / "noop")
    assert [(e.hint_level, e.verdict) for e in eps] == [(0, Verdict.FAIL), (1, Verdict.FAIL),
                                                        (2, Verdict.FAIL)]
    assert sorted(p.name for p in (tmp_path / "noop" / "cassettes").iterdir()) == [
        "nginx-stopped.r0.h1.jsonl", "nginx-stopped.r0.h2.jsonl", "nginx-stopped.r0.jsonl"]
    h2 = Cassette.load(tmp_path / "noop" / "cassettes" / "nginx-stopped.r0.h2.jsonl")
    assert h2.header["hint_level"] == 2
    assert replay_one(h2.path, offline=True, specs=[specs]).same  # not the checkout's spec
    eps = run_bench([s], AgentChoice(kind=AgentKind.ORACLE), opts, tmp_path / "oracle")
    assert [(e.hint_level, e.verdict) for e in eps] == [(0, Verdict.PASS)]
