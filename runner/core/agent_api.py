"""Bring your own agent: the protocol an outside agent acts through, and the bridge into the loop.

An outside agent (a Python class of the user's, or an MCP client) is not a
model: it calls us, we do not call it. :class:`BridgeModel` inverts that so
the outside agent drives the *same* agent loop as the bundled one
(:class:`runner.core.episode._Loop`): each ``run(command)`` the agent makes
becomes the loop's next model reply (a ``run_command`` tool call), and the
loop's next ``complete()`` hands the command's result back to the waiting
agent. Budgets, forbidden commands, fix tracking, milestones, the verdict and
the cassette are therefore the bundled agent's code, not a copy: the cassette
records the agent's commands as model events and the guest's answers as guest
events, and a replay (offline, or on a real VM) needs no agent at all.

The agent's side (:class:`Shell`) and the loop's side (``complete``) live on
different threads and meet at two queues. Every wait is bounded by a
monotonic deadline taken from the budget line the loop itself writes, so an
agent that never acts is ended by the episode's time budget and an agent
thread whose episode is over is told so (:class:`EpisodeOver`) instead of
blocking for ever.

This module is pure: no backend, no file loading (that is
:mod:`runner.app.agent_api`), so the MCP server and the Python agent API
share it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from runner.core.agent_input import (
    MAX_EPISODE_COMMAND_CHARS,
    bounded_command,
    bounded_summary,
    bounded_timeout,
    carried_summary,
)
from runner.core.episode import MODEL_CALL_CAP
from runner.core.errors import AgentInputError, ModelServerError
from runner.core.model import ChatRequest, Model, ModelReply
from runner.core.outcomes import AgentKind
from runner.core.text import one_line

# No single step of an outside agent may take longer than the loop's cap on one model call.
STEP_CAP = MODEL_CALL_CAP
# Once the loop has the agent's command, how long past the time budget the agent may wait for
# the output before it is told the episode is over: the command itself (up to the scenario's
# command_timeout) plus fix tracking, which the loop does not charge to the agent.
_GRACE = 120.0
_FOREVER = 24 * 3600.0  # before the loop has said the budget (never, in practice)
_BUDGET = re.compile(r"\[?You have (\d+) turns and (\d+) seconds left\.\]?\s*$")
_HEAD = re.compile(r"exit code (-?\d+|None)$")
_TIMED_OUT = "the command timed out and was killed"


class EpisodeOver(RuntimeError):
    """Raised in the agent by ``Shell.run`` once the episode is over (budget spent or judged)."""


@dataclass(frozen=True)
class Budget:
    """What the agent has left, as of the loop's last message."""

    turns: int
    seconds: float


class Shell:
    """The agent's handle on the broken server: a root shell under the scenario's budget.

    ``run`` blocks until the command has run in the guest and returns
    ``(exit_code, output)``: ``exit_code`` is None when the command was
    killed at its timeout; ``output`` is stdout and stderr merged, cleaned
    and capped at the scenario's ``output_limit``, with the notes the bundled
    agent also gets (truncation, repeats). ``finish`` ends the episode; the
    machine is then judged. After the end, ``run`` raises :class:`EpisodeOver`.
    """

    def __init__(self, bridge: BridgeModel) -> None:
        self._bridge = bridge

    def run(self, command: str, timeout: float | None = None) -> tuple[int | None, str]:
        """Run ``command`` as root in the agent's shell (state persists between calls).

        Raises :class:`~runner.core.errors.AgentInputError` (a ``ValueError``) at once for a
        command or timeout it may not send (:mod:`runner.core.agent_input` says which: a
        command over 256 KiB, a timeout that is not a finite number above zero, a lone
        surrogate); nothing runs and the episode goes on.
        """
        return self._bridge.submit_run(command, timeout)

    def finish(self, summary: str = "") -> None:
        """Say the work is done: the episode ends and the machine is judged."""
        self._bridge.submit_finish(summary)

    @property
    def budget(self) -> Budget:
        """Turns and seconds left, as the loop last said (each command costs one turn)."""
        return self._bridge.budget()


@runtime_checkable
class Agent(Protocol):
    """What ``--agent path/to/file.py:Name`` names: a class made with no arguments.

    ``solve`` gets the task text (what the bundled agent's user message
    says, hints included) and a :class:`Shell`; it may keep state, call any
    model, and return when done. Returning without ``shell.finish()`` is a
    finish whose summary is the returned string (if any). Raising is the
    agent's own failure: the episode ends as a finish whose summary names the
    exception, and the machine is judged as it stands (not ``infra-error``:
    nothing in the harness broke).
    """

    def solve(self, task: str, shell: Shell) -> str | None: ...


def parse_observation(text: str) -> tuple[int | None, str, Budget | None]:
    """The exit code, output and budget in one of the loop's observations (see protocol.py).

    The observation is ``<head>\\n<output or (no output)>\\n[You have T turns and S seconds
    left.]``; the head is ``exit code N`` or the timed-out line.
    """
    lines = text.split("\n")
    budget = None
    if lines and (m := _BUDGET.search(lines[-1])):
        budget = Budget(int(m.group(1)), float(m.group(2)))
        lines = lines[:-1]
    head = lines[0] if lines else ""
    body = "\n".join(lines[1:])
    code: int | None = None
    if (m := _HEAD.match(head)) and m.group(1) != "None":
        code = int(m.group(1))
    elif head != _TIMED_OUT and not _HEAD.match(head):
        body = text  # not an observation of ours: hand it over whole
    return code, ("" if body == "(no output)" else body), budget


def _text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""


@dataclass(frozen=True)
class _Run:
    command: str
    timeout: float | None


@dataclass(frozen=True)
class _Finish:
    summary: str


class BridgeModel(Model):
    """The loop's model whose replies are an outside agent's actions (see the module docstring).

    Subclasses start the agent on the first ``complete`` (:meth:`start`);
    the MCP server's agent is already there. ``close`` ends the agent's side
    at once (the episode is over). Speaks native tool calls only: the
    actions are structured already, and the tools protocol keeps a
    command's timeout.
    """

    agent = AgentKind.PYTHON

    def __init__(self, name: str, identity: dict[str, Any] | None = None) -> None:
        self.name = name
        self._identity = dict(identity or {})
        self._reset()

    # An episode job is pickled to reach its worker (a child process, a Ray task): only what
    # identifies the agent travels; the queues and the lock are made afresh there.
    _RUNTIME: tuple[str, ...] = ("_actions", "_outputs", "_lock", "_over", "_wound_up", "_pid",
                                 "_waiting", "_started", "_turn", "_sent", "_budget", "_deadline",
                                 "thread")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._RUNTIME}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _reset(self) -> None:
        self._actions: queue.Queue[_Run | _Finish] = queue.Queue()
        self._outputs: queue.Queue[tuple[int | None, str] | EpisodeOver] = queue.Queue()
        self._lock = threading.Lock()
        self._over: str | None = None  # why the episode is over, once it is
        self._wound_up = False  # agent_over() has been called
        self._pid = os.getpid()  # the process the agent's shell belongs to
        self._waiting = False  # the agent is inside run(), waiting for its output
        self._started = False
        self._turn = 0
        self._sent = 0  # characters of command the agent has sent this episode
        self._budget = Budget(0, 0.0)
        self._deadline = float("inf")  # monotonic: the end of the time budget, as last told
        self.thread: threading.Thread | None = None

    # --- what the agent calls (its own thread) ---------------------------------------------

    def submit_run(self, command: object, timeout: object = None) -> tuple[int | None, str]:
        """Hand ``command`` to the loop and wait for its result (see :meth:`Shell.run`).

        The command and timeout are bounded first (:mod:`runner.core.agent_input`):
        a bad one raises :class:`AgentInputError` here, in the agent's thread,
        before the loop sees it, and the episode goes on.
        """
        self._check_process()
        command = bounded_command(command)
        seconds = bounded_timeout(timeout)
        with self._lock:
            self._check_open()
            if self._waiting:
                raise RuntimeError("run() is already waiting for a command: one at a time")
            if self._sent + len(command) > MAX_EPISODE_COMMAND_CHARS:
                raise AgentInputError(
                    f"this episode's commands would total {self._sent + len(command):,} "
                    f"characters; at most {MAX_EPISODE_COMMAND_CHARS:,} are accepted")
            self._sent += len(command)
            self._waiting = True
            # The loop caps the command at the budget's end; fix tracking may add a little.
            wait_until = self._deadline + _GRACE
        self._actions.put(_Run(command, seconds))
        try:
            wait = wait_until - time.monotonic()
            got = self._outputs.get(timeout=max(wait, 0.0) if wait < _FOREVER else _FOREVER)
        except queue.Empty:
            self._end("the time budget is spent")
            got = EpisodeOver("the episode is over: the time budget is spent")
        finally:
            with self._lock:
                self._waiting = False
        if isinstance(got, EpisodeOver):
            raise got
        return got

    def submit_finish(self, summary: object = "") -> None:
        """End the episode with ``summary`` (bounded first: a bad one raises
        :class:`AgentInputError` and the episode goes on)."""
        self._check_process()
        summary = bounded_summary(summary if isinstance(summary, str) else str(summary))
        with self._lock:
            self._check_open()
            self._over = "the agent finished"  # a run() after this is refused at once
        self._actions.put(_Finish(summary))

    def report_error(self, exc: BaseException) -> None:
        """The agent raised: its own failure, ended as a finish that names the exception."""
        text = one_line(carried_summary(f"{type(exc).__name__}: {exc}"), 300)
        self._actions.put(_Finish(f"the agent raised {text}"))

    def abandon(self, summary: str) -> None:
        """The agent is gone (an MCP client disconnected): the loop's next reply is a finish with
        ``summary``, so the machine is judged now rather than when the budget runs out."""
        if self._over is None:
            self._actions.put(_Finish(summary))
        self._end("the agent has gone")

    def budget(self) -> Budget:
        with self._lock:
            left = max(self._deadline - time.monotonic(), 0.0)
            return Budget(self._budget.turns, min(self._budget.seconds, left))

    def _check_process(self) -> None:
        """Refuse at once a call from a process the agent forked: its copy of the bridge has no
        loop behind it, so it would wait for an answer that never comes."""
        if os.getpid() != self._pid:
            raise RuntimeError("the shell belongs to the agent's own process, not to a process "
                               "it forked: nothing was run")

    def _check_open(self) -> None:
        if self._over is not None:
            raise EpisodeOver(f"the episode is over: {self._over}")
        if time.monotonic() >= self._deadline:
            raise EpisodeOver("the episode is over: the time budget is spent")

    def _end(self, why: str) -> None:
        """Mark the episode over, wake an agent waiting in run(), and (once) :meth:`agent_over`."""
        with self._lock:
            first = self._over is None
            if first:
                self._over = why
            wind_up, self._wound_up = not self._wound_up, True
        if first:
            self._outputs.put(EpisodeOver(f"the episode is over: {why}"))
        if wind_up:
            self.agent_over()

    def agent_over(self) -> None:
        """Called once, when the agent's part of the episode is over (it finished, the budget
        ended it, it went away, or the episode closed): a subclass ends what the agent
        started. Nothing here."""

    @property
    def over(self) -> str | None:
        """Why the episode is over, or None while it runs."""
        return self._over

    # --- what the loop calls -----------------------------------------------------------------

    def start(self, task: str) -> None:
        """Start the agent on ``task`` (called once, at the first ``complete``)."""

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        t0 = time.monotonic()
        messages = request.messages
        last = messages[-1] if messages else {}
        if not self._started:
            self._started = True
            system = _text(messages[0]) if messages else ""
            self._learn_budget(system.rsplit("\n", 1)[-1], t0)
            self.start(_text(last))
        else:
            code, output, budget = parse_observation(_text(last))
            if budget is not None:
                self._learn_budget(f"You have {budget.turns} turns and {int(budget.seconds)} "
                                   "seconds left.", t0)
            self._outputs.put((code, output))
        self._turn += 1
        try:
            action = self._actions.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            if timeout < STEP_CAP:
                self._end("the time budget is spent")
                raise ModelServerError("the agent did not act before the time budget ran out",
                                       out_of_time=True) from None
            self._end(f"one step took longer than {int(STEP_CAP)} s")
            action = _Finish(f"the agent took longer than {int(STEP_CAP)} s over one step")
        if isinstance(action, _Finish):
            self._end("the agent finished")
            call = {"name": "finish", "arguments": {"summary": action.summary}}
        else:
            args: dict[str, Any] = {"command": action.command}
            if action.timeout is not None:
                args["timeout"] = action.timeout
            call = {"name": "run_command", "arguments": args}
            if self._budget.turns <= 1:  # the loop runs this one, then stops: no output comes
                self._end("the turn budget is spent (the last command ran; its output is "
                          "not shown)")
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{self._turn}", "type": "function",
             "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]}
        return ModelReply(message=message, raw={"choices": [{"message": message}]},
                          duration=round(time.monotonic() - t0, 3))

    def _learn_budget(self, line: str, now: float) -> None:
        m = _BUDGET.search(line)
        if m is None:
            return
        with self._lock:
            self._budget = Budget(int(m.group(1)), float(m.group(2)))
            self._deadline = now + float(m.group(2)) + 1.0  # the line rounds seconds down

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": self.agent.value, "name": self.name, **self._identity}

    def close(self) -> None:
        """The episode is over: an agent waiting in ``run`` gets :class:`EpisodeOver` now."""
        self._end("the episode has ended")


class ThreadAgentModel(BridgeModel):
    """A Python agent (:class:`Agent`) run on its own daemon thread, driven through the bridge.

    The thread is a daemon and is never joined: an agent that never returns
    is simply abandoned when its episode's time budget ends it.
    """

    def __init__(self, factory: Callable[[], Callable[[], Agent]], name: str, identity: dict[str, Any] | None = None) -> None:
        self._factory = factory  # picklable; called on the agent's thread, gives an Agent class
        super().__init__(name, identity)

    def start(self, task: str) -> None:
        self.thread = threading.Thread(target=self._main, args=(task,), daemon=True,
                                       name=f"agent-{self.name}")
        self.thread.start()

    def agent_thread(self) -> contextlib.AbstractContextManager[None]:
        """What the agent's whole run on its thread is wrapped in: a subclass ends what the
        agent started when it returns. Nothing here."""
        return contextlib.nullcontext()

    def _main(self, task: str) -> None:
        with self.agent_thread():
            self._solve(task)

    def _solve(self, task: str) -> None:
        shell = Shell(self)
        try:
            agent = self._factory()()
            summary = agent.solve(task, shell)
        except EpisodeOver:
            return  # the loop ended first: nothing more to say
        except BaseException as exc:  # noqa: BLE001 - any failure of the user's code is its own verdict
            if self.over is None:
                self.report_error(exc)
            return
        if self.over is None:
            self._actions.put(_Finish(carried_summary(summary) if isinstance(summary, str) else
                                      "the agent returned without calling finish"))
