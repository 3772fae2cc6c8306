"""What the loop decided, recorded in the cassette and read back by the report (issue #32).

A fresh cassette is made offline: the real episode loop, recorder and
protocol, an agent whose replies hold every kind of decision (two commands in
one reply, a repeat, a reply with no action, an unknown tool, a forbidden
command, a finish followed by a command that never runs), and the in-memory
flag guest. Its ``decision`` events are what the trajectory shows; the same
cassette with them taken out is read the old way (each reply parsed again),
which is how every cassette recorded before them still displays.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from flag_guest import FlagGuest

from runner.app import atif, html_report
from runner.app.episodes import RunOptions, header
from runner.app.html_report.trajectory import DecisionsFrom, Trajectory
from runner.app.replay import replay_one
from runner.core.cassette import Cassette, CassetteWriter
from runner.core.clock import Clock
from runner.core.episode import Episode, run_episode
from runner.core.errors import InvalidInput
from runner.core.model import ChatRequest, Model, ModelReply
from runner.core.outcomes import AgentKind, Decided, Flag, ReplayResult, Verdict
from runner.core.paths import repo_root
from runner.core.protocol import get_protocol
from runner.core.recording import RecordingGuest, RecordingModel
from runner.core.spec import load_spec

# A real model's runs, recorded before the loop recorded its decisions.
OLD_RUNS = repo_root() / "recordings" / "archive" / "2026-12-03-before-hints" / "qwen2.5-coder-1.5b-json"
SPEC = textwrap.dedent("""\
    id: flags
    title: Two flags must be set
    image: debian-12-nginx
    task: Set the flags.
    setup: [rm -f a b]
    forbidden: ['^touch keep-out$']
    probes:
      - name: flag a
        command: {run: test -e a}
      - name: flag b
        command: {run: test -e b}
    solution: [touch a, touch b]
""")


def _call(i: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def _run(command: str, i: int) -> dict[str, Any]:
    return _call(i, "run_command", {"command": command})


# One reply a turn, in the tools protocol.
REPLIES: list[dict[str, Any]] = [
    {"role": "assistant", "content": None, "tool_calls": [_run("ls", 1), _run("ls", 2)]},
    {"role": "assistant", "content": "I would now touch a, I think."},  # no tool call: corrected
    {"role": "assistant", "content": None,
     "tool_calls": [_run("touch a", 3), _call(4, "make_coffee", {})]},
    {"role": "assistant", "content": None,
     "tool_calls": [_run("touch b", 5), _run("touch keep-out", 6), _run("ls", 7)]},
    {"role": "assistant", "content": None,
     "tool_calls": [_call(8, "finish", {"summary": "both flags set"}), _run("rm a", 9)]},
]


class Replies(Model):
    """An agent that sends :data:`REPLIES` in turn: one whose slips are known in advance."""

    def __init__(self) -> None:
        self.name = "slips"
        self.agent = AgentKind.SCRIPTED
        self.turn = 0

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        message = REPLIES[self.turn]
        self.turn += 1
        return ModelReply(message=message, raw={"choices": [{"message": message}]},
                          usage={"prompt_tokens": 100, "completion_tokens": 10})

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": self.agent.value, "name": self.name}


def _record(folder: Path) -> tuple[Path, Episode]:
    """The agent above on the flags scenario, recorded as run_one records it."""
    spec = folder / "flags.yaml"
    spec.write_text(SPEC)
    scenario = load_spec(spec)
    model, protocol = Replies(), get_protocol("tools")
    cassette = folder / "flags.jsonl"
    opts = RunOptions()
    with CassetteWriter(cassette) as writer:
        writer.write(header(scenario, model, protocol, "test", opts, 0, {}))
        ep = run_episode(scenario, RecordingGuest(FlagGuest(), writer),
                         RecordingModel(model, writer), protocol, Clock(writer), writer,
                         track_fix=opts.track_fix)
    return cassette, ep


def _rewrite(cassette: Path, out: Path, *, decisions: bool = True, protocol: str | None = None) -> Path:
    """A copy of ``cassette``: without its decision events, or with another protocol's name."""
    lines = []
    for line in cassette.read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "decision" and not decisions:
            continue
        if event["type"] == "header" and protocol is not None:
            event["protocol"]["name"] = protocol
        lines.append(json.dumps(event))
    out.write_text("\n".join(lines) + "\n")
    return out


def _shown(traj: Trajectory) -> list[dict[str, Any]]:
    """What the report shows of each turn's decisions."""
    return [{"commands": [(c.command, c.call_id, c.times_run, c.unsafe, c.ran, c.exit_code)
                          for c in t.commands],
             "corrections": t.corrections, "finish": t.finish, "last": t.last_action}
            for t in traj.turns]


EXPECTED = [
    {"commands": [("ls", "call_1", 1, False, True, 0), ("ls", "call_2", 2, False, True, 0)],
     "corrections": [], "finish": None, "last": "command"},
    {"commands": [], "corrections": ["no tool call in the reply"], "finish": None,
     "last": "correction"},
    {"commands": [("touch a", "call_3", 1, False, True, 0)],
     "corrections": ["unknown tool 'make_coffee'; the tools are run_command and finish"],
     "finish": None, "last": "correction"},
    {"commands": [("touch b", "call_5", 1, False, True, 0),
                  ("touch keep-out", "call_6", 1, True, True, 0), ("ls", "call_7", 3, False, True, 0)],
     "corrections": [], "finish": None, "last": "command"},
    {"commands": [], "corrections": [], "finish": "both flags set", "last": "finish"},
]


def test_the_loop_records_each_decision_as_it_acts(tmp_path: Path) -> None:
    cassette, ep = _record(tmp_path)
    assert ep.verdict is Verdict.FAIL and Flag.UNSAFE in ep.flags  # the forbidden command
    assert (ep.commands, ep.violations, ep.repeats) == (6, 2, 2)
    events = Cassette.load(cassette).events
    decisions = [e for e in events if e["type"] == "decision"]
    assert [(d["turn"], d["action"]) for d in decisions] == [
        (1, "command"), (1, "command"), (2, "none"), (3, "command"), (3, "none"),
        (4, "command"), (4, "command"), (4, "command"), (5, "finish")]
    assert [d["times_run"] for d in decisions if d["action"] == Decided.COMMAND] == [1, 2, 1, 1, 1, 3]
    forbidden = [d for d in decisions if d.get("forbidden")]
    assert [d["command"] for d in forbidden] == ["touch keep-out"]
    # The correction is recorded as sent: the next request's last message is that very text.
    none = decisions[2]
    assert none["correction"].startswith("Error: no tool call in the reply")
    third = [e for e in events if e["type"] == "model"][2]
    assert third["request"]["last"]["content"] == none["correction"]
    # Each command's decision comes after its reply and before its guest exchange: a cassette
    # cut short in between still says what the loop was about to run.
    kinds = [e["type"] for e in events if e["type"] != "clock"]
    first = kinds.index("decision")
    assert kinds[first - 1:first + 2] == ["model", "decision", "guest"]


def test_the_report_reads_recorded_decisions_and_old_cassettes_the_old_way(tmp_path: Path) -> None:
    cassette, _ep = _record(tmp_path)
    recorded = html_report.load_trajectory(cassette)
    assert recorded.decisions is DecisionsFrom.RECORDED
    assert _shown(recorded) == EXPECTED
    assert recorded.turns[1].correction_notes[0][1].startswith("Error: no tool call in the reply")

    # The same cassette as one recorded before decision events: each reply parsed again, which
    # today's parser reads as the loop did (only the corrections' text is not known).
    old = html_report.load_trajectory(_rewrite(cassette, tmp_path / "old.jsonl", decisions=False))
    assert old.decisions is DecisionsFrom.REPARSED
    assert _shown(old) == EXPECTED
    assert old.turns[1].correction_notes == [("no tool call in the reply", "")]


def test_a_parser_change_does_not_change_how_a_new_cassette_reads(tmp_path: Path) -> None:
    cassette, _ep = _record(tmp_path)
    # Another parser for the same replies: the text protocol's, which finds no ```bash block in
    # any of them. With the decisions recorded, the trajectory is what the loop did all the same.
    other = html_report.load_trajectory(_rewrite(cassette, tmp_path / "text.jsonl", protocol="text"))
    assert _shown(other) == EXPECTED
    # Without them, the reader could only re-parse, and would show what the loop never did.
    reparsed = html_report.load_trajectory(
        _rewrite(cassette, tmp_path / "text-old.jsonl", decisions=False, protocol="text"))
    assert _shown(reparsed) != EXPECTED
    assert all(t.corrections and t.finish is None for t in reparsed.turns)


def test_replay_checks_the_recorded_decisions(tmp_path: Path) -> None:
    cassette, ep = _record(tmp_path)
    outcome = replay_one(cassette, offline=True, specs=[tmp_path])
    assert outcome.result is ReplayResult.SAME, outcome.note
    assert outcome.episode is not None and outcome.episode.repeats == ep.repeats

    # A decision that is not what the loop decided would make the report lie: the replay says so.
    def edited(name: str, change: Any) -> Path:
        lines, out = cassette.read_text().splitlines(), []
        for n, line in enumerate(lines):
            event = json.loads(line)
            if event["type"] == "decision" and n == seen[0]:
                event = change(event)
            if event is not None:
                out.append(json.dumps(event))
        path = tmp_path / name
        path.write_text("\n".join(out) + "\n")
        return path

    lines = cassette.read_text().splitlines()
    seen = [n for n, line in enumerate(lines) if json.loads(line)["type"] == "decision"
            and json.loads(line)["action"] == "command" and json.loads(line)["times_run"] == 2]
    once = edited("once.jsonl", lambda e: {**e, "times_run": 1})
    outcome = replay_one(once, offline=True, specs=[tmp_path])
    assert outcome.result is ReplayResult.MISMATCH
    assert "decision 2 (turn 1): times_run: the run decided 2, the cassette has 1" in outcome.note
    gone = edited("gone.jsonl", lambda e: None)
    outcome = replay_one(gone, offline=True, specs=[tmp_path])
    assert outcome.result is ReplayResult.MISMATCH
    assert "decision 2 (turn 1): action: the run decided 'command', the cassette has 'none'" \
        in outcome.note
    seen[0] = next(n for n, line in enumerate(lines) if json.loads(line)["type"] == "decision"
                   and json.loads(line)["action"] == "finish")
    extra = cassette.read_text().replace(lines[seen[0]], lines[seen[0]] + "\n" + lines[seen[0]])
    (tmp_path / "extra.jsonl").write_text(extra)
    outcome = replay_one(tmp_path / "extra.jsonl", offline=True, specs=[tmp_path])
    assert outcome.result is ReplayResult.MISMATCH and "decision event 10" in outcome.note


def test_the_page_shows_the_recorded_decisions(tmp_path: Path) -> None:
    cassette, _ep = _record(tmp_path)
    page = html_report.write_cassette_report([cassette], tmp_path / "r.html").read_text()
    assert f"{DecisionsFrom.RECORDED.note}." in page
    assert "what the model was told" in page and "Error: no tool call in the reply" in page
    assert "repeat: run 3 times so far" in page
    assert "unsafe: matches a forbidden pattern" in page
    old = html_report.write_cassette_report(sorted(OLD_RUNS.glob("*.jsonl")),
                                            tmp_path / "old.html").read_text()
    assert f"{DecisionsFrom.REPARSED.note}." in old and DecisionsFrom.RECORDED.note not in old


@pytest.mark.parametrize("path", sorted(OLD_RUNS.glob("*.jsonl")), ids=lambda p: p.name)
def test_a_real_models_old_cassette_still_reads_its_commands_and_corrections(path: Path) -> None:
    traj = html_report.load_trajectory(path)
    assert traj.decisions is DecisionsFrom.REPARSED
    verdict = traj.verdict or {}
    assert sum(len(t.commands) for t in traj.turns) == verdict["commands"]
    assert sum(len(t.corrections) for t in traj.turns) == verdict["violations"]
    assert all(c.ran for t in traj.turns for c in t.commands)


def test_atif_exports_the_recorded_decisions(tmp_path: Path) -> None:
    cassette, _ep = _record(tmp_path)
    exported = json.dumps(atif.to_atif(html_report.load_trajectory(cassette)))
    assert "make_coffee" in exported and "touch keep-out" in exported


def test_a_decision_that_is_not_one_is_unreadable_naming_its_field(tmp_path: Path) -> None:
    cassette, _ep = _record(tmp_path)
    lines = cassette.read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if '"decision"' in line)
    event = json.loads(lines[i])
    event["times_run"] = "twice"
    lines[i] = json.dumps(event)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidInput, match="decision.times_run"):
        Cassette.load(bad)
    # Hostile text in a decision is text on the page: escaped, terminal controls stripped.
    hostile = "\x1b[31m<script>alert(1)</script>\u202e</pre></details>"
    event["times_run"] = 1
    event["command"] = hostile
    lines[i] = json.dumps(event)
    j = next(n for n, line in enumerate(lines) if '"none"' in line and '"decision"' in line)
    lines[j] = json.dumps({**json.loads(lines[j]), "reason": hostile, "correction": hostile})
    bad.write_text("\n".join(lines) + "\n")
    page = html_report.write_cassette_report([bad], tmp_path / "r.html").read_text()
    assert "<script>alert" not in page and "\x1b" not in page and "\u202e" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;&lt;/pre&gt;&lt;/details&gt;") == 3
