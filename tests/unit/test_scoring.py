"""Results that tell models apart: hints, milestones, weighted scores, fix tracking, the ladder.

Everything but the last tests runs offline: a small in-memory guest whose
state is a set of flags (``touch X`` sets one, ``rm X`` clears it, the probe
``test -e X`` checks it) drives the real episode loop, recorder and replayer.
"""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli
from flag_guest import FlagGuest

from runner.app import bench as bench_mod
from runner.app import episodes as episodes_mod
from runner.app import html_report
from runner.app.agents import AgentChoice
from runner.app.bench import run_bench
from runner.app.episodes import RunOptions, header
from runner.app.replay import replay_one
from runner.app.report import GRADED_COLUMNS, render_table
from runner.app.stats import assists
from runner.core import layout
from runner.core.cassette import Cassette, CassetteWriter
from runner.core.cassette_header import FORMAT_VERSION
from runner.core.clock import Clock
from runner.core.episode import (
    GRADED_FIELDS,
    Episode,
    run_episode,
)
from runner.core.errors import GuestDown, InvalidInput
from runner.core.guest import CommandResult, RebootResult
from runner.core.lasting import UPTIME_COMMAND
from runner.core.model import ChatRequest, ModelReply, ScriptedModel, oracle
from runner.core.outcomes import AgentKind, ProbeOutcome, Recheck, Verdict
from runner.core.paths import repo_root
from runner.core.probes import ProbeResult
from runner.core.protocol import get_protocol
from runner.core.record import weighted_score
from runner.core.recording import RecordingGuest, RecordingModel
from runner.core.rules import CURRENT_RULES, Rules
from runner.core.spec import (
    HINTS_HEADING,
    load_spec,
    scenario_from_dict,
    scenario_to_dict,
    task_text,
)

SPEC = textwrap.dedent("""\
    id: flags
    title: Two flags must be set
    image: debian-12-nginx
    task: Set the flags.
    setup: [rm -f a b]
    hints:
      - Look at the flags.
      - Flag a matters most.
      - touch a and touch b.
    milestones:
      - name: listed the flags
        command_matches: '^ls\\b'
      - name: saw the missing flag
        output_contains: 'a is missing'
    probes:
      - name: flag a
        command: {run: test -e a}
        weight: 3
      - name: flag b
        command: {run: test -e b}
    solution: [touch a, touch b]
""")


class TaskSpy(ScriptedModel):
    """The oracle, remembering the task text it was sent."""

    def __init__(self, commands: list[str]) -> None:
        super().__init__(AgentKind.ORACLE, commands, "done")
        self.task = ""

    def complete(self, request: Any, timeout: float) -> Any:
        if not self.task:
            self.task = request.messages[1]["content"]
        return super().complete(request, timeout)


def _spec(tmp_path: Path, text: str = SPEC) -> Path:
    path = tmp_path / "flags.yaml"
    path.write_text(text)
    return path


def _run(tmp_path: Path, commands: list[str], *, hint_level: int = 0, track_fix: bool = False,
         record: Path | None = None) -> Episode:
    scenario = load_spec(_spec(tmp_path))
    model = ScriptedModel(AgentKind.ORACLE, commands, "done")
    protocol = get_protocol("tools")
    if record is None:
        return run_episode(scenario, FlagGuest(), model, protocol, Clock(), None,
                           hint_level=hint_level, track_fix=track_fix)
    opts = RunOptions(track_fix=track_fix)
    with CassetteWriter(record) as writer:
        writer.write(header(scenario, model, protocol, "test", opts, 0, {}, hint_level=hint_level))
        return run_episode(scenario, RecordingGuest(FlagGuest(), writer),
                           RecordingModel(model, writer), protocol, Clock(writer), writer,
                           hint_level=hint_level, track_fix=track_fix)


# --- the scenario format ------------------------------------------------------------------------

def test_hints_milestones_and_weights_load(tmp_path: Path) -> None:
    s = load_spec(_spec(tmp_path))
    assert s.hints == ("Look at the flags.", "Flag a matters most.", "touch a and touch b.")
    assert [m.name for m in s.milestones] == ["listed the flags", "saw the missing flag"]
    assert [p.weight for p in s.probes] == [3.0, 1.0]


@pytest.mark.parametrize(("milestone", "field", "line"), [
    ("{name: x, command_matches: '(?<=a)b'}", "milestones[0].command_matches", 11),
    ("{name: x}", "milestones[0]", 11),
    ("{name: x, output_contains: ''}", "milestones[0].output_contains", 11),
    ("{name: x, output_contains: y, extra: 1}", "milestones[0]", 11),
])
def test_a_bad_milestone_is_refused_with_file_line_and_field(tmp_path: Path, milestone: str,
                                                             field: str, line: int) -> None:
    old = "milestones:\n  - name: listed the flags\n    command_matches: '^ls\\b'\n"
    assert old in SPEC
    path = _spec(tmp_path, SPEC.replace(old, f"milestones:\n  - {milestone}\n"))
    with pytest.raises(InvalidInput) as info:
        load_spec(path)
    assert info.value.field == field
    assert str(info.value).startswith(f"{path}:{line}: {field}:"), str(info.value)


@pytest.mark.parametrize("bad", ["weight: 0", "weight: -1", "weight: heavy"])
def test_a_bad_weight_is_refused(tmp_path: Path, bad: str) -> None:
    path = _spec(tmp_path, SPEC.replace("weight: 3", bad))
    with pytest.raises(InvalidInput) as info:
        load_spec(path)
    assert info.value.field == "probes[0].weight"


def test_empty_hints_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as info:
        load_spec(_spec(tmp_path, SPEC.replace("  - Look at the flags.", "  - ''")))
    assert info.value.field == "hints[0]"


def test_a_spec_without_the_new_fields_serialises_as_before(tmp_path: Path) -> None:
    """No hints, milestones or weight keys: old cassette headers and new ones read the same."""
    plain = SPEC.split("hints:")[0] + "probes:" + SPEC.split("probes:")[1].replace(
        "    weight: 3\n", "")
    d = scenario_to_dict(load_spec(_spec(tmp_path, plain)))
    assert "hints" not in d and "milestones" not in d
    assert all("weight" not in p for p in d["probes"] + d["invariants"])
    # Recorded before specs had hints: the keys such a header has, no more.
    recorded = Cassette.load(repo_root() / "recordings" / "archive" / "2026-12-03-before-hints"
                             / "qwen2.5-coder-1.5b-json" / "rogue-port-80.r0.jsonl")
    scenario = recorded.header["scenario"]
    # ... and the judged hash every header has carried since 2026-12-07 (verify's proofs)
    assert set(d) == set(scenario) | {"judged_hash"} and len(d["judged_hash"]) == 64
    again = scenario_to_dict(scenario_from_dict(scenario))
    assert json.dumps(again, sort_keys=True) == json.dumps(scenario, sort_keys=True)


def test_the_new_fields_round_trip_through_a_header(tmp_path: Path) -> None:
    s = load_spec(_spec(tmp_path))
    d = json.loads(json.dumps(scenario_to_dict(s)))
    assert d["hints"] == list(s.hints) and d["probes"][0]["weight"] == 3.0
    assert d["milestones"][0] == {"name": "listed the flags", "command_matches": "^ls\\b"}
    assert scenario_from_dict(d) == s


def test_a_damaged_milestone_in_a_header_is_invalid_input(tmp_path: Path) -> None:
    d = scenario_to_dict(load_spec(_spec(tmp_path)))
    d["milestones"] = [{"name": "x"}]
    with pytest.raises(InvalidInput, match="milestone"):
        scenario_from_dict(d)


# --- hints ----------------------------------------------------------------------------------------

def test_hint_text_at_each_level(tmp_path: Path) -> None:
    s = load_spec(_spec(tmp_path))
    assert task_text(s, 0) == "Set the flags."
    assert task_text(s, 1) == f"Set the flags.\n\n{HINTS_HEADING}\n- Look at the flags."
    assert task_text(s, 3) == ("Set the flags.\n\nHints:\n- Look at the flags.\n"
                               "- Flag a matters most.\n- touch a and touch b.")
    with pytest.raises(ValueError, match="out of range"):
        task_text(s, 4)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_the_model_is_sent_the_task_with_its_hints(tmp_path: Path, level: int) -> None:
    s = load_spec(_spec(tmp_path))
    model = TaskSpy(["touch a", "touch b"])
    ep = run_episode(s, FlagGuest(), model, get_protocol("tools"), Clock(), None, hint_level=level)
    assert model.task == task_text(s, level) and ep.hint_level == level
    assert model.task.count("\n- ") == level


# --- score and milestones -------------------------------------------------------------------------

def _results(*outcomes: ProbeOutcome) -> list[ProbeResult]:
    return [ProbeResult(f"p{i}", "command", o, "") for i, o in enumerate(outcomes)]


def test_weighted_score(tmp_path: Path) -> None:
    probes = load_spec(_spec(tmp_path)).probes
    P, F = ProbeOutcome.PASS, ProbeOutcome.FAIL
    assert weighted_score(probes, _results(P, P)) == 1.0
    assert weighted_score(probes, _results(P, F)) == 0.75
    assert weighted_score(probes, _results(F, P)) == 0.25
    assert weighted_score(probes, _results(F, F)) == 0.0


@pytest.mark.parametrize(("commands", "verdict", "score"), [
    (["touch a", "touch b"], Verdict.PASS, 1.0),
    (["touch a"], Verdict.FAIL, 0.75),
    (["touch b"], Verdict.FAIL, 0.25),
    ([], Verdict.FAIL, 0.0),
])
def test_a_run_is_scored_by_weight(tmp_path: Path, commands: list[str], verdict: Verdict,
                                   score: float) -> None:
    ep = _run(tmp_path, commands)
    assert (ep.verdict, ep.score) == (verdict, score)


def test_an_unscored_run_has_no_score(tmp_path: Path) -> None:
    # setup leaves flag a, and "solution" irrelevant: the fault did not land when both are set.
    text = SPEC.replace("setup: [rm -f a b]", "setup: [touch a b]")
    s = load_spec(_spec(tmp_path, text))
    ep = run_episode(s, FlagGuest(), oracle([]), get_protocol("tools"), Clock(), None)
    assert ep.verdict is Verdict.INVALID_SCENARIO
    assert ep.score is None and ep.milestone_fraction is None


def test_milestones_from_the_transcript(tmp_path: Path) -> None:
    ep = _run(tmp_path, ["echo hello", "ls -la", "touch a", "ls"])
    assert ep.milestones == ["listed the flags", "saw the missing flag"]
    assert ep.milestone_fraction == 1.0
    ep = _run(tmp_path, ["touch a", "ls"])  # listed, but a was already there: no "missing"
    assert ep.milestones == ["listed the flags"] and ep.milestone_fraction == 0.5
    ep = _run(tmp_path, ["sudo ls"])  # the regex wants ls first
    assert ep.milestones == ["saw the missing flag"]
    assert _run(tmp_path, []).milestones == []


# --- fix tracking -------------------------------------------------------------------------------

def test_fix_tracking_finds_the_turn_it_was_fixed(tmp_path: Path) -> None:
    ep = _run(tmp_path, ["ls", "touch a", "touch b", "ls"], track_fix=True)
    assert ep.fixed_at is not None and ep.fixed_at["turn"] == 3 and ep.regressed is False
    assert _run(tmp_path, ["touch a"], track_fix=True).fixed_at is None


def test_fix_tracking_sees_a_regression(tmp_path: Path) -> None:
    ep = _run(tmp_path, ["touch a b", "rm a", "ls"], track_fix=True)
    assert ep.fixed_at is not None and ep.fixed_at["turn"] == 1
    assert ep.regressed is True and ep.verdict is Verdict.FAIL
    ep = _run(tmp_path, ["touch a b", "rm a", "touch a"], track_fix=True)  # broke, fixed again
    assert ep.verdict is Verdict.PASS and ep.regressed is True
    assert ep.fixed_at is not None and ep.fixed_at["turn"] == 1


def test_without_tracking_there_is_nothing_to_say(tmp_path: Path) -> None:
    ep = _run(tmp_path, ["touch a", "touch b"])
    assert ep.fixed_at is None and ep.regressed is None


@pytest.mark.parametrize(("track_fix", "hint_level"), [(True, 2), (False, 0), (True, 0)])
def test_replay_follows_the_header(tmp_path: Path, track_fix: bool, hint_level: int) -> None:
    cassette = tmp_path / "flags.jsonl"
    ep = _run(tmp_path, ["ls", "touch a", "touch b"], track_fix=track_fix, hint_level=hint_level,
              record=cassette)
    head = Cassette.load(cassette).header
    assert (head["track_fix"], head["hint_level"]) == (track_fix, hint_level)
    out = replay_one(cassette, offline=True)
    assert out.same, out.note
    assert out.episode is not None
    for key in ("score", "milestones", "milestone_fraction", "fixed_at", "regressed", "hint_level"):
        assert getattr(out.episode, key) == getattr(ep, key), key


def test_a_cassette_recorded_now_is_format_2_with_every_field(tmp_path: Path) -> None:
    cassette = tmp_path / "now.jsonl"
    _run(tmp_path, ["touch a", "touch b"], record=cassette, hint_level=2, track_fix=True)
    raw = json.loads(cassette.read_text().splitlines()[0])
    assert raw["format"] == FORMAT_VERSION == 2
    head = Cassette.load(cassette).head
    assert (head.format, head.hint_level, head.track_fix, head.rules) == (2, 2, True,
                                                                          CURRENT_RULES)
    assert head.harness.name == "rootbench" and head.agent is AgentKind.ORACLE
    assert head.protocol.name == "tools" and head.started_at and head.spec_hash
    assert replay_one(cassette, offline=True).same


def test_a_header_without_the_new_fields_replays_with_level_0_and_no_tracking(
        tmp_path: Path) -> None:
    cassette = tmp_path / "flags.jsonl"
    _run(tmp_path, ["touch a", "touch b"], record=cassette)
    lines = cassette.read_text().splitlines()
    head = json.loads(lines[0])
    del head["track_fix"], head["hint_level"]
    head["format"] = 1  # a header from before the fields existed (format 2 requires them)
    cassette.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    out = replay_one(cassette, offline=True)
    assert out.same and out.episode is not None and out.episode.regressed is None


def test_a_header_with_tracking_flipped_does_not_replay(tmp_path: Path) -> None:
    cassette = tmp_path / "flags.jsonl"
    _run(tmp_path, ["touch a", "touch b"], record=cassette, track_fix=True)
    lines = cassette.read_text().splitlines()
    head = json.loads(lines[0])
    head["track_fix"] = False
    cassette.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    assert replay_one(cassette, offline=True).result.value == "mismatch"


def test_a_header_hint_level_beyond_the_hints_is_unreadable(tmp_path: Path) -> None:
    cassette = tmp_path / "flags.jsonl"
    _run(tmp_path, ["touch a", "touch b"], record=cassette)
    lines = cassette.read_text().splitlines()
    head = json.loads(lines[0])
    head["hint_level"] = 9
    cassette.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    with pytest.raises(InvalidInput) as info:
        replay_one(cassette, offline=True)
    assert info.value.field == "header.hint_level"


# --- across runs: the ladder --------------------------------------------------------------------

def _fake_run_one(passes_at: int) -> Any:
    """run_one without a VM: fails below ``passes_at``, passes from it on."""
    calls: list[tuple[str, int, int]] = []

    def fake(scenario: Any, model: Any, protocol: Any, reason: str, opts: RunOptions,
             cassette: Path, *, round_: int = 0, hint_level: int = 0) -> Episode:
        calls.append((scenario.id, round_, hint_level))
        verdict = Verdict.PASS if hint_level >= passes_at else Verdict.FAIL
        return Episode(scenario=scenario.id, agent=AgentKind.NOOP, model="noop", protocol="tools",
                       round=round_, hint_level=hint_level, verdict=verdict,
                       score=1.0 if verdict is Verdict.PASS else 0.0)

    fake.calls = calls  # type: ignore[attr-defined]  # the tests read what it was called with
    return fake


@pytest.mark.parametrize(("passes_at", "levels", "assist"), [
    (0, [0], 0), (1, [0, 1], 1), (3, [0, 1, 2, 3], 3), (9, [0, 1, 2, 3], None)])
def test_the_ladder_climbs_until_the_first_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                passes_at: int, levels: list[int],
                                                assist: int | None) -> None:
    fake = _fake_run_one(passes_at)
    monkeypatch.setattr(episodes_mod, "run_one", fake)  # run_job, in the driver at --jobs 1, calls it
    monkeypatch.setattr(bench_mod, "_prepare_sandboxes", lambda images, opts: None)
    s = load_spec(_spec(tmp_path))
    eps = run_bench([s], AgentChoice(kind=AgentKind.NOOP), RunOptions(ladder=True, repeat=2),
                    tmp_path / "run")
    assert fake.calls == [("flags", r, lv) for r in (0, 1) for lv in levels]
    assert [(e.round, e.hint_level) for e in eps] == [(r, lv) for r in (0, 1) for lv in levels]
    assert assists(eps) == {("flags", 0): assist, ("flags", 1): assist}
    table = render_table(eps, "plain", ladder=True)
    assert "assist" in table.splitlines()[0]
    # A resume finds every step done: nothing runs again.
    fake.calls.clear()
    run_bench([s], AgentChoice(kind=AgentKind.NOOP), RunOptions(ladder=True, repeat=2),
              tmp_path / "run", resume=True)
    assert fake.calls == []


def test_hints_k_runs_every_scenario_at_k_capped(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_run_one(9)
    monkeypatch.setattr(episodes_mod, "run_one", fake)  # run_job, in the driver at --jobs 1, calls it
    monkeypatch.setattr(bench_mod, "_prepare_sandboxes", lambda images, opts: None)
    s = load_spec(_spec(tmp_path))
    text = (repo_root() / "specs" / "rogue-port-80.yaml").read_text()
    (tmp_path / "plain").mkdir()
    no_hints = load_spec(_spec(tmp_path / "plain", text.split("hints:")[0] + "solution:"
                               + text.split("solution:")[1]))
    assert not no_hints.hints
    run_bench([s, no_hints], AgentChoice(kind=AgentKind.NOOP), RunOptions(hints=5),
              tmp_path / "run")
    assert fake.calls == [("flags", 0, 3), ("rogue-port-80", 0, 0)]


def test_cassette_names_keep_level_0_as_before(tmp_path: Path) -> None:
    s = load_spec(_spec(tmp_path))
    assert layout.cassette_name(s.id, 2) == "flags.r2.jsonl"
    assert layout.cassette_name(s.id, 2, 1) == "flags.r2.h1.jsonl"
    assert layout.cassette_path(tmp_path, s.id, 2, 1, "m-json") == \
        tmp_path / "cassettes" / "m-json" / "flags.r2.h1.jsonl"


@pytest.mark.parametrize(("name", "parsed"), [
    ("flags.r2.jsonl", ("flags", 2, 0)), ("flags.r0.h3.jsonl", ("flags", 0, 3)),
    ("rogue-port-80.r11.h10.jsonl", ("rogue-port-80", 11, 10)),
    ("rogue-port-80.jsonl", ("rogue-port-80", 0, 0)),  # verify's oracle cassette
    ("flags.noop.jsonl", None), ("flags.r0.jsonl.partial", None), ("flags.r0.h0.jsonl", None),
    (".jsonl", None), ("flags.r0.h1.json", None)])
def test_cassette_names_read_back_as_they_are_written(name: str,
                                                      parsed: tuple[str, int, int] | None) -> None:
    got = layout.parse_cassette_name(name)
    assert (None if got is None else (got.scenario, got.round, got.hint_level)) == parsed
    if got is not None and name != layout.oracle_cassette_name(got.scenario):
        assert str(got) == name  # format(parse(name)) is the name itself


def test_the_ladder_with_the_oracle_replays_committed_cassettes_and_stops_at_level_0(
        tmp_path: Path, cli: Cli) -> None:
    """No VM: the oracle passes at level 0, so the ladder never climbs to the hints these have."""
    r = cli("-q", "bench", "--agent", "oracle", "--ladder", "--only", "permission-403",
            "rogue-port-80", "--record-to", str(repo_root() / "recordings" / "oracle"),
            "--record-mode", "once", "--runs-dir", str(tmp_path), "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(e["scenario"], e["hint_level"], e["score"]) for e in out["episodes"]] == [
        ("permission-403", 0, 1.0), ("rogue-port-80", 0, 1.0)]


@pytest.mark.parametrize("argv", [["--hints", "-1"], ["--hints", "101"], ["--ladder", "--hints", "1"]])
def test_bad_hint_flags_are_refused_before_any_work(tmp_path: Path, argv: list[str],
                                                    cli: Cli) -> None:
    r = cli("bench", "--agent", "noop", *argv, "--runs-dir", str(tmp_path / "runs"))
    assert r.returncode == 2
    [line] = r.stderr.splitlines()  # one line naming the flag at fault
    assert line.startswith("rootbench: --ladder: " if "--ladder" in argv else "rootbench: --hints: "), line
    assert not (tmp_path / "runs").exists()


# --- does the fix last? (recheck_after, reboot) ------------------------------------------------

LASTING = SPEC.split("hints:")[0] + "probes:" + SPEC.split("probes:")[1]


def _lasting(tmp_path: Path, keys: str, commands: list[str], *, expires: dict[str, float] | None = None,
             record: Path | None = None, rules: Rules = CURRENT_RULES,
             guest: FlagGuest | None = None, text: str = LASTING) -> tuple[Episode, FlagGuest]:
    """The flags scenario (``text``) with the re-check ``keys`` added, run by a scripted agent."""
    scenario = load_spec(_spec(tmp_path, text + keys))
    guest = guest or FlagGuest(expires=expires)
    model = ScriptedModel(AgentKind.ORACLE, commands, "done")
    protocol = get_protocol("tools")
    if record is None:
        return run_episode(scenario, guest, model, protocol, Clock(), None, rules=rules), guest
    with CassetteWriter(record) as writer:
        writer.write(header(scenario, model, protocol, "test", RunOptions(track_fix=False), 0, {}))
        ep = run_episode(scenario, RecordingGuest(guest, writer), RecordingModel(model, writer),
                         protocol, Clock(writer), writer, rules=rules)
    return ep, guest


# Flag a "lives in /run" (a process started by hand, a remount): a reboot loses it.
IN_RUN = LASTING.replace("run: test -e a", "run: test -e run-a")


def test_the_recheck_keys_load_and_round_trip_through_a_header(tmp_path: Path) -> None:
    s = load_spec(_spec(tmp_path, LASTING + "recheck_after: 90\nreboot: true\n"))
    assert (s.recheck_after, s.reboot) == (90.0, True)
    d = json.loads(json.dumps(scenario_to_dict(s)))
    assert (d["recheck_after"], d["reboot"]) == (90.0, True)
    assert scenario_from_dict(d) == s
    plain = scenario_to_dict(load_spec(_spec(tmp_path, LASTING)))
    assert "recheck_after" not in plain and "reboot" not in plain  # old headers read back the same
    d.update(recheck_after=0)
    with pytest.raises(InvalidInput, match="recheck_after"):
        scenario_from_dict(d)


@pytest.mark.parametrize(("keys", "field"), [
    ("recheck_after: 0\n", "recheck_after"), ("recheck_after: -5\n", "recheck_after"),
    ("recheck_after: 601\n", "recheck_after"), ("recheck_after: soon\n", "recheck_after"),
    ("recheck_after: true\n", "recheck_after"), ("reboot: yes please\n", "reboot"),
    ("reboot: 1\n", "reboot"),
])
def test_bad_recheck_keys_are_refused_with_file_and_field(tmp_path: Path, keys: str,
                                                          field: str) -> None:
    path = _spec(tmp_path, LASTING + keys)
    with pytest.raises(InvalidInput) as info:
        load_spec(path)
    assert info.value.field == field and str(info.value).startswith(f"{path}:"), str(info.value)


def test_a_fix_a_reboot_loses_fails_and_the_lasting_one_passes(tmp_path: Path) -> None:
    ep, guest = _lasting(tmp_path, "reboot: true\n", ["touch run-a", "touch b"], text=IN_RUN)
    assert ep.verdict is Verdict.FAIL and guest.reboots == 1
    assert ep.reason == "did not survive a reboot: flag a"
    assert ep.failed_recheck is Recheck.REBOOT and ep.score == 0.25  # flag b still counts
    assert ep.to_dict()["failed_recheck"] == "reboot"
    assert [r["outcome"] for r in ep.probes] == ["fail", "pass"]  # the probes as re-checked
    ep, guest = _lasting(tmp_path, "reboot: true\n", ["touch a", "touch b"])
    assert ep.verdict is Verdict.PASS and guest.reboots == 1, ep.reason
    assert ep.failed_recheck is None and ep.score == 1.0 and ep.to_dict()["failed_recheck"] is None


def test_a_fix_undone_after_a_pause_fails_and_names_the_wait(tmp_path: Path) -> None:
    ep, guest = _lasting(tmp_path, "recheck_after: 1\nreboot: true\n", ["touch a", "touch b"],
                         expires={"a": 0.3})
    assert ep.verdict is Verdict.FAIL and ep.failed_recheck is Recheck.PAUSE
    assert re.fullmatch(r"did not last: flag a after [12] s", ep.reason), ep.reason
    assert guest.reboots == 0  # a failed pause re-check ends the judging
    ep, guest = _lasting(tmp_path, "recheck_after: 1\nreboot: true\n", ["touch a", "touch b"])
    assert ep.verdict is Verdict.PASS and guest.reboots == 1 and ep.failed_recheck is None


def test_a_faked_uptime_cannot_cut_the_pause_short(tmp_path: Path) -> None:
    """The guest's uptime leaps 1000 s per reading (an agent bind-mounted a FIFO over it): the
    pause still lasts the host's ``recheck_after`` and names the host's seconds."""
    class Leaping(FlagGuest):
        reads = 0

        def run_clean(self, command: str, timeout: float) -> CommandResult:
            if command == UPTIME_COMMAND:
                self.reads += 1
                return CommandResult(0, f"{self.reads * 1000}.00\n", 0.01)
            return super().run_clean(command, timeout)

    t0 = time.monotonic()
    guest = Leaping(expires={"a": 0.5})
    ep, _ = _lasting(tmp_path, "recheck_after: 1.5\n", ["touch a", "touch b"],
                     expires={"a": 0.5}, guest=guest)
    assert time.monotonic() - t0 >= 1.5 and guest.reads >= 2
    assert ep.reason.startswith("did not last: flag a after "), ep.reason
    assert 1 <= int(ep.reason.split(" after ")[1].split()[0]) < 100  # the host's, not 1000s


def test_rules_1_never_recheck(tmp_path: Path) -> None:
    ep, guest = _lasting(tmp_path, "reboot: true\n", ["touch run-a", "touch b"], text=IN_RUN,
                         rules=Rules.V1)
    assert ep.verdict is Verdict.PASS and guest.reboots == 0


def test_a_guest_that_does_not_come_back_is_an_infra_error(tmp_path: Path) -> None:
    class NoReboot(FlagGuest):
        def reboot(self, timeout: float) -> RebootResult:
            raise GuestDown("no shell on the serial console within 300s")

    ep, _ = _lasting(tmp_path, "reboot: true\n", ["touch a", "touch b"], guest=NoReboot())
    assert ep.verdict is Verdict.INFRA_ERROR and ep.failed_recheck is None
    assert ep.reason.startswith("the guest did not come back from the reboot re-check"), ep.reason


@pytest.mark.parametrize(("commands", "expires", "text", "failed"), [
    (["touch a", "touch b"], None, LASTING, None),
    (["touch a", "touch b"], {"a": 0.2}, LASTING, Recheck.PAUSE),
    (["touch run-a", "touch b"], None, IN_RUN, Recheck.REBOOT),
])
def test_rechecks_record_and_replay_offline(tmp_path: Path, commands: list[str],
                                            expires: dict[str, float] | None, text: str,
                                            failed: Recheck | None) -> None:
    cassette = tmp_path / "flags.jsonl"
    ep, _ = _lasting(tmp_path, "recheck_after: 0.5\nreboot: true\n", commands, expires=expires,
                     record=cassette, text=text)
    assert ep.failed_recheck is failed, ep.reason
    loaded = Cassette.load(cassette)  # every line valid against the cassette schema
    assert (loaded.header["scenario"]["recheck_after"], loaded.header["scenario"]["reboot"]) == (
        0.5, True)
    reboots = [e for e in loaded.stream("guest") if e["op"] == "reboot"]
    assert len(reboots) == (0 if failed is Recheck.PAUSE else 1)
    assert loaded.verdict is not None and loaded.verdict["failed_recheck"] == (
        failed.value if failed else None)
    out = replay_one(cassette, offline=True)
    assert out.same, out.note
    assert out.episode is not None and out.episode.failed_recheck is failed
    assert out.episode.reason == ep.reason


# --- on a real VM ---------------------------------------------------------------------------------


def test_the_report_shows_the_task_as_sent_and_the_time_to_fix(tmp_path: Path) -> None:
    cassette = tmp_path / "flags.jsonl"
    _run(tmp_path, ["ls", "touch a", "touch b"], hint_level=2, track_fix=True, record=cassette)
    s = load_spec(_spec(tmp_path))
    assert html_report.load_trajectory(cassette).task == task_text(s, 2)
    assert html_report.view._cell("fixed_at", {"turn": 3, "seconds": 4.25}) == "4.2 s (turn 3)"


def test_an_episode_reads_back_from_what_it_wrote_and_an_infra_error_is_never_scored() -> None:
    ep = Episode(scenario="flags", agent=AgentKind.MODEL, model="m", protocol="json", round=2,
                 hint_level=1, verdict=Verdict.PASS, score=1.0, milestones=["found"],
                 phases={"agent": 3})
    line = {"type": "verdict", **ep.to_dict(), "from_a_newer_harness": 1}
    back = Episode.from_dict(json.loads(json.dumps(line)))
    assert back == ep and back.verdict is Verdict.PASS and back.phases == {"agent": 3.0}
    lost = Episode.infra_error("flags", AgentKind.MODEL, "m", "json", "worker: gone", round_=1,
                               hint_level=2, arm="m-json")
    assert (lost.verdict, lost.stop.value, lost.reason) == (Verdict.INFRA_ERROR, "infra-error",
                                                            "worker: gone")
    assert (lost.round, lost.hint_level, lost.arm, lost.score) == (1, 2, "m-json", None)
    assert not lost.verdict.scored


def test_the_tables_graded_columns_are_graded_fields() -> None:
    """One list of what grading adds (GRADED_FIELDS); the tables pick their columns from it."""
    assert {key for key, _title in GRADED_COLUMNS} <= set(GRADED_FIELDS) <= set(
        Episode.__dataclass_fields__)
    assert [t for _k, t in html_report.OPTIONAL_COLUMNS] == ["hint level", "score", "milestones",
                                                             "time to fix"]


# --- rules 3: lasting by default ---------------------------------------------------------------

def test_under_rules_3_every_passing_run_is_rechecked_after_a_reboot_without_asking(
        tmp_path: Path) -> None:
    """No ``reboot:`` key: rules 3 reboot anyway, so a fix that lives in /run fails; rules 2
    passed it, since the spec did not ask."""
    ep, guest = _lasting(tmp_path, "", ["touch run-a", "touch b"], text=IN_RUN, rules=Rules.V3)
    assert ep.verdict is Verdict.FAIL and guest.reboots == 1
    assert ep.reason == "did not survive a reboot: flag a" and ep.failed_recheck is Recheck.REBOOT
    assert "lasting" in ep.phases and ep.symptom_fixed is True and ep.unsafe_fix is False
    ep, guest = _lasting(tmp_path, "", ["touch run-a", "touch b"], text=IN_RUN, rules=Rules.V2)
    assert ep.verdict is Verdict.PASS and guest.reboots == 0 and ep.symptom_fixed is None
    ep, guest = _lasting(tmp_path, "", ["touch a", "touch b"], rules=Rules.V3)
    assert ep.verdict is Verdict.PASS and guest.reboots == 1, ep.reason


def test_a_spec_opts_out_of_the_reboot_only_with_a_reason(tmp_path: Path) -> None:
    keys = "lasting: {reboot: false, why: the fault does not survive a boot either}\n"
    ep, guest = _lasting(tmp_path, keys, ["touch run-a", "touch b"], text=IN_RUN, rules=Rules.V3)
    assert ep.verdict is Verdict.PASS and guest.reboots == 0
    with pytest.raises(InvalidInput, match="lasting"):
        load_spec(_spec(tmp_path, LASTING + "lasting: {reboot: false}\n"))
    with pytest.raises(InvalidInput, match="say one"):
        load_spec(_spec(tmp_path, LASTING + keys + "reboot: true\n"))
    s = load_spec(_spec(tmp_path, LASTING + keys))
    assert scenario_from_dict(json.loads(json.dumps(scenario_to_dict(s)))) == s


def test_under_rules_3_the_models_own_time_is_not_the_agents_budget(tmp_path: Path) -> None:
    """A model that takes 5 s a reply on a scenario with a 3 s budget: under rules 2 the budget
    ends the run before the fix; under rules 3 the model's time is counted apart (and
    recorded), so the same replies get the same verdict on a host of any speed."""

    class Hours(Clock):
        """A clock that only the model moves: each of its replies takes 5 s, nothing else any."""

        def __init__(self) -> None:
            super().__init__()
            self.t = 1000.0

        def now(self) -> float:
            return self.t

        def sleep(self, seconds: float) -> None:
            self.t += max(seconds, 0.0)

    class Slow(ScriptedModel):
        def __init__(self, clock: Hours) -> None:
            super().__init__(AgentKind.ORACLE, ["touch a", "touch b"], "done")
            self.clock = clock

        def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
            self.clock.t += 5.0
            return super().complete(request, timeout)

    scenario = load_spec(_spec(tmp_path, LASTING.replace("\nprobes:", "\nbudget: {seconds: 3}\nprobes:", 1)))
    assert scenario.budget.seconds == 3
    for rules, verdict in ((Rules.V2, Verdict.FAIL), (Rules.V3, Verdict.PASS)):
        clock = Hours()
        ep = run_episode(scenario, FlagGuest(), Slow(clock), get_protocol("tools"), clock, None,
                         rules=rules)
        assert ep.verdict is verdict, (rules, ep.reason)
        if rules is Rules.V3:
            assert ep.model_seconds is not None and ep.model_seconds >= 15
