"""The agent loop's guardrails, on a real VM with a scripted agent."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.backends.sandbox import Sandbox
from runner.core.cassette import Cassette, CassetteWriter
from runner.core.clock import Clock
from runner.core.episode import run_episode
from runner.core.model import ScriptedModel
from runner.core.outcomes import AgentKind
from runner.core.paths import repo_root
from runner.core.protocol import get_protocol
from runner.core.recording import RecordingGuest, RecordingModel
from runner.core.spec import load_spec, scenario_to_dict

pytestmark = pytest.mark.vm


def test_a_repeated_command_gets_a_note_and_is_counted(tmp_path: Path) -> None:
    scenario = load_spec(repo_root() / "specs" / "rogue-port-80.yaml")
    agent = ScriptedModel(AgentKind.MODEL, ["systemctl is-active nginx"] * 3 + ["ss -ltn"], "gave up")
    path = tmp_path / "c.jsonl"
    with Sandbox(scenario.image, accel="tcg") as box, CassetteWriter(path) as writer:
        writer.write({"type": "header", "format": 1, "model": agent.fingerprint(),
                      "scenario": scenario_to_dict(scenario)})
        ep = run_episode(scenario, RecordingGuest(box.guest, writer), RecordingModel(agent, writer),
                         get_protocol("tools"), Clock(writer), writer)
    assert (ep.commands, ep.repeats, ep.verdict) == (4, 2, "fail"), ep.reason
    seen = [e["request"]["last"].get("content") or "" for e in Cassette.load(path).events
            if e["type"] == "model"]
    # What the model saw after each command (the request of the next turn ends with it).
    after = seen[1:]
    assert "exact command" not in after[0]
    assert "run this exact command 2 times" in after[1]
    assert "run this exact command 3 times" in after[2]
    assert "exact command" not in after[3]
