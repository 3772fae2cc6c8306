"""Per-phase timing of an episode (issue #20), without a VM.

A small in-memory guest whose state is a set of flags (``touch X`` sets one,
``rm X`` clears it, the probe ``test -e X`` checks it) drives the real episode
loop, recorder and replayer; the committed oracle cassettes, recorded before
phases existed, stand for every old cassette.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from flag_guest import FlagGuest

from runner.app import html_report
from runner.app.episodes import RunOptions, header
from runner.app.replay import replay_one
from runner.app.runs import load_results, write_results
from runner.core.cassette import Cassette, CassetteWriter
from runner.core.clock import Clock
from runner.core.episode import PHASES, Episode, dominant_phase, run_episode
from runner.core.errors import InvalidInput
from runner.core.model import ScriptedModel
from runner.core.outcomes import AgentKind, Flag, StopReason, Verdict
from runner.core.paths import repo_root
from runner.core.protocol import get_protocol
from runner.core.recording import RecordingGuest, RecordingModel
from runner.core.spec import Scenario, load_spec

# Recorded before phases existed (kept in the archive beside the spec it ran).
OLD_RUNS = repo_root() / "recordings" / "archive" / "2026-12-03-before-hints"
OLD = OLD_RUNS / "qwen2.5-coder-1.5b-json" / "rogue-port-80.r0.jsonl"
SPEC = textwrap.dedent("""\
    id: flags
    title: Two flags must be set
    image: debian-12-nginx
    task: Set the flags.
    setup: [rm -f a b]
    invariants:
      - name: flag keep
        command: {run: test -e keep}
    probes:
      - name: flag a
        command: {run: test -e a}
      - name: flag b
        command: {run: test -e b}
    solution: [touch a, touch b]
""")


def _scenario(tmp_path: Path, text: str = SPEC) -> Scenario:
    path = tmp_path / "flags.yaml"
    path.write_text(text)
    return load_spec(path)


def _record(tmp_path: Path, cassette: Path, *, restore: float | None = 1.25) -> Episode:
    """The oracle on the flags scenario, recorded as run_one records (header, exchanges, verdict)."""
    scenario = _scenario(tmp_path)
    model = ScriptedModel(AgentKind.ORACLE, list(scenario.solution), "done")
    protocol = get_protocol("tools")
    with CassetteWriter(cassette) as writer:
        writer.write(header(scenario, model, protocol, "test", RunOptions(), 0, {}))
        return run_episode(scenario, RecordingGuest(FlagGuest(flags=("keep",)), writer),
                           RecordingModel(model, writer), protocol, Clock(writer), writer,
                           track_fix=True, restore_seconds=restore)


def _timings_ok(phases: dict[str, float]) -> None:
    assert all(isinstance(v, float) and v >= 0 and round(v, 3) == v for v in phases.values())


def test_a_run_times_every_phase_in_the_order_they_ran(tmp_path: Path) -> None:
    ep = _record(tmp_path, tmp_path / "flags.jsonl")
    assert ep.verdict is Verdict.PASS, ep.reason
    assert list(ep.phases) == list(PHASES)
    assert ep.phases["restore"] == 1.25  # handed in by whoever made the sandbox
    _timings_ok(ep.phases)
    d = ep.to_dict()
    assert list(d["phases"]) == list(PHASES) and d["phases"] == ep.phases
    json.dumps(d)  # results JSON takes it as it is


def test_the_cassette_and_results_json_keep_the_phases(tmp_path: Path) -> None:
    cassette = tmp_path / "flags.jsonl"
    ep = _record(tmp_path, cassette)
    verdict = Cassette.load(cassette).verdict  # schema-checked, phases included
    assert verdict is not None
    assert list(verdict["phases"]) == list(PHASES) and verdict["phases"] == ep.phases
    # Read back from the cassette as bench's record-mode once does: the recorded timings.
    fields = set(Episode.__dataclass_fields__)
    again = Episode(**{k: v for k, v in verdict.items() if k in fields})
    assert list(again.phases) == list(PHASES) and again.phases == ep.phases
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_results(run_dir, {}, [ep])
    _, [loaded] = load_results(run_dir)  # schema-checked too
    assert list(loaded.phases) == list(PHASES) and loaded.phases == ep.phases


def test_whole_seconds_in_json_read_back_as_floats() -> None:
    ep = Episode(scenario="s", agent=AgentKind.ORACLE, model="m", protocol="tools",
                 phases={"restore": 1, "baseline": 0})
    assert ep.phases == {"restore": 1.0, "baseline": 0.0}
    assert all(isinstance(v, float) for v in ep.phases.values())


def test_without_a_sandbox_there_is_no_restore(tmp_path: Path) -> None:
    ep = _record(tmp_path, tmp_path / "flags.jsonl", restore=None)
    assert list(ep.phases) == list(PHASES[1:])


@pytest.mark.parametrize(("edit", "up", "verdict", "ran"), [
    # the fault did not land: the run ends at the pre-check
    (("setup: [rm -f a b]", "setup: [touch a b]"), True, Verdict.INVALID_SCENARIO,
     ["baseline", "setup", "pre_check"]),
    # a setup command failed: the run ends in setup
    (("setup: [rm -f a b]", "setup: [rm -f a b, 'false']"), True, Verdict.INVALID_SCENARIO,
     ["baseline", "setup"]),
    # a setup command ran out of time (a starved guest): infra, which --retry-infra runs again
    (("setup: [rm -f a b]", "setup: [rm -f a b, 'hang']"), True, Verdict.INFRA_ERROR,
     ["baseline", "setup"]),
    # the guest is down after the agent: the judging began (it found the guest down) and ended
    # the run, so the lasting re-checks never began
    (None, False, Verdict.FAIL, list(PHASES[1:-1])),
])
def test_only_the_phases_that_began_are_kept(tmp_path: Path, edit: tuple[str, str] | None,
                                             up: bool, verdict: Verdict, ran: list[str]) -> None:
    scenario = _scenario(tmp_path, SPEC.replace(*edit) if edit else SPEC)
    model = ScriptedModel(AgentKind.ORACLE, list(scenario.solution), "done")
    ep = run_episode(scenario, FlagGuest(flags=("keep",), up=up), model, get_protocol("tools"), Clock(), None)
    assert ep.verdict is verdict, ep.reason
    if verdict is Verdict.INFRA_ERROR:
        assert ep.stop is StopReason.INFRA_ERROR
        assert ep.reason.startswith("setup[1] did not finish within 60 s"), ep.reason
    assert list(ep.phases) == ran
    _timings_ok(ep.phases)
    if not up:
        assert ep.stop is StopReason.VM_DOWN and Flag.VM_DOWN in ep.flags


@pytest.mark.parametrize(("phases", "expected"), [
    ({"restore": 1.0, "baseline": 0.5, "agent": 2.5}, ("agent", 0.625)),
    ({"restore": 2.0, "agent": 2.0}, ("restore", 0.5)),  # a tie: the phase that ran first
    ({"probes": 3.0}, ("probes", 1.0)),
    ({"baseline": 0.0, "setup": 0.0}, ("baseline", 0.0)),  # nothing measurable: no division
    ({}, ("", 0.0)),  # a sandbox that never came up
])
def test_dominant_phase(phases: dict[str, float], expected: tuple[str, float]) -> None:
    name, share = dominant_phase(phases)
    assert name == expected[0] and share == pytest.approx(expected[1])


def test_an_old_cassette_without_phases_still_replays_the_same(tmp_path: Path) -> None:
    old = tmp_path / OLD.name
    shutil.copy2(OLD, old)
    verdict = Cassette.load(old).verdict
    assert verdict is not None and "phases" not in verdict
    out = replay_one(old, offline=True, specs=[OLD_RUNS / "specs"])
    assert out.same, out.note
    assert out.episode is not None
    assert list(out.episode.phases) == list(PHASES[1:])  # the replay's own; no sandbox, no restore


def test_replay_does_not_compare_phases(tmp_path: Path) -> None:
    cassette = tmp_path / "flags.jsonl"
    _record(tmp_path, cassette)
    lines = cassette.read_text().splitlines()
    verdict: dict[str, Any] = json.loads(lines[-1])
    verdict["phases"] = {"restore": 99.0, "agent": 1234.5}  # far from anything a replay measures
    cassette.write_text("\n".join([*lines[:-1], json.dumps(verdict)]) + "\n")
    out = replay_one(cassette, offline=True)
    assert out.same, out.note


def test_a_verdict_with_a_negative_phase_is_refused(tmp_path: Path) -> None:
    cassette = tmp_path / "flags.jsonl"
    _record(tmp_path, cassette)
    lines = cassette.read_text().splitlines()
    verdict = json.loads(lines[-1])
    verdict["phases"]["agent"] = -1
    cassette.write_text("\n".join([*lines[:-1], json.dumps(verdict)]) + "\n")
    with pytest.raises(InvalidInput, match="verdict.phases.agent"):
        Cassette.load(cassette)


def test_the_html_report_shows_the_phases(tmp_path: Path) -> None:
    cassette = tmp_path / "flags.jsonl"
    _record(tmp_path, cassette)
    out = html_report.write_cassette_report([cassette], tmp_path / "report.html")
    page = out.read_text()
    assert "phases: restore 1.25 s · baseline" in page
    # From a hostile file: terminal controls in a name are stripped, a value not a number is left
    # out (Jinja escapes what is left, as it does everything on the page).
    hostile = html_report.EpisodeView({"scenario": "x", "phases": {"\x1b[31magent": 1, "y": "z"}})
    assert dict(html_report.view.extra_fields(hostile))["phases"] == "agent 1.00 s"
