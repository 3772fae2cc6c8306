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

Each step's wall time is kept in ``Episode.phases`` (see :data:`PHASES`), so
a slow benchmark can be traced to the step that made it slow. The phases are
timings, not grades: replay never compares them.

Beyond pass/fail, each run is graded so that two models that both fail can
still be told apart: ``score`` (the weighted share of success probes that
pass at the end), ``milestones`` (evidence in the transcript that the agent
found the cause), and with fix tracking on, ``fixed_at`` and ``regressed``
(the success probes re-run, without waiting, after every agent command).
Everything is computed from what the loop saw, so replay reproduces it.

An infrastructure failure at any step makes the verdict ``infra-error``: it
is never counted for or against the model.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.core.cassette import CassetteWriter
from runner.core.clock import Clock
from runner.core.errors import ContextExhausted, GuestDown, InfraError, ModelServerError
from runner.core.guest import CommandResult, Guest
from runner.core.model import ChatRequest, Model
from runner.core.outcomes import AgentKind, Flag, ProbeOutcome, StopReason, Verdict
from runner.core.patterns import compile_pattern
from runner.core.probes import ProbeResult, run_probes
from runner.core.protocol import BudgetLeft, Finish, Protocol, RunCommand, Violation
from runner.core.rules import CURRENT_RULES, Rules
from runner.core.spec import Probe, Scenario, task_text
from runner.core.text import clean_text, one_line

log = logging.getLogger("rootbench.agent")
MODEL_CALL_CAP = 300.0  # seconds; no single model call may take longer
SETUP_TIMEOUT = 60.0  # seconds each fault command may take, whatever the agent's command_timeout
# The steps of an episode whose wall time ``Episode.phases`` keeps, in the order they run.
# ``restore`` (sandbox start to a ready guest) happens before run_episode and is handed in by
# whoever made the sandbox; the probe re-runs of fix tracking count as ``agent`` (they happen
# inside the loop), the final judging (guest alive, success probes, invariants) as ``probes``.
PHASES = ("restore", "baseline", "setup", "pre_check", "agent", "probes")


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
    hint_level: int = 0  # how many of the scenario's hints the task carried
    score: float | None = None  # weighted share of success probes passing; None: not scored
    milestones: list[str] = field(default_factory=list)  # names reached, in the order reached
    milestone_fraction: float | None = None  # None: the scenario has none, or the run is not scored
    fixed_at: dict[str, Any] | None = None  # {"turn", "seconds"}: probes first all passed
    regressed: bool | None = None  # fixed, then broken again; None: fix tracking was off
    # The bench matrix cell (``<model>-<protocol>`` as asked) when a bench runs several models
    # or protocols; None in a bench of one, whose results look as they always did.
    arm: str | None = None
    # Wall-clock (epoch seconds) when the episode's worker began and ended it; None when unknown
    # (older results, a replayed recording). With --jobs N they show which episodes overlapped.
    started: float | None = None
    ended: float | None = None
    # Seconds each phase took (names from PHASES, in the order they ran, rounded to ms); only
    # the phases that began are here. Timings, not grades: replay never compares them, and
    # results and cassettes from before they existed read back with none.
    phases: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Results files and cassettes hold plain strings; read them back as the vocabulary.
        self.agent = AgentKind(self.agent)
        self.verdict = Verdict(self.verdict)
        self.stop = StopReason(self.stop)
        self.flags = [Flag(f) for f in self.flags]
        # JSON may hold a whole second as 0 or 2; a copy, so the caller's dict is not shared.
        self.phases = {str(k): float(v) for k, v in self.phases.items()}

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


def dominant_phase(phases: Mapping[str, float]) -> tuple[str, float]:
    """The phase that took the most time and its share of all of them: where to look first.

    A tie goes to the phase that ran first. With no phases (a run whose
    sandbox never came up) the answer is ``("", 0.0)``, and with phases that
    all took no measurable time it is the first one at ``0.0``, so a caller
    printing figures for any episode never has to guard against dividing by 0.
    """
    if not phases:
        return "", 0.0
    name = max(phases, key=lambda k: phases[k])  # max keeps the first of equal values
    total = sum(phases.values())
    return name, (phases[name] / total if total > 0 else 0.0)


@contextlib.contextmanager
def _phase(ep: Episode, name: str) -> Iterator[None]:
    """Time the ``with`` body into ``ep.phases[name]``, even when it ends by an exception.

    A phase cut short (the guest went down, the model server failed) still
    ran, and its time is part of what the episode cost. It reads the host's
    monotonic clock, as ``Episode.seconds`` does, never the run's
    :class:`Clock`: a Clock reading is recorded in the cassette and served
    back in order on replay, so reading it here would add events that every
    cassette recorded before phases existed lacks.
    """
    t0 = time.monotonic()
    try:
        yield
    finally:
        ep.phases[name] = round(time.monotonic() - t0, 3)


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


def weighted_score(probes: Sequence[Probe], results: Sequence[ProbeResult]) -> float:
    """The weighted share of ``probes`` whose result passed: 1.0 exactly when every one did."""
    total = sum(p.weight for p in probes)
    passed = sum(p.weight for p, r in zip(probes, results, strict=True)
                 if r.outcome is ProbeOutcome.PASS)
    return 1.0 if passed == total else passed / total


class _Loop:
    """The agent loop's state; a class only so the steps can share it."""

    def __init__(self, scenario: Scenario, guest: Guest, model: Model, protocol: Protocol,
                 clock: Clock, episode: Episode, *, track_fix: bool = False,
                 rules: Rules = CURRENT_RULES) -> None:
        self.s = scenario
        self.rules = rules
        self.guest = guest
        self.model = model
        self.protocol = protocol
        self.clock = clock
        self.ep = episode
        self.forbidden = [compile_pattern(rx) for rx in scenario.forbidden]  # RE2: linear time
        self.runs: dict[str, int] = {}  # command -> times run, for the repeat note
        self.track_fix = track_fix
        self.first_command_at: float | None = None  # clock reading, only when tracking
        self.last_command_turn = 0
        self.tracking_seconds = 0.0  # spent re-running probes: the harness's time, not the agent's

    def left(self, started: float) -> BudgetLeft:
        return BudgetLeft(turns=max(self.s.budget.turns - self.ep.turns, 0),
                          seconds=max(self.s.budget.seconds - (self.clock.now() - started
                                                               - self.tracking_seconds), 0.0))

    def run(self) -> None:
        budget = self.s.budget
        started = self.clock.now()
        first = BudgetLeft(turns=budget.turns, seconds=float(budget.seconds))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.protocol.system_prompt(self.s.system_prompt, first)},
            {"role": "user", "content": task_text(self.s, self.ep.hint_level)},
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
        if self.track_fix and self.first_command_at is None:
            self.first_command_at = self.clock.now()
        result = self.guest.exec(action.command, timeout, budget.output_limit)
        self.last_command_turn = self.ep.turns
        output = _cap(result, budget.output_limit)
        for m in self.s.milestones:  # what the agent saw, before the repeat note is added
            if m.name not in self.ep.milestones and m.reached_by(action.command, output):
                self.ep.milestones.append(m.name)
        if self.track_fix:
            self._track()
        # Small models loop on one command; saying so is the cheapest guardrail there is.
        key = action.command.strip()
        self.runs[key] = self.runs.get(key, 0) + 1
        if self.runs[key] > 1:
            self.ep.repeats += 1
            output += (f"\n[you have now run this exact command {self.runs[key]} times; "
                       "if it is not getting you closer, try something different]")
        return self.protocol.observation(action, result, output, self.left(started))

    def _track(self) -> None:
        """Re-run the success probes without waiting: when was it first fixed, did it break again?

        The time this takes is not taken from the agent's budget: tracking is
        the harness watching, and must not make a run end sooner.
        """
        t0 = self.clock.now()
        results = run_probes(self.guest, self.s.probes, self.clock, rules=self.rules, wait=False)
        fixed = all(r.outcome is ProbeOutcome.PASS for r in results)
        if fixed and self.ep.fixed_at is None:
            self.mark_fixed(t0)
        elif not fixed and self.ep.fixed_at is not None:
            self.ep.regressed = True
        self.tracking_seconds += max(self.clock.now() - t0, 0.0)

    def mark_fixed(self, at: float | None = None) -> None:
        """Fixed as of the last agent command: its turn, and the agent's seconds from its first
        command to ``at`` (default now), the time spent tracking left out."""
        assert self.first_command_at is not None
        at = self.clock.now() if at is None else at
        seconds = at - self.first_command_at - self.tracking_seconds
        self.ep.fixed_at = {"turn": self.last_command_turn, "seconds": round(max(seconds, 0.0), 3)}

    def _count_usage(self, usage: dict[str, Any]) -> None:
        self.ep.tokens_in += int(usage.get("prompt_tokens") or 0)
        self.ep.tokens_out += int(usage.get("completion_tokens") or 0)
        self.ep.tokens_cached += int(usage.get("cached_tokens") or 0)
        self.ep.prompt_ms += float(usage.get("prompt_ms") or 0.0)
        self.ep.gen_ms += float(usage.get("predicted_ms") or 0.0)


def run_episode(scenario: Scenario, guest: Guest, model: Model, protocol: Protocol,
                clock: Clock, writer: CassetteWriter | None = None, *,
                vm_killed: Callable[[], bool] | None = None, round_: int = 0,
                hint_level: int = 0, track_fix: bool = False,
                restore_seconds: float | None = None,
                rules: Rules = CURRENT_RULES) -> Episode:
    """Run one scenario end to end on a ready guest and return its verdict.

    ``vm_killed`` tells a VM killed from outside (the host's fault: infra-error)
    from one the agent shut down or crashed (the model's fault: fail, vm-down).
    ``hint_level`` ends the task with that many of the scenario's hints.
    ``track_fix`` re-runs the success probes after every agent command (more
    guest exchanges, so a replay must be told the same: the cassette header
    records it). ``restore_seconds`` is how long the caller's sandbox took to
    give a ready guest: it happened before this call, and is recorded as the
    first phase so the verdict line holds every phase (None: there was no
    sandbox, as in an offline replay). ``rules`` are the judging rules
    (:mod:`runner.core.rules`): a replay passes the ones its cassette was
    recorded under.
    """
    t0 = time.monotonic()
    task_text(scenario, hint_level)  # a level the scenario has no hints for is refused at once
    ep = Episode(scenario=scenario.id, agent=model.agent, model=model.name, protocol=protocol.name,
                 round=round_, cassette=str(writer.path) if writer else None,
                 hint_level=hint_level, regressed=False if track_fix else None)
    if restore_seconds is not None:
        ep.phases["restore"] = round(max(restore_seconds, 0.0), 3)
    try:
        _phases(scenario, guest, model, protocol, clock, ep, track_fix=track_fix, rules=rules)
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
    _grade(scenario, ep)
    ep.seconds = round(time.monotonic() - t0, 3)
    if writer is not None:
        writer.write({"type": "verdict", **ep.to_dict()})
    return ep


def _grade(scenario: Scenario, ep: Episode) -> None:
    """Score and milestone fraction for a scored run; None for one that says nothing of the model.

    A scored run whose final probes never ran (the agent took the server
    down) scores 0: nothing it was asked to fix can be shown to work.
    """
    if not ep.verdict.scored:
        ep.score = ep.milestone_fraction = None
        return
    if ep.verdict is Verdict.PASS:
        ep.score = 1.0
    elif ep.score is None:
        ep.score = 0.0
    if scenario.milestones:
        ep.milestone_fraction = len(ep.milestones) / len(scenario.milestones)


def _phases(scenario: Scenario, guest: Guest, model: Model, protocol: Protocol, clock: Clock,
            ep: Episode, *, track_fix: bool = False, rules: Rules = CURRENT_RULES) -> None:
    """The steps after the restore, each timed under its name in :data:`PHASES`.

    A step that ends the run (the fault did not land, a setup command failed)
    returns from inside its ``with``, so the phases that never began are absent.
    """
    with _phase(ep, "baseline"):
        baseline = run_probes(guest, scenario.invariants, clock, rules=rules, wait=False)
        ep.baseline = _as_dicts(baseline)
    with _phase(ep, "setup"):
        for i, command in enumerate(scenario.setup):
            result = guest.run_clean(command, max(float(scenario.budget.command_timeout),
                                                  SETUP_TIMEOUT))
            if result.timed_out or result.exit_code != 0:
                ep.verdict, ep.stop = Verdict.INVALID_SCENARIO, StopReason.INVALID_SCENARIO
                ep.reason = (f"setup[{i}] "
                             f"{'timed out' if result.timed_out else f'exited {result.exit_code}'}"
                             f": {clean_text(result.output)[-120:]}")
                return
    with _phase(ep, "pre_check"):
        pre = run_probes(guest, scenario.probes, clock, rules=rules, wait=False)
        ep.precheck = _as_dicts(pre)
        if all(r.outcome is ProbeOutcome.PASS for r in pre):
            ep.verdict, ep.stop = Verdict.INVALID_SCENARIO, StopReason.INVALID_SCENARIO
            ep.reason = "the fault did not land: every success probe passed before the agent acted"
            return

    with _phase(ep, "agent"):
        loop = _Loop(scenario, guest, model, protocol, clock, ep, track_fix=track_fix,
                     rules=rules)
        loop.run()
    with _phase(ep, "probes"):
        _judge(scenario, guest, clock, ep, loop, track_fix=track_fix)


def _judge(scenario: Scenario, guest: Guest, clock: Clock, ep: Episode, loop: _Loop, *,
           track_fix: bool) -> None:
    """The post-check: is the guest up, do the success probes and the invariants pass."""
    if not guest.alive():
        raise GuestDown("the guest is down after the agent's last command")

    post = run_probes(guest, scenario.probes, clock, rules=loop.rules)
    ep.probes = _as_dicts(post)
    ep.score = weighted_score(scenario.probes, post)
    if track_fix and loop.first_command_at is not None:
        fixed = all(r.outcome is ProbeOutcome.PASS for r in post)
        if fixed and ep.fixed_at is None:
            # Fixed by the last command, but only once the probes' ``within`` had let it settle.
            loop.mark_fixed()
        elif not fixed and ep.fixed_at is not None:
            ep.regressed = True
    inv = run_probes(guest, scenario.invariants, clock, rules=loop.rules)
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
