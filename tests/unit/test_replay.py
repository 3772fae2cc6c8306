"""Replay you can trust: each cassette ends same, different, mismatch, spec-changed or unreadable.

No VM and no model: every cassette here is a committed one, copied and
edited, or one recorded from fakes (a replayed guest, a model server that
fails). What is checked is what CI relies on: a replay that diverges is never
"same", an edited spec is noticed, and a bad file is one line naming where,
never a traceback, a hang or a crash of the whole command.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, cli_argv
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.app.replay import (
    OutcomeTable,
    load_replayable,
    replay_all,
    replay_jobs,
    replay_loaded,
    replay_one,
)
from runner.core import replay as core_replay
from runner.core.cassette import Cassette, CassetteWriter
from runner.core.clock import Clock
from runner.core.episode import run_episode
from runner.core.errors import InfraError, InvalidInput, ModelServerError, ReplayMismatch
from runner.core.model import ChatRequest, Model, ModelReply
from runner.core.outcomes import ReplayResult
from runner.core.paths import repo_root
from runner.core.protocol import get_protocol
from runner.core.recording import RecordingGuest, RecordingModel
from runner.core.replay import ReplayGuest, ReplayModel, spec_change
from runner.core.spec import scenario_from_dict

ROOT = repo_root()
ORACLE = ROOT / "recordings" / "oracle" / "cpu-hog.jsonl"
LIVE = ROOT / "recordings" / "archive" / "2026-12-04-before-validity" / "qwen2.5-coder-0.5b-json" / "permission-403.r0.jsonl"


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _replay(cli: Cli, *args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """``rootbench -q replay --offline ARGS`` in this process (from ``cwd``, else the
    checkout's root): exit code, stdout, stderr."""
    # A hang fails at the timeout. The committed suite is ~950 cassettes (~16 CPU-seconds), and
    # the test may share 2 cores with a VM test and a model: 60 s was once too little under load.
    r = cli("-q", "replay", "--offline", *args, cwd=cwd, timeout=240)
    assert "Traceback" not in r.stdout + r.stderr
    return r.returncode, r.stdout, r.stderr


def _row(out: str, cassette: Path) -> list[str]:
    """The table row of ``cassette``, as its cells."""
    rows = [ln for ln in out.splitlines() if ln.startswith(f"| {cassette} ")]
    assert len(rows) == 1, out
    return [c.strip() for c in rows[0].strip("|").split("|")]


def test_replay_mismatch_is_not_infra_error() -> None:
    # run_episode turns every InfraError into a verdict; a divergence must get past it.
    assert not issubclass(ReplayMismatch, InfraError)


# --- mismatch: a run that diverged is never "same" ----------------------------------------

class _BrokenServer(Model):
    """A model server that answers every request with HTTP 500."""

    name = "broken"

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        raise ModelServerError("HTTP 500 from the model server")


class _InstantGuest(ReplayGuest):
    """The recorded guest, answering at once: its recorded durations never elapse here, so they
    are not claimed (a cassette's clock must leave room for what ran between its readings)."""

    def _next(self, op: str, given: dict[str, Any]) -> dict[str, Any]:
        result = dict(super()._next(op, given))
        if "duration" in result:
            result["duration"] = 0.0
        return result


def _record_infra_error(path: Path) -> Path:
    """Record a real infra-error run: the oracle cassette's guest, a model server that fails."""
    source = Cassette.load(ORACLE)
    scenario = scenario_from_dict(dict(source.head.scenario))
    model = _BrokenServer()
    with CassetteWriter(path) as writer:
        writer.write({**source.header, "model": model.fingerprint(), "agent": "model",
                      "protocol": {"name": "tools", "reason": "test"}})
        ep = run_episode(scenario, RecordingGuest(_InstantGuest(source), writer),
                         RecordingModel(model, writer), get_protocol("tools"), Clock(writer), writer,
                         track_fix=source.head.track_fix,  # as the header says
                         rules=source.head.rules)
    assert ep.verdict == "infra-error", ep.reason
    return path


def test_an_infra_error_cassette_whose_task_changed_is_a_mismatch(
        tmp_path: Path, cli: Cli) -> None:
    cassette = _record_infra_error(tmp_path / "infra.jsonl")
    code, out, _err = _replay(cli, str(cassette))
    assert code == 0 and _row(out, cassette)[2:6] == ["infra-error", "infra-error", "yes", "same"]

    events = _events(cassette)
    events[0]["scenario"]["task"] = "An edited task text."
    _write(cassette, events)
    code, out, _err = _replay(cli, str(cassette))
    # Before, the divergence itself became the verdict infra-error, and so "same", exit 0.
    assert code == 1, out
    row = _row(out, cassette)
    assert row[3:6] == ["mismatch", "NO", "mismatch"], row
    assert "turn 1" in row[6] and "message 1 (user) differs" in row[6], row


def test_a_guest_mismatch_names_the_exchange_and_the_field(
        tmp_path: Path, cli: Cli) -> None:
    events = _events(ORACLE)
    setup = events[0]["scenario"]["setup"]
    setup[0] = setup[0] + " # edited"
    cassette = _write(tmp_path / "c.jsonl", events)
    code, out, _err = _replay(cli, str(cassette))
    assert code == 1
    note = _row(out, cassette)[6]
    assert note.startswith("guest exchange ") and "(clean): input.command: " in note, note


def test_a_run_that_stops_short_of_the_recording_is_a_mismatch(
        tmp_path: Path, cli: Cli) -> None:
    # One more recorded clock reading than the run asks for: the run did not do what was recorded.
    events = _events(ORACLE)
    # (A reading the clock could have given: not after the episode's end, see the next test.)
    last = [e for e in events if e["type"] == "clock"][-1]["t"]
    events.insert(-1, {"type": "clock", "t": last})
    cassette = _write(tmp_path / "c.jsonl", events)
    code, out, _err = _replay(cli, str(cassette))
    assert code == 1
    row = _row(out, cassette)
    assert row[5] == "mismatch" and f"the cassette has 1 more (the next: t={last})" in row[6], row


def test_a_reading_after_the_episode_ended_is_blamed_on_its_line(
        tmp_path: Path, cli: Cli) -> None:
    events = _events(ORACLE)
    events.insert(-1, {"type": "clock", "t": 999.0})
    _write(tmp_path / "c.jsonl", events)
    # Named from its folder: the table cuts a long note, and tmp_path's length varies.
    code, out, _err = _replay(cli, "c.jsonl", cwd=tmp_path)
    row = _row(out, Path("c.jsonl"))
    assert code == 2 and row[5] == "unreadable", row
    assert f"c.jsonl:{len(events) - 1}: clock.t: clock reading t=999.0 is later than" in row[6]


def test_a_different_verdict_is_different(tmp_path: Path,
                                          cli: Cli) -> None:
    events = _events(ORACLE)
    events[-1]["verdict"] = "fail"
    cassette = _write(tmp_path / "c.jsonl", events)
    code, out, _err = _replay(cli, str(cassette))
    assert code == 1 and _row(out, cassette)[2:6] == ["fail", "pass", "NO", "different"]


# --- spec-changed: an edited spec makes the recording stale ---------------------------------

def _copy_with_spec(tmp_path: Path) -> tuple[Path, Path]:
    """The cpu-hog oracle cassette and its spec, copied; the cassette names the copied spec."""
    spec = tmp_path / "specs" / "cpu-hog.yaml"
    spec.parent.mkdir()
    shutil.copy(ROOT / "specs" / "cpu-hog.yaml", spec)
    events = _events(ORACLE)
    events[0]["scenario"]["path"] = str(spec)
    return _write(tmp_path / "cassettes" / "cpu-hog.jsonl", events), spec


def test_an_edited_spec_is_spec_changed_unless_allowed(
        tmp_path: Path, cli: Cli) -> None:
    cassette, spec = _copy_with_spec(tmp_path)
    code, out, _err = _replay(cli, "--specs", str(spec.parent), str(cassette))
    assert code == 0 and _row(out, cassette)[5] == "same"

    # What no run reads (a comment, an alternative fix added) leaves the recording standing:
    # the header holds the whole scenario the run was judged by, and today's is the same.
    another = ("  - name: another fix\n    why: a fix an admin may choose\n"
               "    commands: [systemctl disable --now report-gen]\n")
    text = spec.read_text()
    text = (text.replace("\nalternatives:\n", "\nalternatives:\n" + another, 1) if "\nalternatives:\n" in text
            else text + "alternatives:\n" + another)
    spec.write_text(text + "# an edit\n")
    code, out, _err = _replay(cli, "--specs", str(spec.parent), str(cassette))
    assert code == 0 and _row(out, cassette)[5] == "same", out

    # The task reworded: a model's run read it, but this is the oracle's, a scripted run that
    # never reads the task (as verify judges it), so its recording still stands.
    spec.write_text(spec.read_text().replace("since yesterday's deploy", "since the deploy"))
    code, out, _err = _replay(cli, "--specs", str(spec.parent), str(cassette))
    assert code == 0 and _row(out, cassette)[5] == "same", out

    # What the run was judged by (a forbidden pattern added) is a change for any run.
    spec.write_text(spec.read_text().replace("forbidden:\n", "forbidden:\n  - 'never-typed'\n", 1))
    code, out, _err = _replay(cli, "--specs", str(spec.parent), str(cassette))
    row = _row(out, cassette)
    assert code == 1 and row[3:6] == ["spec-changed", "NO", "spec-changed"], row
    assert f"{spec} changed since the recording" in row[6], row

    code, out, _err = _replay(cli, "--allow-spec-changes", "--specs", str(spec.parent), str(cassette))
    row = _row(out, cassette)
    assert code == 0 and row[2:6] == ["pass", "pass", "yes", "same"], row
    assert "spec changed" in row[6], row


def _own_scenario(tmp_path: Path) -> tuple[Path, Path]:
    """A cassette of a scenario kept outside the suite (id ``my-cpu-hog``) and its spec file."""
    spec = tmp_path / "mine" / "my-cpu-hog.yaml"
    spec.parent.mkdir()
    text = (ROOT / "specs" / "cpu-hog.yaml").read_text().replace("id: cpu-hog", "id: my-cpu-hog")
    spec.write_text(text)
    events = _events(ORACLE)
    events[0]["scenario"]["id"] = events[-1]["scenario"] = "my-cpu-hog"
    events[0]["scenario"]["path"] = str(spec)
    events[0]["spec_hash"] = events[0]["scenario"]["spec_hash"] = \
        hashlib.sha256(text.encode()).hexdigest()
    return _write(tmp_path / "cassettes" / "my-cpu-hog.jsonl", events), spec


def test_a_deleted_spec_is_spec_changed(tmp_path: Path, cli: Cli) -> None:
    cassette, spec = _own_scenario(tmp_path)
    assert _replay(cli, "--specs", str(spec.parent), str(cassette))[0] == 0
    spec.unlink()
    code, out, _err = _replay(cli, "--specs", str(spec.parent), str(cassette))
    row = _row(out, cassette)
    assert code == 1 and row[5] == "spec-changed" and "no spec with id 'my-cpu-hog'" in row[6], row


def test_the_header_path_is_never_read_wherever_replay_runs(tmp_path: Path, cli: Cli) -> None:
    """Issue 27: the spec named by the header was hashed (any host file: /etc/passwd), and a
    cassette whose id is not in specs/ replayed "same" from the repo root only, bypassing --specs."""
    cassette, spec = _own_scenario(tmp_path)
    for cwd in (ROOT, tmp_path, spec.parent):
        code, out, _err = _replay(cli, str(cassette), cwd=cwd)
        row = _row(out, cassette)
        assert code == 1 and row[5] == "spec-changed" and "cannot prove" in row[6], row
        code, out, _err = _replay(cli, "--specs", str(tmp_path / "cassettes"), str(cassette),
                                  cwd=cwd)
        assert code == 1 and _row(out, cassette)[5] == "spec-changed"
    # Beside the cassette, or in a --specs folder, it is found by its id: same.
    shutil.copy(spec, cassette.parent / "whatever.yaml")
    code, out, _err = _replay(cli, str(cassette), cwd=spec.parent)
    assert code == 0 and _row(out, cassette)[5] == "same"
    # The header naming a host file: never hashed, never quoted.
    events = _events(ORACLE)
    events[0]["scenario"]["path"] = "/etc/passwd"
    events[0]["scenario"]["id"] = events[-1]["scenario"] = "passwd"
    events[0]["spec_hash"] = events[0]["scenario"]["spec_hash"] = \
        hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    hostile = _write(tmp_path / "hostile" / "passwd.jsonl", events)
    code, out, _err = _replay(cli, str(hostile), cwd=spec.parent)
    row = _row(out, hostile)
    assert code == 1 and row[5] == "spec-changed" and "/etc/passwd" not in row[6], row
    digest = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    assert digest[:12] not in out


def test_a_spec_is_found_by_id_when_the_recorded_path_is_elsewhere(tmp_path: Path) -> None:
    # A cassette recorded in another checkout names a path that is not here: specs/ by id is.
    events = _events(ORACLE)
    events[0]["scenario"]["path"] = "/elsewhere/rootbench/specs/cpu-hog.yaml"
    cas = Cassette.load(_write(tmp_path / "c.jsonl", events))
    assert spec_change(cas) is None
    specs = tmp_path / "specs"
    specs.mkdir()
    text = (ROOT / "specs" / "cpu-hog.yaml").read_text()
    (specs / "renamed.yaml").write_text(text + "# edit\n")
    assert spec_change(cas, [specs]) is None  # a comment: nothing a run reads
    (specs / "renamed.yaml").write_text(text.replace("forbidden:", "forbidden:\n  - 'reboot'", 1))
    assert "renamed.yaml changed since the recording" in (spec_change(cas, [specs]) or "")
    (specs / "renamed.yaml").unlink()
    assert "no spec with id 'cpu-hog'" in (spec_change(cas, [specs]) or "")


# --- unreadable: one line naming the file, the line and the field ------------------------------

def _header_round(events: list[dict[str, Any]]) -> int:
    events[0]["round"] = "abc"
    return 1


def _budget_turns(events: list[dict[str, Any]]) -> int:
    events[0]["scenario"]["budget"]["turns"] = "ten"
    return 1


def _verdict_turns(events: list[dict[str, Any]]) -> int:
    events[-1]["turns"] = "ten"
    return len(events)


def _clock_t(events: list[dict[str, Any]]) -> int:
    i = next(i for i, e in enumerate(events) if e["type"] == "clock")
    events[i]["t"] = "abc"
    return i + 1


def _no_reply(events: list[dict[str, Any]]) -> int:
    i = next(i for i, e in enumerate(events) if e["type"] == "model")
    del events[i]["reply"]
    return i + 1


def _no_scenario(events: list[dict[str, Any]]) -> int:
    del events[0]["scenario"]
    return 1


def _guest_op(events: list[dict[str, Any]]) -> int:
    i = next(i for i, e in enumerate(events) if e["type"] == "guest")
    events[i]["op"] = "format-disk"
    return i + 1


@pytest.mark.parametrize("damage,field", [
    (_header_round, "header.round"),
    (_budget_turns, "header.scenario.budget.turns"),
    (_verdict_turns, "verdict.turns"),
    (_clock_t, "clock.t"),
    (_no_reply, "model.reply"),
    (_no_scenario, "header.scenario"),
    (_guest_op, "guest.op"),
])
def test_a_wrong_type_is_one_line_naming_file_line_and_field(
        tmp_path: Path, cli: Cli, damage: Any, field: str) -> None:
    events = _events(LIVE)
    line = damage(events)
    cassette = _write(tmp_path / "bad.jsonl", events)
    code, out, err = _replay(cli, str(cassette))
    assert code == 2, out + err
    said = [ln for ln in err.splitlines() if ln.strip()]
    assert len(said) == 1 and said[0].startswith(f"rootbench: {cassette}:{line}: {field}: "), err
    assert _row(out, cassette)[5] == "unreadable"
    with pytest.raises(InvalidInput) as info:
        Cassette.load(cassette)
    assert (info.value.path, info.value.line, info.value.field) == (str(cassette), line, field)


@pytest.mark.parametrize("text,line,fragment", [
    ('{"type": "clock", "t": 1.0}\n', 1, "a cassette starts with its header"),
    ("HEADER\nHEADER\n", 2, "a second header"),
    ('HEADER\n{"type": "clock", "t": NaN}\n', 2, "NaN is not a JSON value"),
    ('HEADER\n' + "[" * 100_000 + "\n", 2, "invalid JSON"),
    ('HEADER\n{"type": "clock", "t": 1}\n\n{"type": "clock", "t": 2', 4, "invalid JSON"),
])
def test_bad_structure_names_the_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    header = json.dumps(_events(ORACLE)[0])
    path = tmp_path / "c.jsonl"
    path.write_text(text.replace("HEADER", header))
    with pytest.raises(InvalidInput, match=fragment) as info:
        Cassette.load(path)
    assert info.value.line == line


def test_events_after_the_verdict_are_refused(tmp_path: Path) -> None:
    events = _events(ORACLE)
    cassette = _write(tmp_path / "c.jsonl", [*events, {"type": "clock", "t": 1.0}])
    with pytest.raises(InvalidInput, match="after the verdict") as info:
        Cassette.load(cassette)
    assert info.value.line == len(events) + 1


def test_every_committed_cassette_is_valid() -> None:
    found = sorted((ROOT / "recordings").rglob("*.jsonl"))
    assert len(found) >= 35
    for path in found:
        assert Cassette.load(path).verdict is not None, path


# --- files that are not cassettes at all -------------------------------------------------

def test_a_fifo_is_refused_without_waiting_for_a_writer(cli: Cli, tmp_path: Path) -> None:
    fifo = tmp_path / "x.jsonl"
    os.mkfifo(fifo)
    r = cli("-q", "replay", "--offline", str(fifo), timeout=60)  # a hang fails at the timeout
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"rootbench: {fifo}: not a regular file" in r.stderr


def test_dev_zero_is_refused_without_reading_it(cli: Cli, tmp_path: Path) -> None:
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    for path in ("/dev/zero", str(link)):
        r = cli("-q", "replay", "--offline", path, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert f"rootbench: {path}: not a regular file" in r.stderr


def test_an_oversized_file_is_refused_unread(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import runner.core.cassette as cassette_module

    monkeypatch.setattr(cassette_module, "MAX_CASSETTE_BYTES", 1000)
    with pytest.raises(InvalidInput, match="larger than 1000 bytes"):
        Cassette.load(ORACLE)


def test_a_folder_with_one_bad_file_replays_the_good_ones(
        tmp_path: Path, cli: Cli) -> None:
    folder = tmp_path / "recordings"
    # Two cassettes of today's specs (a shortcut's run as the second), in two sub-folders.
    second = sorted((ROOT / "recordings" / "oracle" / "shortcuts").rglob("*.jsonl"))[0]
    good = [folder / "a" / ORACLE.name, folder / "b" / second.name]
    for src, dst in zip((ORACLE, second), good, strict=True):
        dst.parent.mkdir(parents=True)
        shutil.copy(src, dst)
    bad = folder / "b" / "bad.jsonl"
    bad.write_text("this is not JSON\n")
    fifo = folder / "fifo.jsonl"
    os.mkfifo(fifo)
    code, out, err = _replay(cli, str(folder))  # fails at its timeout if the FIFO blocked it
    assert code == 2, out + err
    for path in good:
        assert _row(out, path)[4:6] == ["yes", "same"]
    assert _row(out, bad)[5] == "unreadable" and _row(out, fifo)[5] == "unreadable"
    said = sorted(ln for ln in err.splitlines() if ln.startswith("rootbench: "))
    assert said == [f"rootbench: {bad}:1: invalid JSON: Expecting value (column 1)",
                    f"rootbench: {fifo}: not a regular file (a cassette is a .jsonl file)"], err
    assert "2/4 replayed verdicts equal the recorded ones (2 unreadable)" in out


def test_a_missing_path_on_the_command_line_is_exit_2_at_once(
        cli: Cli) -> None:
    code, out, err = _replay(cli, "no/such/cassette.jsonl")
    assert code == 2 and not out and "no/such/cassette.jsonl: no such file" in err


def test_the_committed_recordings_all_replay_the_same(cli: Cli) -> None:
    live = sorted((ROOT / "recordings" / "live").glob("*/"))  # empty until re-run under rules 2
    code, out, _err = _replay(cli, str(ROOT / "recordings" / "oracle"), *map(str, live))
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and ".jsonl" in ln]
    assert code == 0 and len(rows) >= 29
    assert all(f"| {ReplayResult.SAME.value} " in row for row in rows)


# --- the reader never fails any other way -------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20)
_TEMPLATES = [e for e in _events(LIVE) if e["type"] != "verdict"][:40] + [_events(LIVE)[-1]]


@st.composite
def _damaged_event(draw: st.DrawFn) -> str:
    """A real event with one value, anywhere in it, swapped for arbitrary JSON."""
    event = json.loads(json.dumps(draw(st.sampled_from(_TEMPLATES))))
    node: Any = event
    while isinstance(node, dict | list) and node:
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        if draw(st.booleans()) or not isinstance(node[key], dict | list) or not node[key]:
            node[key] = draw(_json)
            break
        node = node[key]
    return json.dumps(event)


_lines = st.one_of(
    st.text(max_size=60),
    _json.map(json.dumps),
    st.dictionaries(st.sampled_from(["type", "t", "op", "turn", "reply", "format", "scenario"]),
                    _json, max_size=4).map(json.dumps),
    _damaged_event(),
)


@settings(max_examples=300, deadline=2000,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(header=st.booleans(), lines=st.lists(_lines, max_size=8), raw=st.binary(max_size=40))
def test_the_reader_ends_in_a_cassette_or_invalid_input(
        tmp_path: Path, header: bool, lines: list[str], raw: bytes) -> None:
    path = tmp_path / "fuzz.jsonl"
    head = [json.dumps(_events(LIVE)[0])] if header else []
    path.write_bytes("\n".join(head + lines).encode("utf-8", "surrogatepass") + b"\n" + raw)
    try:
        cas = Cassette.load(path)
    except InvalidInput as exc:
        assert exc.path == str(path) and "\n" not in str(exc)
    else:
        assert cas.header["type"] == "header"


@st.composite
def _damaged_cassette(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A committed cassette with one value, anywhere in one event, swapped for arbitrary JSON."""
    events = json.loads(json.dumps(draw(st.sampled_from(_COMMITTED))))
    node: Any = draw(st.sampled_from(events))
    while isinstance(node, dict | list) and node:
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        if draw(st.booleans()) or not isinstance(node[key], dict | list) or not node[key]:
            node[key] = draw(_json)
            break
        node = node[key]
    return events


_COMMITTED = [_events(ORACLE), _events(LIVE)]


@settings(max_examples=100, deadline=5000,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=_damaged_cassette())
def test_a_damaged_cassette_replays_to_an_outcome_or_invalid_input(
        tmp_path: Path, events: list[dict[str, Any]]) -> None:
    from runner.app.replay import load_replayable, replay_loaded

    path = _write(tmp_path / "fuzz.jsonl", events)
    try:
        rep = load_replayable(path)
    except InvalidInput as exc:
        assert exc.path == str(path) and "\n" not in str(exc)
        return
    outcome = replay_loaded(rep, offline=True)
    assert outcome.result in ReplayResult and "\n" not in outcome.note


# --- a recorded run's requests asked again of a live model (ShadowedReplayModel) ------------

LIVE_15 = ROOT / "recordings" / "live" / "qwen2.5-coder-1.5b-json"


def test_a_live_model_that_answers_as_recorded_is_the_same_on_every_turn() -> None:
    path = LIVE_15 / "cron-stopped.r0.jsonl"
    rep = load_replayable(path)
    turns = len(rep.cassette.stream("model"))
    # The "live" model is the recording itself, served as a replay serves it: a Model that
    # gives every recorded reply to the same requests.
    out = replay_loaded(rep, offline=True, live=ReplayModel(Cassette.load(path)))
    assert out.result is ReplayResult.SAME
    assert len(out.reply_checks) == turns >= 2
    assert all(c.same for c in out.reply_checks)
    assert [c.turn for c in out.reply_checks] == list(range(1, turns + 1))
    assert out.reply_checks[0].timings.get("predicted_n", 0) > 0  # the live reply's own timings


def test_a_live_model_that_answers_otherwise_is_counted_and_the_run_follows_the_recording() -> None:
    path = LIVE_15 / "cron-stopped.r0.jsonl"
    other = LIVE_15 / "cron-stopped.r0.h1.jsonl"  # the same scenario with a hint: other replies
    rep = load_replayable(path)
    live = ReplayModel(Cassette.load(other), lenient=True)
    out = replay_loaded(rep, offline=True, live=live)
    # The run is the recorded one whatever the live model said ...
    assert out.result is ReplayResult.SAME
    # ... and every turn says whether the live reply was the recorded one.
    assert len(out.reply_checks) == len(rep.cassette.stream("model"))
    recorded = [e["reply"]["message"].get("content") for e in Cassette.load(other).stream("model")]
    mine = [e["reply"]["message"].get("content") for e in rep.cassette.stream("model")]
    expected = [a == b for a, b in zip(mine, recorded, strict=False)]
    assert [c.same for c in out.reply_checks][:len(expected)] == expected
    assert not all(c.same for c in out.reply_checks)


def test_a_live_model_is_only_asked_on_a_strict_offline_replay() -> None:
    path = LIVE_15 / "cron-stopped.r0.jsonl"
    with pytest.raises(ValueError):
        replay_loaded(load_replayable(path), offline=True, lenient=True,
                      live=ReplayModel(Cassette.load(path)))


# --- many cassettes: both cores, in order, streamed; the specs read once ---------------------

def _processes_naming(text: str) -> list[int]:
    """PIDs whose command line names ``text`` (a test's own temporary folder)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue  # it ended while we looked
    return found


def test_replay_all_hands_back_every_outcome_in_the_order_given(tmp_path: Path) -> None:
    """Two workers, outcomes in the input order whichever finished first: the same rows as
    one process gives, an unreadable cassette's reason in its own place."""
    oracle = sorted((ROOT / "recordings" / "oracle").glob("*.jsonl"))[:40]
    broken = _write(tmp_path / "broken.jsonl", [{"type": "header", "format": 99}])
    paths = [*oracle[:17], broken, *oracle[17:]]
    assert replay_jobs(len(paths), offline=True) == 2 and replay_jobs(3, offline=True) == 1
    one = list(replay_all(paths, offline=True, jobs=1))
    two = list(replay_all(paths, offline=True, jobs=2))
    assert [OutcomeTable.cells(d.outcome) for d in two] == \
        [OutcomeTable.cells(d.outcome) for d in one]
    assert [d.outcome.cassette for d in two] == [str(p) for p in paths]
    assert [d.error is not None for d in two] == [p == broken for p in paths]
    assert str(broken) in (two[17].error or "") and two[17].outcome.result is ReplayResult.UNREADABLE
    assert all(d.outcome.same for d in two if d.error is None)
    assert one[0].outcome.episode is not None  # in the caller's process the whole run is kept


def test_a_spec_is_parsed_once_and_never_served_stale(tmp_path: Path) -> None:
    """The ids of the spec files are cached by path and sha256 of the text: replaying a
    scenario's cassettes parses its spec once, and a spec edited since is read afresh."""
    cassette, spec = _copy_with_spec(tmp_path)
    copies = [shutil.copy(cassette, tmp_path / "cassettes" / f"c{i}.jsonl") for i in range(3)]
    core_replay._SPEC_IDS.clear()
    assert all(replay_one(Path(c), offline=True, specs=[spec.parent]).same for c in copies)
    assert list(core_replay._SPEC_IDS) == [(str(spec), _sha(spec))]
    # The same size and place, another id: a cache keyed by the path alone would still say
    # "cpu-hog" and report an edit; read afresh, the id is gone.
    spec.write_text(spec.read_text().replace("id: cpu-hog", "id: cpu-hox"))
    out = replay_one(cassette, offline=True, specs=[spec.parent])
    assert out.result is ReplayResult.SPEC_CHANGED and "no spec with id 'cpu-hog'" in out.note
    spec.write_text(spec.read_text().replace("id: cpu-hox", "id: cpu-hog"))
    assert replay_one(cassette, offline=True, specs=[spec.parent]).same


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_id_is_a_file_name_never_a_path(tmp_path: Path) -> None:
    """``<id>.yaml`` is tried first; a header's id with a slash names no file outside the folder."""
    events = _events(ORACLE)
    events[0]["scenario"]["id"] = events[-1]["scenario"] = "../outside/cpu-hog"
    (tmp_path / "outside").mkdir()
    shutil.copy(ROOT / "specs" / "cpu-hog.yaml", tmp_path / "outside" / "cpu-hog.yaml")
    specs = tmp_path / "specs"
    specs.mkdir()
    cas = Cassette.load(_write(tmp_path / "c" / "x.jsonl", events))
    assert "no spec with id '../outside/cpu-hog'" in (spec_change(cas, [specs]) or "")


def test_rows_stream_and_ctrl_c_ends_every_worker(tmp_path: Path) -> None:
    # A process: Ctrl-C, and the workers it must end, are only seen from outside one.
    folder = tmp_path / "oracle"
    folder.symlink_to(ROOT / "recordings" / "oracle")
    proc = subprocess.Popen(cli_argv("replay", "--offline", *[str(folder)] * 10),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    try:
        lines = [proc.stdout.readline() for _ in range(6)]  # the head, the parent's row, 3 pooled
        assert lines[0].startswith("| cassette ") and all(
            ln.startswith(f"| {folder}/") and "| same " in ln for ln in lines[2:]), lines
        assert len(_processes_naming(str(tmp_path))) == 3  # the command and its two workers
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    # 4,380 cassettes take seconds: the rows came as each was decided, and the run ended at the
    # first Ctrl-C, before its summary, its workers with it.
    assert proc.returncode == 130 and "replayed verdicts equal" not in out, err
    assert err.strip().splitlines()[-1] == "rootbench: interrupted", err
    assert "Traceback" not in err
    assert _processes_naming(str(tmp_path)) == []


def test_a_closed_pipe_ends_the_run_and_its_workers(tmp_path: Path) -> None:
    # A process: the reader of its stdout pipe goes away (`replay ... | head -3`).
    folder = tmp_path / "oracle"
    folder.symlink_to(ROOT / "recordings" / "oracle")
    proc = subprocess.Popen(cli_argv("replay", "--offline", *[str(folder)] * 10),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    head = [proc.stdout.readline() for _ in range(4)]
    assert head[3].startswith(f"| {folder}/".encode()), head
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1  # docs/cli.md: stdout closed early is exit 1
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert _processes_naming(str(tmp_path)) == []


def test_json_rows_stream_as_one_document(cli: Cli) -> None:
    oracle = sorted(str(p) for p in (ROOT / "recordings" / "oracle").glob("*.jsonl"))[:20]
    r = cli("-q", "replay", "--offline", "--format", "json", *oracle)
    rows = json.loads(r.stdout)  # the whole of stdout
    assert r.returncode == 0 and [row["cassette"] for row in rows] == oracle
    assert all(row["outcome"] == "same" and row["same"] == "yes" for row in rows)
