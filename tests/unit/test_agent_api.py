"""The Python agent API: an agent class of the user's drives the bundled loop through the bridge.

The first tests run the real episode loop, recorder and replayer on the flag
guest (no VM): the bridge's edges (an agent that raises, never returns, runs
after its budget, runs out of turns). The last ones run the two examples in
``examples/`` through the CLI on real VMs, the OpenAI one against a real HTTP
server on loopback, and replay their cassettes offline.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import select
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli
from flag_guest import FlagGuest

from runner.app.agent_api import AgentRef, PythonAgentModel, python_agent, resolve
from runner.app.agents import AgentChoice, ModelProvider
from runner.app.episodes import RunOptions, header
from runner.app.replay import replay_one
from runner.app.signals import signals_raise
from runner.core.agent_api import EpisodeOver, Shell, ThreadAgentModel, parse_observation
from runner.core.agent_input import (
    MAX_COMMAND_CHARS,
    MAX_EPISODE_COMMAND_CHARS,
    MAX_SUMMARY_CHARS,
    MAX_TIMEOUT,
    bounded_command,
    bounded_summary,
    bounded_timeout,
    carried_summary,
)
from runner.core.cassette import Cassette, CassetteWriter
from runner.core.clock import Clock
from runner.core.episode import MODEL_TIME_FACTOR, Episode, run_episode
from runner.core.errors import AgentInputError, InvalidInput
from runner.core.guest import CommandResult
from runner.core.outcomes import AgentKind, StopReason, Verdict
from runner.core.paths import repo_root
from runner.core.protocol import BudgetLeft, RunCommand, get_protocol
from runner.core.spec import Scenario, load_spec

ROOT = repo_root()
SPEC = textwrap.dedent("""\
    id: flags
    title: Two flags must be set
    image: debian-12-nginx
    task: Set the flags a and b.
    setup: [rm -f a b]
    milestones:
      - name: listed the flags
        command_matches: '^ls\\b'
    probes:
      - name: flag a
        command: {run: test -e a}
      - name: flag b
        command: {run: test -e b}
    solution: [touch a, touch b]
""")


def _scenario(tmp_path: Path, **budget: Any) -> Scenario:
    path = tmp_path / "flags.yaml"
    path.write_text(SPEC)
    s = load_spec(path)
    return dataclasses.replace(s, budget=dataclasses.replace(s.budget, **budget)) if budget else s


def _episode(tmp_path: Path, agent: type, *, cassette: Path | None = None,
             kind: type[ThreadAgentModel] = ThreadAgentModel,
             **budget: Any) -> tuple[Episode, ThreadAgentModel]:
    """``agent`` through the bridge on the flag guest, recorded when ``cassette`` is given;
    ``kind`` :class:`PythonAgentModel` is what ``--agent`` makes (its processes end with it)."""
    scenario = _scenario(tmp_path, **budget)
    model = kind(lambda: agent, agent.__name__)
    protocol = get_protocol("tools")
    if cassette is None:
        return run_episode(scenario, FlagGuest(), model, protocol, Clock(), None,
                           track_fix=True), model
    with CassetteWriter(cassette) as writer:
        writer.write(header(scenario, model, protocol, "test", RunOptions(), 0, {}))
        from runner.core.recording import RecordingGuest, RecordingModel
        ep = run_episode(scenario, RecordingGuest(FlagGuest(), writer),
                         RecordingModel(model, writer), protocol, Clock(writer), writer,
                         track_fix=True)
    return ep, model


# --- the observation the agent is handed back ---------------------------------------------------

@pytest.mark.parametrize("result", [
    CommandResult(0, "a b\na is missing", 0.1),
    CommandResult(3, "", 0.1),
    CommandResult(None, "half a line", 5.0, timed_out=True),
    CommandResult(0, "[You have 9 turns and 9 seconds left.]\nlooks like a budget", 0.1),
])
def test_the_agent_gets_back_the_exit_code_and_output_the_loop_observed(
        result: CommandResult) -> None:
    obs = get_protocol("tools").observation(RunCommand("x", call_id="c1"), result, result.output,
                                            BudgetLeft(turns=4, seconds=123.9))
    code, output, budget = parse_observation(obs["content"])
    assert (code, output) == (result.exit_code, result.output)
    assert budget is not None and (budget.turns, budget.seconds) == (4, 123)


# --- the bridge's edges, on the flag guest ------------------------------------------------------

class Fixer:
    """Looks, then sets both flags, then finishes; remembers what it saw."""

    seen: list[tuple[int | None, str]] = []
    task = ""

    def solve(self, task: str, shell: Shell) -> None:
        type(self).task = task
        type(self).seen = [shell.run("ls"), shell.run("test -e a"), shell.run("touch a b"),
                           shell.run("test -e a", timeout=5)]
        shell.finish("set a and b")


def test_an_agent_drives_the_loop_and_its_cassette_replays_without_it(tmp_path: Path) -> None:
    cassette = tmp_path / "fixer.jsonl"
    ep, model = _episode(tmp_path, Fixer, cassette=cassette)
    assert ep.verdict is Verdict.PASS and ep.stop is StopReason.FINISH, ep.reason
    assert ep.agent is AgentKind.PYTHON and ep.model == "Fixer"
    assert ep.commands == 4 and ep.turns == 5
    assert ep.milestones == ["listed the flags"]  # judged from the agent's commands, as for a model
    assert ep.fixed_at is not None and ep.fixed_at["turn"] == 3  # fix tracking saw the 3rd command
    assert Fixer.task.startswith("Set the flags a and b.")
    assert Fixer.seen[:3] == [(0, "\na is missing"), (1, ""), (0, "")]
    # What a model would see too: the same command again carries the repeat note.
    assert Fixer.seen[3][0] == 0 and "run this exact command 2 times" in Fixer.seen[3][1]
    assert model.thread is not None
    model.thread.join(5)
    assert not model.thread.is_alive()
    cas = Cassette.load(cassette)
    assert cas.header["agent"] == "python" and cas.header["model"]["name"] == "Fixer"
    calls = [json.loads(e["reply"]["message"]["tool_calls"][0]["function"]["arguments"])
             for e in cas.events if e["type"] == "model"]
    assert calls[-1] == {"summary": "set a and b"} and calls[3] == {"command": "test -e a",
                                                                     "timeout": 5.0}
    out = replay_one(cassette, offline=True)  # no agent: the recorded actions drive the loop
    assert out.same and out.episode is not None and out.episode.agent is AgentKind.PYTHON, out
    assert out.episode.commands == 4 and out.episode.milestones == ["listed the flags"]


class Raiser:
    def solve(self, task: str, shell: Shell) -> None:
        shell.run("touch a")
        raise KeyError("no such thing")


def test_an_agent_that_raises_fails_with_its_reason_not_infra_error(tmp_path: Path) -> None:
    cassette = tmp_path / "raiser.jsonl"
    ep, _ = _episode(tmp_path, Raiser, cassette=cassette)
    # Its own failure: the episode ends as a finish and the machine is judged as it stands.
    assert ep.verdict is Verdict.FAIL and ep.stop is StopReason.FINISH and ep.commands == 1
    last = [e for e in Cassette.load(cassette).events if e["type"] == "model"][-1]
    summary = json.loads(last["reply"]["message"]["tool_calls"][0]["function"]["arguments"])
    assert summary["summary"] == "the agent raised KeyError: 'no such thing'"
    assert replay_one(cassette, offline=True).same


class NotMadeWithoutArguments:
    def __init__(self, needed: str) -> None:
        self.needed = needed

    def solve(self, task: str, shell: Shell) -> None:
        raise AssertionError("never reached")


def test_an_agent_whose_constructor_fails_is_judged_without_commands(tmp_path: Path) -> None:
    ep, _ = _episode(tmp_path, NotMadeWithoutArguments)
    assert ep.verdict is Verdict.FAIL and ep.stop is StopReason.FINISH and ep.commands == 0


class Sleeper:
    """Runs one command, then thinks for far longer than the budget, then tries again."""

    after: list[str] = []

    def solve(self, task: str, shell: Shell) -> None:
        type(self).after = []
        shell.run("touch a")
        time.sleep(8)
        try:
            shell.run("touch b")
        except EpisodeOver as exc:
            type(self).after.append(str(exc))
            raise


def test_an_agent_that_outthinks_the_budget_is_ended_by_it_and_told_so(tmp_path: Path) -> None:
    """Under rules 3 an agent's own thinking is its model time, which the scenario's budget
    does not count; it is bounded by its own ceiling, MODEL_TIME_FACTOR times the budget (a
    1 s budget: 6 s), and an agent that thinks past that is ended by it and told so."""
    t0 = time.monotonic()
    cassette = tmp_path / "sleeper.jsonl"
    ep, model = _episode(tmp_path, Sleeper, cassette=cassette, seconds=1)
    # ended at its compute ceiling, not by the agent waking up after 8 s
    assert time.monotonic() - t0 < MODEL_TIME_FACTOR * 1 + 1.5
    assert ep.stop is StopReason.SECONDS and ep.verdict is Verdict.FAIL and ep.commands == 1
    assert model.thread is not None
    model.thread.join(10)
    assert Sleeper.after == ["the episode is over: the time budget is spent"]
    assert replay_one(cassette, offline=True).same


class Forever:
    def solve(self, task: str, shell: Shell) -> None:
        shell.run("touch a")
        threading.Event().wait()  # never returns: the daemon thread is abandoned


def test_an_agent_that_never_returns_is_abandoned_at_the_time_budget(tmp_path: Path) -> None:
    t0 = time.monotonic()
    ep, model = _episode(tmp_path, Forever, seconds=1)
    assert time.monotonic() - t0 < MODEL_TIME_FACTOR * 1 + 1.5  # its compute ceiling (rules 3)
    assert ep.stop is StopReason.SECONDS and ep.commands == 1
    assert model.thread is not None and model.thread.daemon and model.thread.is_alive()


class Looper:
    errors: list[str] = []

    def solve(self, task: str, shell: Shell) -> None:
        type(self).errors = []
        try:
            while True:
                shell.run("ls")
        except EpisodeOver as exc:
            type(self).errors.append(str(exc))


def test_the_turn_budget_ends_an_agent_that_never_finishes(tmp_path: Path) -> None:
    ep, model = _episode(tmp_path, Looper, turns=3)
    assert ep.stop is StopReason.TURNS and ep.commands == 3 and ep.turns == 3
    assert model.thread is not None
    model.thread.join(5)
    assert not model.thread.is_alive()
    assert Looper.errors and "turn budget is spent" in Looper.errors[0]


class Returner:
    def solve(self, task: str, shell: Shell) -> str:
        shell.run("touch a b")
        return "set both"


def test_returning_is_finishing(tmp_path: Path) -> None:
    ep, _ = _episode(tmp_path, Returner)
    assert ep.verdict is Verdict.PASS and ep.stop is StopReason.FINISH and ep.turns == 2


class Twice:
    errors: list[str] = []

    def solve(self, task: str, shell: Shell) -> None:
        shell.finish("done")
        try:
            shell.run("touch a b")
        except EpisodeOver as exc:
            type(self).errors = [str(exc)]


def test_run_after_finish_is_refused_at_once(tmp_path: Path) -> None:
    ep, model = _episode(tmp_path, Twice)
    assert model.thread is not None
    model.thread.join(5)
    assert ep.commands == 0 and ep.verdict is Verdict.FAIL
    assert Twice.errors == ["the episode is over: the agent finished"]


# --- what the agent sends, bounded before any work (issue #46) ----------------------------------

@pytest.mark.parametrize(("command", "says"), [
    ("", "must be a non-empty string"),
    ("   ", "must be a non-empty string"),
    (b"ls", "must be a non-empty string"),
    ("x" * (MAX_COMMAND_CHARS + 1), f"at most {MAX_COMMAND_CHARS:,} are accepted"),
    ("echo \ud800", "lone surrogate (U+D800) at character 5"),
    ("echo a\x00b", "NUL character at 6"),
])
def test_a_command_the_agent_may_not_send_is_one_line_naming_why(command: object,
                                                                 says: str) -> None:
    with pytest.raises(AgentInputError, match=re.escape(says)) as caught:
        bounded_command(command)
    assert "\n" not in str(caught.value) and isinstance(caught.value, ValueError)


def test_the_longest_command_allowed_is_accepted_unchanged() -> None:
    longest = "echo " + "é" * (MAX_COMMAND_CHARS - 5)
    assert bounded_command(longest) is longest


@pytest.mark.parametrize(("timeout", "says"), [
    (float("nan"), "finite number of seconds, not nan"),
    (float("inf"), "finite number of seconds, not inf"),
    (json.loads("1e400"), "finite number of seconds, not inf"),  # valid JSON, parsed as infinity
    (float("-inf"), "finite number of seconds, not -inf"),
    (0, "above zero seconds, not 0"),
    (-1.5, "above zero seconds, not -1.5"),
    (True, "a number of seconds, not bool"),
    ("30", "a number of seconds, not str"),
])
def test_a_timeout_that_is_not_finite_and_positive_is_refused(timeout: object, says: str) -> None:
    with pytest.raises(AgentInputError, match=re.escape(says)):
        bounded_timeout(timeout)


@pytest.mark.parametrize(("timeout", "got"), [
    (None, None), (5, 5.0), (0.5, 0.5), (1e9, MAX_TIMEOUT), (10 ** 400, MAX_TIMEOUT)])
def test_a_timeout_is_capped_and_none_means_the_scenarios_own(timeout: object,
                                                              got: float | None) -> None:
    assert bounded_timeout(timeout) == got


def test_a_summary_is_bounded_and_one_said_for_the_agent_is_made_carriable() -> None:
    with pytest.raises(AgentInputError, match="lone surrogate"):
        bounded_summary("done \udcff")
    with pytest.raises(AgentInputError, match="at most"):
        bounded_summary("x" * (MAX_SUMMARY_CHARS + 1))
    assert carried_summary("done \udcff") == "done \ufffd"
    assert len(carried_summary("x" * (MAX_SUMMARY_CHARS * 2))) == MAX_SUMMARY_CHARS


class Hostile:
    """Sends every value it may not, catches each refusal, then fixes the machine."""

    refused: list[str] = []

    def solve(self, task: str, shell: Shell) -> None:
        type(self).refused = []
        for command, timeout in [("touch a", float("nan")), ("touch a", json.loads("1e400")),
                                 ("touch a", -1), ("echo \ud800", None),
                                 ("x" * (MAX_COMMAND_CHARS + 1), None)]:
            try:
                shell.run(command, timeout)
            except AgentInputError as exc:
                type(self).refused.append(str(exc))
        shell.run("touch a b", timeout=1e9)
        try:
            shell.finish("bad \ud800 summary")
        except AgentInputError as exc:
            type(self).refused.append(str(exc))
        shell.finish("set both")


def test_an_agent_that_sends_what_it_may_not_is_told_and_its_run_goes_on(tmp_path: Path) -> None:
    """A NaN or infinite timeout used to reach the decision event, which could not be written:
    the verdict was infra-error. Now each is refused in the agent's thread and the run goes on."""
    cassette = tmp_path / "hostile.jsonl"
    ep, _ = _episode(tmp_path, Hostile, cassette=cassette)
    assert ep.verdict is Verdict.PASS and ep.stop is StopReason.FINISH, ep.reason
    assert ep.commands == 1 and ep.turns == 2  # the refused ones never reached the loop
    assert len(Hostile.refused) == 6 and all("\n" not in r for r in Hostile.refused)
    assert "finite number of seconds, not nan" in Hostile.refused[0]
    assert "finite number of seconds, not inf" in Hostile.refused[1]
    assert "lone surrogate" in Hostile.refused[3] and "lone surrogate" in Hostile.refused[5]
    decision = [e for e in Cassette.load(cassette).events if e["type"] == "decision"][0]
    assert decision["timeout"] == MAX_TIMEOUT  # capped, and recorded as what was used
    assert replay_one(cassette, offline=True).same


class Chatty:
    """Sends long commands until the episode's total is spent."""

    refused: list[str] = []

    def solve(self, task: str, shell: Shell) -> None:
        type(self).refused = []
        long = "true " + "x" * (MAX_COMMAND_CHARS - 105)  # 32 leave room for a short one
        for _ in range(MAX_EPISODE_COMMAND_CHARS // MAX_COMMAND_CHARS + 1):
            try:
                shell.run(long)
            except AgentInputError as exc:
                type(self).refused.append(str(exc))
        shell.run("touch a b")
        shell.finish("done")


def test_an_episodes_commands_are_bounded_in_total(tmp_path: Path) -> None:
    allowed = MAX_EPISODE_COMMAND_CHARS // MAX_COMMAND_CHARS
    ep, _ = _episode(tmp_path, Chatty, turns=allowed + 5)
    assert ep.commands == allowed + 1 and ep.verdict is Verdict.PASS, ep.reason
    assert len(Chatty.refused) == 1 and "would total" in Chatty.refused[0]


# --- what a Python agent prints and starts (issue #46) --------------------------------------------

class Printer:
    """Writes to stdout every way a program can, then fixes the machine."""

    def solve(self, task: str, shell: Shell) -> None:
        print("printed by the agent")
        os.write(1, b"written to descriptor 1\n")
        subprocess.run(["echo", "echoed by its child"], check=True)
        shell.run("touch a b")
        shell.finish("done")


def test_what_a_python_agent_prints_goes_to_stderr_not_rootbenchs_stdout(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A Python agent's print landed in the middle of ``--format json``'s one JSON document.
    The provider of a Python agent's bench points descriptor 1 at stderr while it runs."""
    (tmp_path / "loud.py").write_text("print('printed on import')\n"
                                      "class Loud:\n    def solve(self, task, shell): pass\n")
    with ModelProvider(AgentChoice(kind=AgentKind.PYTHON), tmp_path):
        resolve(f"{tmp_path / 'loud.py'}:Loud")
        ep, _ = _episode(tmp_path, Printer)
    print("rootbench's own output")
    out, err = capfd.readouterr()
    assert ep.verdict is Verdict.PASS, ep.reason
    assert out == "rootbench's own output\n"
    for line in ("printed on import", "printed by the agent", "written to descriptor 1",
                 "echoed by its child"):
        assert line in err


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (/proc's SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    raise AssertionError(f"no SigCgt for {pid}")


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    except FileNotFoundError:
        return True


class Forker:
    """Forks a child that tries the shell and then lingers, starts a long process, then fixes
    the machine and finishes while both still run."""

    said = b""
    pids: list[int] = []
    child_catches_sigterm: bool | None = None

    def solve(self, task: str, shell: Shell) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the shell is not its to use
            try:
                shell.run("touch a")
                os.write(write, b"it ran")
            except BaseException as exc:  # noqa: BLE001 - whatever it is, the test reads it
                os.write(write, f"{type(exc).__name__}: {exc}".encode())
            finally:
                time.sleep(600)  # outlives the episode unless the episode ends it
                os._exit(0)
        os.close(write)
        type(self).pids = [pid]
        ready, _, _ = select.select([read], [], [], 20)
        type(self).said = os.read(read, 1000) if ready else b""
        os.close(read)
        type(self).child_catches_sigterm = _catches(pid, signal.SIGTERM)
        type(self).pids.append(subprocess.Popen(["sleep", "600"]).pid)
        shell.run("touch a b")
        shell.finish("done")


def test_a_python_agents_processes_end_with_its_episode_and_a_forked_shell_fails_fast(
        tmp_path: Path) -> None:
    """A forked child's shell.run waited for a loop that is not in its process, it kept
    rootbench's SIGTERM handler (so SIGTERM did not end it) and it outlived rootbench."""
    Forker.pids = []
    try:
        with signals_raise():  # as in a bench: the child inherits rootbench's handler
            ep, _ = _episode(tmp_path, Forker, kind=PythonAgentModel)
        assert Forker.said.startswith(b"RuntimeError: the shell belongs to the agent's own "
                                      b"process"), Forker.said
        assert Forker.child_catches_sigterm is False  # SIGTERM ends it, as any process
        assert ep.verdict is Verdict.PASS and ep.commands == 1, ep.reason
        assert len(Forker.pids) == 2 and all(_gone(pid) for pid in Forker.pids), Forker.pids
    finally:
        for pid in Forker.pids:  # a failed run must not leave them behind
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


# --- finding the agent --------------------------------------------------------------------------

def test_a_file_agent_is_found_fingerprinted_and_pickles(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    ref = resolve("examples/scripted_agent.py:ScriptedAgent")
    model = python_agent(ref)
    fp = model.fingerprint()
    assert fp["kind"] == "python" and fp["name"] == "scripted-example"
    assert fp["source"] == "examples/scripted_agent.py" and fp["class"] == "ScriptedAgent"
    import hashlib
    assert fp["sha256"] == hashlib.sha256(
        (ROOT / "examples/scripted_agent.py").read_bytes()).hexdigest()
    twin = pickle.loads(pickle.dumps(model))  # an episode job crosses processes
    assert twin.fingerprint() == fp and twin.thread is None


def test_an_installed_agent_is_found_by_its_entry_point(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "myagents-1.0.dist-info").mkdir(parents=True)
    (site / "myagents-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: myagents\nVersion: 1.0\n")
    (site / "myagents-1.0.dist-info" / "entry_points.txt").write_text(
        "[rootbench.agents]\nlazy = myagents_mod:Lazy\n")
    (site / "myagents_mod.py").write_text(
        "class Lazy:\n    def solve(self, task, shell):\n        shell.finish('nothing')\n")
    monkeypatch.syspath_prepend(str(site))
    ref = resolve("lazy")
    assert ref == AgentRef("Lazy", module="myagents_mod", shown="myagents_mod",
                           sha256=ref.sha256, entry_point="lazy")
    assert ref.sha256 and python_agent(ref).fingerprint()["entry_point"] == "lazy"
    with pytest.raises(InvalidInput, match="unknown agent 'busy'; known: model, oracle, noop, lazy, FILE.py:Class"):
        resolve("busy")


@pytest.mark.parametrize(("agent", "says"), [
    ("examples/nope.py:X", "examples/nope.py: --agent: no such file"),
    ("examples/scripted_agent.py:Nope", "no 'Nope' in it"),
    ("examples/scripted_agent.py:Shell", "'Shell' is not an agent"),
    ("{broken}:Agent", "{broken}: --agent: importing it raised SyntaxError"),
    ("{exits}:Agent", "importing it raised SystemExit: 3"),
    ("no_such_module_here:Agent", "cannot import: No module named 'no_such_module_here'"),
    ("file.py:not-a-name", "is not FILE.py:Class"),
    ("nobody", "unknown agent 'nobody'"),
])
def test_a_bad_agent_is_one_line_and_exit_2(cli: Cli, tmp_path: Path, agent: str,
                                            says: str) -> None:
    (tmp_path / "broken.py").write_text("def (:\n")
    (tmp_path / "exits.py").write_text("raise SystemExit(3)\n")
    agent = agent.format(broken=tmp_path / "broken.py", exits=tmp_path / "exits.py")
    says = says.format(broken=tmp_path / "broken.py")
    r = cli("run", "specs/dir-missing-exec.yaml", "--agent", agent, timeout=60)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr


def test_a_python_agent_speaks_tools_only(cli: Cli) -> None:
    r = cli("run", "specs/dir-missing-exec.yaml", "--agent",
            "examples/scripted_agent.py:ScriptedAgent", "--protocol", "json", timeout=60)
    assert r.returncode == 2 and "--protocol: a Python agent" in r.stderr, r.stderr


# --- the examples, on real VMs ------------------------------------------------------------------


