"""Model servers that misbehave (real HTTP servers on loopback), against real VMs: context
overflow, a model slower than the budget, a broken server.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from badserver import bad_server

from runner.backends.openai import OpenAIModel

KEY = "sk-rootbench-test-secret-9876"


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def _episode_against(script: list[str], path: Path, seconds: int | None = None) -> tuple[Any, Any]:
    """rogue-port-80 on a real VM, the json protocol, the model a misbehaving loopback server."""
    from runner.backends.sandbox import Sandbox
    from runner.core.cassette import CassetteWriter
    from runner.core.clock import Clock
    from runner.core.episode import run_episode
    from runner.core.paths import repo_root
    from runner.core.protocol import get_protocol
    from runner.core.recording import RecordingGuest, RecordingModel
    from runner.core.rules import CURRENT_RULES
    from runner.core.spec import load_spec, scenario_to_dict

    scenario = load_spec(repo_root() / "specs" / "rogue-port-80.yaml")
    if seconds is not None:
        scenario = dataclasses.replace(scenario, budget=dataclasses.replace(scenario.budget,
                                                                            seconds=seconds))
    with bad_server(script) as (url, state), Sandbox(scenario.image, accel="tcg") as box, \
            CassetteWriter(path) as writer:
        model = OpenAIModel(url, "test-model", retries=1)
        writer.write({"type": "header", "format": 1, "model": model.fingerprint(),
                      "scenario": scenario_to_dict(scenario), "protocol": {"name": "json"},
                      "rules": int(CURRENT_RULES)})  # run_episode's default: replay must match
        ep = run_episode(scenario, RecordingGuest(box.guest, writer),
                         RecordingModel(model, writer), get_protocol("json"),
                         Clock(writer), writer)
    return ep, state


@pytest.mark.vm
def test_context_overflow_ends_the_run_and_the_machine_is_judged(tmp_path: Path) -> None:
    from runner.app.replay import replay_one

    path = tmp_path / "c.jsonl"
    ep, _state = _episode_against(["context-full"], path)
    assert (ep.verdict, ep.stop, ep.flags) == ("fail", "context", ["context-full"]), ep.reason
    assert ep.probes, "the machine is judged after the context runs out"
    again = replay_one(path, offline=True)
    assert again.same and again.replayed == "fail [context-full]", again


@pytest.mark.vm
def test_a_model_slower_than_the_scenario_budget_runs_out_of_time(tmp_path: Path) -> None:
    from runner.app.replay import replay_one

    path = tmp_path / "c.jsonl"
    ep, _state = _episode_against(["stall"] * 3, path, seconds=12)
    assert (ep.verdict, ep.stop) == ("fail", "seconds"), ep.reason
    again = replay_one(path, offline=True)
    assert again.same, again


@pytest.mark.vm
def test_episode_against_a_broken_server_is_infra_error(tmp_path: Path) -> None:
    from runner.core.cassette import Cassette

    path = tmp_path / "c.jsonl"
    ep, state = _episode_against(["500"], path)
    assert ep.verdict == "infra-error", ep.reason
    assert "\n" not in ep.reason and "HTTP 500" in ep.reason
    assert len(state.requests) == 2 and state.headers[0]["Authorization"] == f"Bearer {KEY}"
    cas = Cassette.load(path)
    assert cas.verdict and cas.verdict["verdict"] == "infra-error"
    assert any(e["type"] == "model-error" for e in cas.events)
    assert KEY not in path.read_text()
