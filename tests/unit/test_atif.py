"""ATIF export: every committed cassette becomes a Harbor trial folder whose agent/trajectory.json
Harbor's RFC (ATIF-v1.4) accepts, with step timestamps from the cassette's clock, the reward where
Harbor reads it (verifier/reward.txt, reward.json) and no path of the machine that ran it."""

from __future__ import annotations

import copy
import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
from conftest import Cli

from runner.app.atif import SCHEMA_VERSION, export
from runner.core.cassette import Cassette
from runner.core.paths import repo_root

RECORDINGS = repo_root() / "recordings"
SCHEMA = json.loads((repo_root() / "schema" / "atif.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
# Three real-model runs recorded before the published specs had hints: a fixed, small set.
LIVE_JSON = RECORDINGS / "archive" / "2026-12-03-before-hints" / "qwen2.5-coder-1.5b-json"


def _rfc_errors(doc: dict[str, Any]) -> list[str]:
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
        # Every step is timed (ISO 8601, UTC), in order, within the run.
        times = [dt.datetime.fromisoformat(s["timestamp"]) for s in doc["steps"]]
        assert times == sorted(times) and all(t.utcoffset() == dt.timedelta(0) for t in times)
        start = dt.datetime.fromisoformat(doc["extra"]["rootbench"]["started_at"])
        assert start <= times[0] and times[-1] <= start + dt.timedelta(
            seconds=episode["seconds"] + 1)


def test_step_timestamps_are_the_header_start_plus_the_cassette_clock(tmp_path: Path) -> None:
    cassette = LIVE_JSON / "rogue-port-80.r0.jsonl"
    [path] = export([cassette], tmp_path)
    steps = json.loads(path.read_text())["steps"]
    events = Cassette.load(cassette).events
    start = dt.datetime.fromisoformat(events[0]["started_at"])
    clocks = [e["t"] for e in events if e["type"] == "clock"]
    # The first agent step: the first clock reading after the first model reply.
    i = next(n for n, e in enumerate(events) if e["type"] == "model")
    reply_t = next(e["t"] for e in events[i:] if e["type"] == "clock")
    expected = start + dt.timedelta(seconds=reply_t)
    assert dt.datetime.fromisoformat(steps[2]["timestamp"]) == expected.replace(
        microsecond=expected.microsecond // 1000 * 1000)
    assert steps[2]["timestamp"].endswith("Z")
    first = start + dt.timedelta(seconds=clocks[0])
    assert dt.datetime.fromisoformat(steps[0]["timestamp"]) == first.replace(
        microsecond=first.microsecond // 1000 * 1000) == dt.datetime.fromisoformat(
        steps[1]["timestamp"])


def test_the_verdict_and_score_are_where_harbor_reads_a_trials_reward(tmp_path: Path) -> None:
    archive = RECORDINGS / "archive" / "2026-12-04-before-validity" / "qwen2.5-coder-1.5b-json"
    export([archive / "ssh-stopped.r0.jsonl", archive / "rogue-port-80.r0.jsonl"], tmp_path)
    passed, failed = tmp_path / "ssh-stopped.r0" / "verifier", tmp_path / "rogue-port-80.r0" / "verifier"
    assert (passed / "reward.txt").read_text() == "1\n"
    assert json.loads((passed / "reward.json").read_text()) == {
        "reward": 1.0, "repair": 1.0, "score": 1.0, "milestones": 1.0}
    assert (failed / "reward.txt").read_text() == "0\n"
    failed_doc = json.loads((failed / "reward.json").read_text())
    assert failed_doc["reward"] == 0.0 and 0 <= failed_doc["score"] < 1
    assert all(isinstance(v, float) for v in failed_doc.values())  # Harbor: a flat map of numbers
    # A cassette cut short has no verdict: no reward file, as a trial whose verifier wrote none.
    cut = tmp_path / "cut" / "ssh-stopped.r0.jsonl"
    cut.parent.mkdir()
    cut.write_text("".join((archive / "ssh-stopped.r0.jsonl").read_text().splitlines(True)[:-1]))
    export([cut], tmp_path / "out")
    assert (tmp_path / "out" / "ssh-stopped.r0" / "agent" / "trajectory.json").is_file()
    assert not (tmp_path / "out" / "ssh-stopped.r0" / "verifier").exists()


def test_no_local_path_of_the_recording_or_exporting_machine_is_exported(tmp_path: Path) -> None:
    """Verdict lines record where the bench kept the cassette (/work/main/runs/..., /tmp/...),
    headers the spec file it read: neither, nor where the export read or wrote, is in an export."""
    local: set[str] = {str(tmp_path), str(RECORDINGS.resolve())}
    for cassette in RECORDINGS.rglob("*.jsonl"):
        cas = Cassette.load(cassette)
        local.add(str(cassette.resolve().parent))
        for recorded in ((cas.verdict or {}).get("cassette"), cas.header["scenario"].get("path")):
            if isinstance(recorded, str) and recorded.startswith("/"):
                local.add(str(Path(recorded).parent))
    assert any(p.startswith("/work/main/runs/") for p in local)  # the leak this guards against
    export([RECORDINGS.resolve()], tmp_path / "out")
    for path in (tmp_path / "out").rglob("*.json"):
        text = path.read_text()
        leaked = [p for p in local if p in text]
        assert leaked == [], path
    # Named relative to the folder exported: here the run-like folder holding it.
    archive = RECORDINGS / "archive" / "2026-12-04-before-validity"
    export([archive.resolve()], tmp_path / "one")
    doc = json.loads((tmp_path / "one" / "ssh-stopped.r0" / "agent" / "trajectory.json").read_text())
    cassette = doc["extra"]["rootbench"]["cassette"]
    assert cassette in ("qwen2.5-coder-1.5b-json/ssh-stopped.r0.jsonl",
                        "qwen2.5-coder-0.5b-json/ssh-stopped.r0.jsonl")
    assert doc["extra"]["rootbench"]["episode"]["cassette"] == cassette


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
                                                                    cli: Cli) -> None:
    run = tmp_path / "run"
    shutil.copytree(LIVE_JSON, run / "cassettes")
    r = cli("-q", "export", "--format", "atif", str(run))
    assert r.returncode == 0, r.stderr
    printed = r.stdout.split()
    assert printed == [str(run / "atif" / f"{p.stem}" / "agent" / "trajectory.json")
                       for p in sorted(LIVE_JSON.glob("*.jsonl"))]
    assert all(_rfc_errors(json.loads(Path(p).read_text())) == [] for p in printed)


def test_cli_export_of_a_broken_cassette_is_one_line_and_writes_nothing(
        tmp_path: Path, cli: Cli) -> None:
    good = LIVE_JSON / "rogue-port-80.r0.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "guest"}\n')
    r = cli("-q", "export", str(good), str(bad), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    err = r.stderr
    assert "bad.jsonl" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_repair_score_unsafe_fix_and_references_are_in_the_final_metrics(
        tmp_path: Path) -> None:
    live = RECORDINGS / "live" / "qwen2.5-coder-1.5b-json"
    # ssh-stopped: the 1.5B fixed it unaided; tls-clock-far-off: it repaired nothing of it
    (fixed,) = export([live / "ssh-stopped.r0.jsonl"], tmp_path / "a")
    (nothing,) = export([live / "tls-clock-far-off.r0.jsonl"], tmp_path / "b")
    extra = json.loads(fixed.read_text())["final_metrics"]["extra"]
    assert extra["repair"] == 1.0
    assert extra["unsafe_fix"] is None  # recorded under rules 2: not judged, never a false
    # beside it, what the committed noop and oracle runs of the same scenario got
    assert extra["reference"]["noop"]["repair"] == 0.0 and extra["reference"]["noop"]["score"] > 0
    assert extra["reference"]["oracle"] == {"repair": 1.0, "score": 1.0}
    other = json.loads(nothing.read_text())
    assert other["final_metrics"]["extra"]["repair"] == 0.0
    # the old score of that run is what doing nothing scores: the repair says it repaired nothing
    assert other["extra"]["rootbench"]["episode"]["score"] == \
        other["final_metrics"]["extra"]["reference"]["noop"]["score"] > 0
    assert json.loads((nothing.parent.parent / "verifier" / "reward.json").read_text())[
        "repair"] == 0.0
    assert _rfc_errors(other) == []
    # a judged run (rules 3) that fixed the symptom leaving a finding: an unsafe fix
    lines = (live / "ssh-stopped.r0.jsonl").read_text().splitlines()
    verdict = json.loads(lines[-1])
    verdict.update(symptom_fixed=True, flags=["left-behind"], findings=[
        {"check": "process", "item": "sleep 1000", "detail": "started by the agent",
         "severity": "flag", "source": "the guest helper's /proc"}])
    judged = tmp_path / "judged" / "ssh-stopped.r0.jsonl"
    judged.parent.mkdir()
    judged.write_text("\n".join([*lines[:-1], json.dumps(verdict)]) + "\n")
    (path,) = export([judged], tmp_path / "c")
    assert json.loads(path.read_text())["final_metrics"]["extra"]["unsafe_fix"] is True
