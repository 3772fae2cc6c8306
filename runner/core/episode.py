"""One episode: break the server, let the model at it, judge the result.

The order is fixed and the same in every mode (live, replay, offline):

1. baseline: the invariants must hold on the clean machine;
2. setup: the fault's commands, through the clean probe channel;
3. pre-check: the success probes must now fail (else the fault did not land,
   and the scenario, not the model, is at fault: ``invalid-scenario``);
4. the agent loop: one model call per turn, actions parsed by the protocol,
   commands run in the guest, results fed back, until ``finish`` or a budget
   runs out;
5. post-check: success probes (waiting up to their ``within``) and
   invariants decide the verdict; forbidden commands flag it ``unsafe``.

An infrastructure failure at any step makes the verdict ``infra-error``: it
is never counted for or against the model.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.core.cassette import CassetteWriter
from runner.core.clock import Clock
from runner.core.errors import ContextExhausted, GuestDown, InfraError, ModelServerError
from runner.core.guest import CommandResult, Guest
from runner.core.model import ChatRequest, Model
from runner.core.outcomes import AgentKind, Flag, ProbeOutcome, StopReason, Verdict
from runner.core.probes import ProbeResult, run_probes
from runner.core.protocol import BudgetLeft, Finish, Protocol, RunCommand, Violation
from runner.core.spec import Scenario
from runner.core.text import clean_text, one_line

log = logging.getLogger("rootbench.agent")
MODEL_CALL_CAP = 300.0  # seconds; no single model call may take longer
SETUP_TIMEOUT = 60.0  # seconds each fault command may take, whatever the agent's command_timeout


@dataclass
class Episode:
    """What happened in one run; this is what results files and tables show."""

    scenario: str
    agent: AgentKind
    model: str
    protocol: str
    round: int = 0  # which repeat of this scenario (0-based)
    verdict: Verdict = Verdict.FAIL
    flags: list[Flag] = field(default_factory=list)
    reason: str = ""  # one line: why this verdict
    seconds: float = 0.0
    turns: int = 0
    commands: int = 0
    violations: int = 0
    repeats: int = 0  # commands run again word for word (each got the repeat note)
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    prompt_ms: float = 0.0
    gen_ms: float = 0.0
    unsafe_commands: list[str] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    invariants: list[dict[str, Any]] = field(default_factory=list)
    precheck: list[dict[str, Any]] = field(default_factory=list)
    baseline: list[dict[str, Any]] = field(default_factory=list)
    stop: StopReason = StopReason.NOT_STARTED
    cassette: str | None = None

    def __post_init__(self) -> None:
        # Results files and cassettes hold plain strings; read them back as the vocabulary.
        self.agent = AgentKind(self.agent)
        self.verdict = Verdict(self.verdict)
        self.stop = StopReason(self.stop)
        self.flags = [Flag(f) for f in self.flags]

    @property
    def prompt_tps(self) -> float | None:
        evaluated = self.tokens_in - self.tokens_cached  # cached prompt tokens cost nothing
        return evaluated / (self.prompt_ms / 1000) if self.prompt_ms and evaluated > 0 else None

    @property
    def gen_tps(self) -> float | None:
        return self.tokens_out / (self.gen_ms / 1000) if self.gen_ms else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(agent=self.agent.value, verdict=self.verdict.value, stop=self.stop.value,
                 flags=[f.value for f in self.flags])
        d["prompt_tps"] = self.prompt_tps
        d["gen_tps"] = self.gen_tps
        return d


def _as_dicts(results: list[ProbeResult]) -> list[dict[str, Any]]:
    return [r.to_dict() for r in results]


def _cap(result: CommandResult, limit: int) -> str:
    text = clean_text(result.output)
    if len(text) > limit:
        text = text[:limit]
        result = CommandResult(result.exit_code, text, result.duration, result.timed_out, True)
    if result.truncated:
        text += f"\n[output truncated at {limit} characters]"
    return text


def _assistant_message(message: Any) -> dict[str, Any]:
    """The reply as it goes back into the history: only the fields chat templates know."""
    if not isinstance(message, dict):
        return {"role": "assistant", "content": str(message)}
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if isinstance(message.get("tool_calls"), list) and message["tool_calls"]:
        kept["tool_calls"] = message["tool_calls"]
    if kept["content"] is None and "tool_calls" not in kept:
        kept["content"] = ""
    return kept


class _Loop:
    """The agent loop's state; a class only so the steps can share it."""

    def __init__(self, scenario: Scenario, guest: Guest, model: Model, protocol: Protocol,
                 clock: Clock, episode: Episode) -> None:
        self.s = scenario
        self.guest = guest
        self.model = model
        self.protocol = protocol
        self.clock = clock
        self.ep = episode
        self.forbidden = [re.compile(rx) for rx in scenario.forbidden]
        self.runs: dict[str, int] = {}  # command -> times run, for the repeat note

    def left(self, started: float) -> BudgetLeft:
        return BudgetLeft(turns=max(self.s.budget.turns - self.ep.turns, 0),
                          seconds=max(self.s.budget.seconds - (self.clock.now() - started), 0.0))

    def run(self) -> None:
        budget = self.s.budget
        started = self.clock.now()
        first = BudgetLeft(turns=budget.turns, seconds=float(budget.seconds))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.protocol.system_prompt(self.s.system_prompt, first)},
            {"role": "user", "content": self.s.task},
        ]
        while True:
            left = self.left(started)
            if left.turns <= 0:
                self.ep.stop = StopReason.TURNS
                return
            if left.seconds <= 0:
                self.ep.stop = StopReason.SECONDS
                return
            request = self.protocol.decorate(ChatRequest(messages=list(messages)))
            try:
                reply = self.model.complete(request, timeout=min(left.seconds, MODEL_CALL_CAP))
            except ModelServerError as exc:
                if not (exc.out_of_time and left.seconds < MODEL_CALL_CAP):
                    raise
                # The call had only what was left of the scenario's time and used it all.
                self.ep.stop = StopReason.SECONDS
                log.info("  out of time while the model was answering")
                return
            except ContextExhausted as exc:
                self.ep.stop = StopReason.CONTEXT
                self.ep.flags.append(Flag.CONTEXT_FULL)
                log.info("  context: %s", one_line(str(exc), 120))
                return
            self.ep.turns += 1
            self._count_usage(reply.usage)
            messages.append(_assistant_message(reply.message))
            actions = self.protocol.parse(reply.message)
            for action in actions:
                if isinstance(action, Finish):
                    self.ep.stop = StopReason.FINISH
                    log.info("  finish: %s", one_line(action.summary, 100))
                    return
                if isinstance(action, Violation):
                    self.ep.violations += 1
                    log.info("  protocol: %s", one_line(action.reason, 100))
                    messages.append(self.protocol.correction(action, self.left(started)))
                    continue
                assert isinstance(action, RunCommand)
                messages.append(self._execute(action, started))

    def _execute(self, action: RunCommand, started: float) -> dict[str, Any]:
        budget = self.s.budget
        self.ep.commands += 1
        if any(rx.search(action.command) for rx in self.forbidden):
            self.ep.unsafe_commands.append(action.command)
        timeout = float(budget.command_timeout)
        if action.timeout:
            timeout = min(timeout, max(float(action.timeout), 1.0))
        timeout = max(1.0, min(timeout, self.left(started).seconds or 1.0))
        log.info("  $ %s", one_line(action.command, 120))
        result = self.guest.exec(action.command, timeout, budget.output_limit)
        output = _cap(result, budget.output_limit)
        # Small models loop on one command; saying so is the cheapest guardrail there is.
        key = action.command.strip()
        self.runs[key] = self.runs.get(key, 0) + 1
        if self.runs[key] > 1:
            self.ep.repeats += 1
            output += (f"\n[you have now run this exact command {self.runs[key]} times; "
                       "if it is not getting you closer, try something different]")
        return self.protocol.observation(action, result, output, self.left(started))

    def _count_usage(self, usage: dict[str, Any]) -> None:
        self.ep.tokens_in += int(usage.get("prompt_tokens") or 0)
        self.ep.tokens_out += int(usage.get("completion_tokens") or 0)
        self.ep.tokens_cached += int(usage.get("cached_tokens") or 0)
        self.ep.prompt_ms += float(usage.get("prompt_ms") or 0.0)
        self.ep.gen_ms += float(usage.get("predicted_ms") or 0.0)


def run_episode(scenario: Scenario, guest: Guest, model: Model, protocol: Protocol,
                clock: Clock, writer: CassetteWriter | None = None, *,
                vm_killed: Callable[[], bool] | None = None, round_: int = 0) -> Episode:
    """Run one scenario end to end on a ready guest and return its verdict.

    ``vm_killed`` tells a VM killed from outside (the host's fault: infra-error)
    from one the agent shut down or crashed (the model's fault: fail, vm-down).
    """
    t0 = time.monotonic()
    ep = Episode(scenario=scenario.id, agent=model.agent, model=model.name, protocol=protocol.name,
                 round=round_, cassette=str(writer.path) if writer else None)
    try:
        _phases(scenario, guest, model, protocol, clock, ep)
    except GuestDown as exc:
        if vm_killed is not None and vm_killed():
            ep.verdict, ep.stop = Verdict.INFRA_ERROR, StopReason.INFRA_ERROR
            ep.reason = f"the VM was killed from outside: {clean_text(str(exc))[:160]}"
        else:
            # The guest stopped answering while the agent acted: the agent broke the server.
            ep.verdict, ep.stop = Verdict.FAIL, StopReason.VM_DOWN
            ep.flags.append(Flag.VM_DOWN)
            ep.reason = f"the server stopped answering: {clean_text(str(exc))[:160]}"
    except InfraError as exc:
        ep.verdict, ep.stop = Verdict.INFRA_ERROR, StopReason.INFRA_ERROR
        ep.reason = clean_text(str(exc)).splitlines()[0][:200] if str(exc) else type(exc).__name__
    if ep.unsafe_commands and Flag.UNSAFE not in ep.flags:
        ep.flags.append(Flag.UNSAFE)
    ep.seconds = round(time.monotonic() - t0, 3)
    if writer is not None:
        writer.write({"type": "verdict", **ep.to_dict()})
    return ep


def _phases(scenario: Scenario, guest: Guest, model: Model, protocol: Protocol, clock: Clock,
            ep: Episode) -> None:
    baseline = run_probes(guest, scenario.invariants, clock, wait=False)
    ep.baseline = _as_dicts(baseline)
    for i, command in enumerate(scenario.setup):
        result = guest.run_clean(command, max(float(scenario.budget.command_timeout), SETUP_TIMEOUT))
        if result.timed_out or result.exit_code != 0:
            ep.verdict, ep.stop = Verdict.INVALID_SCENARIO, StopReason.INVALID_SCENARIO
            ep.reason = (f"setup[{i}] {'timed out' if result.timed_out else f'exited {result.exit_code}'}"
                         f": {clean_text(result.output)[-120:]}")
            return
    pre = run_probes(guest, scenario.probes, clock, wait=False)
    ep.precheck = _as_dicts(pre)
    if all(r.outcome is ProbeOutcome.PASS for r in pre):
        ep.verdict, ep.stop = Verdict.INVALID_SCENARIO, StopReason.INVALID_SCENARIO
        ep.reason = "the fault did not land: every success probe passed before the agent acted"
        return

    _Loop(scenario, guest, model, protocol, clock, ep).run()
    if not guest.alive():
        raise GuestDown("the guest is down after the agent's last command")

    post = run_probes(guest, scenario.probes, clock)
    ep.probes = _as_dicts(post)
    inv = run_probes(guest, scenario.invariants, clock)
    ep.invariants = _as_dicts(inv)
    if any(r.outcome is not ProbeOutcome.PASS for r in inv):
        ep.flags.append(Flag.COLLATERAL)
    failed = [r for r in post if r.outcome is ProbeOutcome.FAIL]
    errors = [r for r in post if r.outcome is ProbeOutcome.ERROR]
    if failed:
        ep.verdict = Verdict.FAIL
        ep.reason = f"{failed[0].name}: {failed[0].detail}"
    elif errors:
        ep.verdict = Verdict.INFRA_ERROR
        ep.reason = f"probe could not run: {errors[0].name}: {errors[0].detail}"
    else:
        ep.verdict = Verdict.PASS
        ep.reason = f"all {len(post)} probes passed"
