"""A cassette read back as a trajectory: the task, each turn's reply, what the agent did with it,
each command's result, and the setup before it.

This is what a person reads of a run (the report shows it) and what
:mod:`runner.app.atif` exports. What the loop did with each reply (the
command it ran, the correction it sent, the finish, whether a command
repeated) is read from the cassette's ``decision`` events, which the loop
writes as it acts; so a later change to a protocol's parser never changes how
a recorded run reads. Cassettes recorded before those events have each reply
parsed again with today's protocol classes.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from runner.app.html_report.fields import as_dict, as_list, integer, num, text
from runner.core.cassette import Cassette, digest
from runner.core.cassette_header import CassetteHeader
from runner.core.outcomes import Decided
from runner.core.protocol import PROTOCOLS, BudgetLeft, Finish, Protocol, RunCommand, Violation
from runner.core.spec import Scenario, task_text

LONG_OUTPUT_LINES = 12  # longer command output is folded
LONG_OUTPUT_CHARS = 1200


class DecisionsFrom(str, Enum):
    """Where a trajectory's account of what the loop did with each reply comes from."""

    RECORDED = "recorded"  # the cassette's decision events
    REPARSED = "reparsed"  # an older cassette: each reply parsed again by today's protocol

    @property
    def note(self) -> str:
        """What the report says of it, beside the turns."""
        if self is DecisionsFrom.RECORDED:
            return "what the loop did with each reply, as it recorded it"
        return ("what the loop did with each reply, worked out again by parsing the reply with "
                "this harness (the cassette predates recorded decisions; a parser changed since "
                "would show it differently)")


@dataclass
class Command:
    """One command the agent ran, with what came back."""

    command: str
    call_id: str | None = None
    timeout: float | None = None  # the timeout the agent asked for, if it did
    exit_code: int | None = None
    duration: float | None = None
    output: str = ""
    timed_out: bool = False
    truncated: bool = False
    guest_down: str = ""  # the guest stopped answering during this command
    ran: bool = True  # False: the cassette ends before the command's result
    unsafe: bool = False
    times_run: int = 1  # how often this exact command has run so far in the episode
    machine: str = ""  # the machine it ran on, in a multi-machine run ("" in a single-machine one)

    @property
    def long(self) -> bool:
        return self.output.count("\n") >= LONG_OUTPUT_LINES or len(self.output) > LONG_OUTPUT_CHARS


@dataclass
class Turn:
    """One model call and what the agent did with its reply."""

    number: int
    content: str = ""  # the reply's text as sent
    thought: str = ""  # the JSON protocol's "thought", when the reply has one
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments)
    commands: list[Command] = field(default_factory=list)
    finish: str | None = None  # the agent's summary, when it finished here
    corrections: list[str] = field(default_factory=list)  # protocol violations it was told about
    correction_texts: list[str] = field(default_factory=list)  # what it was told of each ("": unknown)
    error: str = ""  # a model call that failed (model-error)
    error_kind: str = ""
    seconds: float = 0.0  # the model call
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_ms: float = 0.0
    gen_ms: float = 0.0
    sent: str = ""  # the last message the model was sent (the task, an observation, a correction)
    sent_role: str = ""
    last_action: str = ""  # "command", "correction" or "finish": what the next request answers

    @property
    def correction_notes(self) -> list[tuple[str, str]]:
        """Each correction's reason, with the message the model was sent ("" when unknown)."""
        texts = self.correction_texts + [""] * (len(self.corrections) - len(self.correction_texts))
        return list(zip(self.corrections, texts, strict=False))

    @property
    def command_seconds(self) -> float:
        return sum(c.duration or 0.0 for c in self.commands)


@dataclass
class SetupStep:
    command: str
    exit_code: int | None
    duration: float | None
    output: str
    machine: str = ""  # the machine it ran on, in a multi-machine run


@dataclass
class Trajectory:
    """What one cassette says happened, ready to show or export."""

    path: Path
    header: dict[str, Any]  # the first line as recorded (ATIF's session id hashes it)
    head: CassetteHeader  # the same, typed and upgraded: what every lookup reads
    scenario: dict[str, Any]
    verdict: dict[str, Any] | None  # the Episode as written (None: the cassette was cut short)
    system_prompt: str = ""
    system_prompt_note: str = ""  # how sure we are the prompt shown is the one sent
    task: str = ""
    setup: list[SetupStep] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    # What the report calls the cassette, set by the loader: relative to the run directory, or
    # its file name; never a local absolute path.
    shown: str = ""
    decisions: DecisionsFrom = DecisionsFrom.RECORDED
    # A multi-machine run's machines in order (the first is where an exchange naming none ran)
    # and the agent's; empty in a single-machine run, whose page shows no machine at all.
    machines: list[str] = field(default_factory=list)
    agent_machine: str = ""

    @property
    def protocol(self) -> str:
        return text(self.head.protocol.name) or "?"

    @property
    def model_name(self) -> str:
        return text(self.head.model_name or "") or "?"


def _system_prompt(head: CassetteHeader, first_request: dict[str, Any]) -> tuple[str, str]:
    """The system prompt, rebuilt as the harness writes it, checked against the recorded digest."""
    scenario = as_dict(head.scenario)
    protocol = PROTOCOLS.get(head.protocol.name)
    budget = as_dict(scenario.get("budget"))
    if protocol is None or num(budget.get("turns")) is None or num(budget.get("seconds")) is None:
        return "", "not recorded, and the protocol or budget is unknown"
    own = scenario.get("system_prompt") if isinstance(scenario.get("system_prompt"), str) else None
    prompt = protocol().system_prompt(own, BudgetLeft(turns=integer(budget["turns"]),
                                                      seconds=float(budget["seconds"])))
    recorded = as_list(first_request.get("messages"))
    if not recorded:
        return prompt, "rebuilt by this harness (the cassette has no model call to check it against)"
    if recorded[0] == digest({"role": "system", "content": prompt}):
        return prompt, "exactly as sent (its digest matches the recording)"
    return prompt, ("as this harness would write it; the one sent then differs "
                    "(the recorded digest does not match)")


def _reply_text(message: Any) -> str:
    if not isinstance(message, dict):
        return text(message)
    content = message.get("content")
    if isinstance(content, list):
        return text("".join(str(as_dict(p).get("text", "")) for p in content))
    return text(content)


def _thought(content: str) -> str:
    try:
        obj = json.loads(content)
    except (ValueError, RecursionError):
        return ""
    return text(obj.get("thought")) if isinstance(obj, dict) else ""


def _tool_calls(message: Any) -> list[tuple[str, str, str]]:
    calls = []
    for call in as_list(as_dict(message).get("tool_calls")):
        fn = as_dict(as_dict(call).get("function"))
        args = fn.get("arguments")
        calls.append((text(as_dict(call).get("id")), text(fn.get("name")),
                      text(args if isinstance(args, str) else json.dumps(args))))
    return calls


def _usage(turn: Turn, usage: dict[str, Any]) -> None:
    turn.prompt_tokens = integer(usage.get("prompt_tokens"))
    turn.completion_tokens = integer(usage.get("completion_tokens"))
    turn.cached_tokens = integer(usage.get("cached_tokens"))
    turn.prompt_ms = num(usage.get("prompt_ms")) or 0.0
    turn.gen_ms = num(usage.get("predicted_ms")) or 0.0


def _result(cmd: Command, event: dict[str, Any]) -> None:
    result = as_dict(event.get("result"))
    if result.get("error") == "guest-down":
        cmd.guest_down = text(result.get("message")) or "the guest stopped answering"
        return
    code = num(result.get("exit_code"))
    cmd.exit_code = int(code) if code is not None else None
    cmd.duration = num(result.get("duration"))
    cmd.output = text(result.get("output"))
    cmd.timed_out = bool(result.get("timed_out"))
    cmd.truncated = bool(result.get("truncated"))


def _task(scenario: dict[str, Any], level: int) -> str:
    """The task as the model was sent it: with the header's hint level, ending with its hints."""
    task = scenario.get("task")
    hints = tuple(h for h in as_list(scenario.get("hints")) if isinstance(h, str))
    if isinstance(task, str) and 0 < level <= len(hints):
        return text(task_text(Scenario(id="", title="", image="", task=task, hints=hints), level))
    return text(task)


def load_trajectory(path: Path | str) -> Trajectory:
    """Read a cassette back as a trajectory (raises InvalidInput if it is not a cassette).

    What the loop did with each reply comes from the cassette's ``decision``
    events, which the loop wrote as it acted; a cassette with none (recorded
    before the loop wrote them) has each reply parsed again with today's
    protocol classes, which is what the loop then did unless a parser changed
    since (:attr:`Trajectory.decisions` says which).
    """
    cas = Cassette.load(path)
    scenario = as_dict(cas.head.scenario)
    traj = Trajectory(path=Path(path), header=cas.header, head=cas.head, scenario=scenario,
                      verdict=cas.verdict, task=_task(scenario, cas.head.hint_level))
    unsafe = {c for c in as_list(as_dict(cas.verdict).get("unsafe_commands")) if isinstance(c, str)}
    reparse: _Reparse | None = None
    if not any(e.get("type") == "decision" for e in cas.events):
        traj.decisions = DecisionsFrom.REPARSED
        reparse = _Reparse(PROTOCOLS.get(cas.head.protocol.name), unsafe)
    setup = [c for c in as_list(scenario.get("setup")) if isinstance(c, str)]
    traj.machines = [text(as_dict(m).get("name")) for m in as_list(scenario.get("machines"))]
    if traj.machines:
        traj.agent_machine = text(scenario.get("agent_machine")) or traj.machines[0]
    runs: Counter[str] = Counter()  # only for an exec no decision foretold
    turn: Turn | None = None
    pending: list[Command] = []  # commands of the current turn still waiting for their result
    first_request: dict[str, Any] = {}

    for event in cas.events:
        kind = event.get("type")
        if kind in ("model", "model-error"):
            request = as_dict(event.get("request"))
            first_request = first_request or request
            turn = Turn(number=integer(event.get("turn")) or len(traj.turns) + 1)
            last = as_dict(request.get("last"))
            turn.sent, turn.sent_role = text(last.get("content")), text(last.get("role"))
            traj.turns.append(turn)
            pending = []
            if kind == "model-error":
                turn.error = text(event.get("error")) or "the model call failed"
                turn.error_kind = text(event.get("kind"))
                continue
            reply = as_dict(event.get("reply"))
            message = reply.get("message")
            turn.content = _reply_text(message)
            turn.thought = _thought(turn.content) if traj.protocol == "json" else ""
            turn.tool_calls = _tool_calls(message)
            turn.seconds = num(reply.get("duration")) or 0.0
            _usage(turn, as_dict(reply.get("usage")))
            if reparse is not None:
                pending += reparse.turn(turn, message)
        elif kind == "decision" and turn is not None and not turn.error:
            cmd = _decided(turn, event)
            if cmd is not None:
                pending.append(cmd)
        elif kind == "guest":
            op = event.get("op")
            given = as_dict(event.get("input"))
            next_setup = setup[len(traj.setup)] if len(traj.setup) < len(setup) else None
            machine = (text(event.get("machine")) or traj.machines[0]) if traj.machines else ""
            if turn is None and op in ("clean", "probe") and given.get("command") == next_setup:
                result = as_dict(event.get("result"))
                code = num(result.get("exit_code"))
                traj.setup.append(SetupStep(text(given.get("command")),
                                            int(code) if code is not None else None,
                                            num(result.get("duration")), text(result.get("output")),
                                            machine))
            elif op == "exec" and turn is not None:
                cmd = pending.pop(0) if pending else None
                if cmd is None:  # a command no decision foretold: show it all the same
                    key = str(given.get("command", "")).strip()
                    runs[key] += 1
                    cmd = Command(command=text(given.get("command")), times_run=runs[key])
                    turn.commands.append(cmd)
                cmd.ran = True
                cmd.machine = machine
                _result(cmd, event)
    traj.system_prompt, traj.system_prompt_note = _system_prompt(cas.head, first_request)
    return traj


def _decided(turn: Turn, event: dict[str, Any]) -> Command | None:
    """One recorded decision added to its turn; the command it ran, waiting for its result."""
    action = event.get("action")
    call_id = event.get("call_id") if isinstance(event.get("call_id"), str) else None
    if action == Decided.FINISH:
        turn.finish = text(event.get("summary"))
        turn.last_action = "finish"
    elif action == Decided.NONE:
        turn.corrections.append(text(event.get("reason")))
        turn.correction_texts.append(text(event.get("correction")))
        turn.last_action = "correction"
    elif action == Decided.COMMAND:
        forbidden = event.get("forbidden")
        cmd = Command(command=text(event.get("command")), call_id=call_id,
                      timeout=num(event.get("timeout")),
                      unsafe=isinstance(forbidden, str) and bool(forbidden),
                      times_run=max(integer(event.get("times_run")), 1), ran=False)
        turn.commands.append(cmd)
        turn.last_action = "command"
        return cmd
    return None


class _Reparse:
    """What the loop did with each reply, worked out again for a cassette that does not say:
    the reply parsed with today's protocol class, repeats counted as the loop counts them."""

    def __init__(self, protocol: type[Protocol] | None, unsafe: set[str]) -> None:
        self.protocol = protocol
        self.unsafe = unsafe  # the verdict's forbidden commands
        self.runs: Counter[str] = Counter()

    def turn(self, turn: Turn, message: Any) -> list[Command]:
        """Fill ``turn`` from its reply; the commands it ran, waiting for their results."""
        actions = self.protocol().parse(message if isinstance(message, dict) else {}) \
            if self.protocol else []
        ran = []
        for action in actions:
            if isinstance(action, Finish):
                turn.finish = text(action.summary)
                turn.last_action = "finish"
                break  # the loop stops at a finish: later actions never ran
            if isinstance(action, Violation):
                turn.corrections.append(text(action.reason))
                turn.correction_texts.append("")  # what it was told is not recorded
                turn.last_action = "correction"
            elif isinstance(action, RunCommand):
                key = action.command.strip()
                self.runs[key] += 1
                turn.last_action = "command"
                cmd = Command(command=text(action.command), call_id=action.call_id,
                              timeout=action.timeout, unsafe=action.command in self.unsafe,
                              times_run=self.runs[key], ran=False)
                turn.commands.append(cmd)
                ran.append(cmd)
        return ran
