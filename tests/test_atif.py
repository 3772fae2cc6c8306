"""ATIF export: every committed cassette becomes a trajectory.json that Harbor's RFC (ATIF-v1.4) accepts."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from runner.app.atif import SCHEMA_VERSION, export
from runner.app.cli import main
from runner.core.paths import repo_root

RECORDINGS = repo_root() / "recordings"
SCHEMA = json.loads((repo_root() / "schema" / "atif.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
# Three real-model runs recorded before the published specs had hints: a fixed, small set.
LIVE_JSON = RECORDINGS / "archive" / "2026-12-03-before-hints" / "qwen2.5-coder-1.5b-json"


def _rfc_errors(doc: dict) -> list[str]:
    """The schema's verdict plus the two RFC rules a JSON Schema cannot state."""
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]
    ids = [s.get("step_id") for s in doc.get("steps", [])]
    if ids != list(range(1, len(ids) + 1)):
        errors.append(f"step_ids are not 1..n in order: {ids}")
    for step in doc.get("steps", []):
        calls = {c["tool_call_id"] for c in step.get("tool_calls", [])}
        for r in step.get("observation", {}).get("results", []):
            if r.get("source_call_id") is not None and r["source_call_id"] not in calls:
                errors.append(f"step {step['step_id']}: source_call_id {r['source_call_id']!r} "
                              "names no tool call of its step")
    return errors


def test_every_committed_cassette_exports_to_valid_atif(tmp_path: Path) -> None:
    cassettes = sorted(RECORDINGS.rglob("*.jsonl"))
    written = export(cassettes, tmp_path / "out")
    assert len(written) == len(cassettes) == len({p.parent for p in written})
    for path in written:
        doc = json.loads(path.read_text())
        assert _rfc_errors(doc) == [], path
        assert doc["schema_version"] == SCHEMA_VERSION == "ATIF-v1.4"
        assert [s["source"] for s in doc["steps"][:2]] == ["system", "user"]
        agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
        fm = doc["final_metrics"]
        assert fm["total_steps"] == len(doc["steps"])
        assert fm["total_prompt_tokens"] == sum(s.get("metrics", {}).get("prompt_tokens", 0)
                                                for s in agent_steps)
        episode = doc["extra"]["rootbench"]["episode"]
        # One agent step per model reply: exactly the turns the episode counted.
        assert len(agent_steps) == episode["turns"]
        assert fm["total_prompt_tokens"] == episode["tokens_in"]
        assert "\x1b" not in path.read_text()


def test_a_json_protocol_turn_maps_to_a_tool_call_and_its_observation(tmp_path: Path) -> None:
    [path] = export([LIVE_JSON / "rogue-port-80.r0.jsonl"], tmp_path)
    doc = json.loads(path.read_text())
    assert doc["agent"]["name"] == "rootbench" and doc["agent"]["model_name"] == "qwen2.5-coder-1.5b"
    assert doc["agent"]["extra"]["agent"] == "model"  # the cassette's old spelling "openai", as today
    system, user, first = doc["steps"][:3]
    assert "experienced Linux system administrator" in system["message"]
    assert system["extra"]["system_prompt"].startswith("exactly as sent")
    assert user["message"].startswith("Users report the website on this server is down.")
    assert first["reasoning_content"] == ("The website is down, so we need to check the server's "
                                          "status and logs.")
    [call] = first["tool_calls"]
    assert (call["function_name"], call["arguments"]) == ("run_command", {"command": "systemctl --failed"})
    [result] = first["observation"]["results"]
    assert result["source_call_id"] == call["tool_call_id"]
    # The observation is the very message the model was sent next, budget line and all.
    assert result["content"].startswith("exit code 0\n  UNIT")
    assert result["content"].endswith("[You have 9 turns and 589 seconds left.]")
    assert first["metrics"] == {"prompt_tokens": 243, "completion_tokens": 39, "cached_tokens": 0,
                                "extra": {"prompt_ms": 5334.848, "generation_ms": 3988.215,
                                          "model_seconds": 9.336}}
    assert doc["extra"]["rootbench"]["episode"]["verdict"] == "fail"


def test_the_oracle_finish_is_a_tool_call(tmp_path: Path) -> None:
    [path] = export([RECORDINGS / "oracle" / "rogue-port-80.jsonl"], tmp_path)
    steps = json.loads(path.read_text())["steps"]
    calls = [(c["function_name"], c["arguments"]) for s in steps for c in s.get("tool_calls", [])]
    assert calls == [("run_command", {"command": "fuser -k 80/tcp"}),
                     ("run_command", {"command": "systemctl start nginx"}),
                     ("finish", {"summary": "applied the reference solution"})]
    assert all("metrics" not in s for s in steps)  # the oracle spends no tokens


def test_the_schema_is_not_vacuous() -> None:
    doc = json.loads(json.dumps({
        "schema_version": "ATIF-v1.4", "session_id": "s", "agent": {"name": "a", "version": "1"},
        "steps": [{"step_id": 1, "source": "user", "message": "hi"},
                  {"step_id": 2, "source": "agent", "message": "",
                   "tool_calls": [{"tool_call_id": "c1", "function_name": "f", "arguments": {}}],
                   "observation": {"results": [{"source_call_id": "c1", "content": "ok"}]}}]}))
    assert _rfc_errors(doc) == []
    broken = {
        "no schema_version": lambda d: d.pop("schema_version"),
        "no session_id": lambda d: d.pop("session_id"),
        "agent without version": lambda d: d["agent"].pop("version"),
        "a step without source": lambda d: d["steps"][0].pop("source"),
        "an unknown source": lambda d: d["steps"][0].update(source="tool"),
        "a tool call without function_name": lambda d: d["steps"][1]["tool_calls"][0].pop("function_name"),
        "arguments not an object": lambda d: d["steps"][1]["tool_calls"][0].update(arguments="x"),
        "tool calls on a user step": lambda d: d["steps"][0].update(tool_calls=[]),
        "a field the RFC lacks": lambda d: d["steps"][1]["observation"]["results"][0].update(extra={}),
        "steps out of order": lambda d: d["steps"][1].update(step_id=3),
        "a dangling source_call_id": lambda d: d["steps"][1]["observation"]["results"][0].update(
            source_call_id="c9"),
    }
    for what, spoil in broken.items():
        bad = copy.deepcopy(doc)
        spoil(bad)
        assert _rfc_errors(bad), f"{what} was accepted"


def test_cli_export_of_a_run_directory_defaults_to_its_atif_folder(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(LIVE_JSON, run / "cassettes")
    assert main(["-q", "export", "--format", "atif", str(run)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(run / "atif" / f"{p.stem}" / "trajectory.json")
                       for p in sorted(LIVE_JSON.glob("*.jsonl"))]
    assert all(_rfc_errors(json.loads(Path(p).read_text())) == [] for p in printed)


def test_cli_export_of_a_broken_cassette_is_one_line_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = LIVE_JSON / "rogue-port-80.r0.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "guest"}\n')
    assert main(["-q", "export", str(good), str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
