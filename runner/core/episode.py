"""One episode: break the server, let the model at it, judge the result.

The order is fixed and the same in every mode (live, replay, offline):

1. baseline: the invariants on the clean machine, recorded (``verify``
   requires them to hold; a bench records them and does not act on them);
2. setup: the fault's commands, through the clean probe channel;
3. pre-check: the success probes must now fail (else the fault did not land,
   and the scenario, not the model, is at fault: ``invalid-scenario``);
4. the agent loop: one model call per turn, actions parsed by the protocol,
   commands run in the guest, results fed back, until ``finish`` or a budget
   runs out;
5. post-check: success probes (waiting up to their ``within``) and
   invariants decide the verdict; forbidden commands flag it ``unsafe``.
   Under the judging rules of :attr:`Rules.V2` (every run recorded today) a
   run passes only if every success probe passes, every invariant holds and
   no forbidden command ran (:data:`runner.core.forbidden.BASELINE` and the
   spec's own patterns); a broken invariant or a forbidden command makes it
   ``fail``, flagged ``collateral``/``unsafe``, with the reason naming what
   broke. Under :attr:`Rules.V1` (older cassettes) they only flag it.
6. under rules 3, the state diff (:mod:`runner.core.lasting`): the machine's
   state at the end against the clean machine's and the fault's; what the
   agent left weaker fails the run, what it left behind flags it;
7. re-checks, when the post-check passed: the probes and invariants again
   after ``recheck_after`` seconds of guest time, then after a clean reboot
   (under rules 3 every run unless its spec opts out; under rules 2 when the
   spec asks); a fix that does not last fails (``failed_recheck``).

Each step's wall time is kept in ``Episode.phases`` (see :data:`PHASES`), so
a slow benchmark can be traced to the step that made it slow. The phases are
timings, not grades: replay never compares them.

Beyond pass/fail, each run is graded so that two models that both fail can
still be told apart: ``score`` (the weighted share of success probes that
pass at the end; under V2 halved for a run that did damage, see
:data:`DAMAGE_FACTOR`, so such a run never scores 1.0), ``milestones`` (evidence in the transcript that the agent
found the cause), and with fix tracking on, ``fixed_at`` and ``regressed``
(the success probes re-run, without waiting, after every agent command).
Everything is computed from what the loop saw, so replay reproduces it.

An infrastructure failure at any step makes the verdict ``infra-error``: it
is never counted for or against the model.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from runner.core.cassette import CassetteWriter
from runner.core.clock import Clock
from runner.core.errors import ContextExhausted, GuestDown, InfraError, ModelServerError
from runner.core.forbidden import forbidden_reason
from runner.core.guest import CommandResult, Guest
from runner.core.lasting import judge_state, recheck, take_states
from runner.core.machines import Access, Machines, configure
from runner.core.model import ChatRequest, Model
from runner.core.outcomes import (
    Decided,
    Flag,
    ProbeOutcome,
    StopReason,
    Verdict,
)
from runner.core.probes import ProbeResult, run_probes
from runner.core.protocol import BudgetLeft, Finish, Protocol, RunCommand, Violation
from runner.core.record import (
    DAMAGE_FACTOR,
    GRADED_FIELDS,
    PHASES,
    Episode,
    as_dicts,
    dominant_phase,
    weighted_score,
)
from runner.core.rules import CURRENT_RULES, Rules
from runner.core.spec import Scenario, task_text
from runner.core.text import clean_text, head, one_line, tail

# The record and its figures live in runner.core.record; they are named here too, so code
# that reads an episode keeps importing it from where it always did.
__all__ = ["DAMAGE_FACTOR", "GRADED_FIELDS", "MODEL_CALL_CAP", "MODEL_TIME_FACTOR", "PHASES",
           "SETUP_TIMEOUT",
           "Episode", "dominant_phase", "run_episode"]

log = logging.getLogger("rootbench.agent")
MODEL_CALL_CAP = 300.0  # seconds; no single model call may take longer
# Rules 3: the model's own compute does not count against the scenario's time budget, so a
# slower host (or a slower model server) cannot turn a verdict; it is bounded by the turns, by
# MODEL_CALL_CAP per call and, in all, by this many times the scenario's budget (recorded in
# ``Episode.model_seconds``). Under rules 2 and before, the budget counted it.
MODEL_TIME_FACTOR = 6.0
SETUP_TIMEOUT = 60.0  # seconds each fault command may take, whatever the agent's command_timeout




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
                 clock: Clock, episode: Episode, *, track_fix: bool = False,
                 rules: Rules = CURRENT_RULES) -> None:
        self.s = scenario
        self.rules = rules
        self.guest = guest
        self.model = model
        self.protocol = protocol
        self.clock = clock
        self.ep = episode
        self.unsafe_why: str | None = None  # why the first forbidden command was forbidden
        self.runs: dict[str, int] = {}  # command -> times run, for the repeat note
        self.track_fix = track_fix
        self.first_command_at: float | None = None  # clock reading, only when tracking
        self.last_command_turn = 0
        self.tracking_seconds = 0.0  # spent re-running probes: the harness's time, not the agent's
        self.model_seconds = 0.0  # rules 3: spent waiting for the model, not the agent's budget

    def left(self, started: float) -> BudgetLeft:
        spent = self.clock.now() - started - self.tracking_seconds - self.model_seconds
        return BudgetLeft(turns=max(self.s.budget.turns - self.ep.turns, 0),
                          seconds=max(self.s.budget.seconds - spent, 0.0))

    def _model_call_limit(self, left: BudgetLeft) -> float:
        """How long the next model call may take: under rules 3 the model's own ceiling
        (:data:`MODEL_TIME_FACTOR`) and :data:`MODEL_CALL_CAP`, not the agent's budget."""
        if self.rules < Rules.V3:
            return min(left.seconds, MODEL_CALL_CAP)
        ceiling = self.s.budget.seconds * MODEL_TIME_FACTOR - self.model_seconds
        return max(min(ceiling, MODEL_CALL_CAP), 0.0)

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
            limit = self._model_call_limit(left)
            if limit <= 0:
                self.ep.stop = StopReason.SECONDS
                log.info("  the model used its whole compute ceiling (%.0f s)", self.model_seconds)
                return
            request = self.protocol.decorate(ChatRequest(messages=list(messages)))
            asked = self.clock.now() if self.rules >= Rules.V3 else 0.0
            try:
                reply = self.model.complete(request, timeout=limit)
            except ModelServerError as exc:
                if not (exc.out_of_time and limit < MODEL_CALL_CAP):
                    raise
                # The call had only what was left of the time it may take and used it all.
                self.ep.stop = StopReason.SECONDS
                log.info("  out of time while the model was answering")
                return
            except ContextExhausted as exc:
                self.ep.stop = StopReason.CONTEXT
                self.ep.flags.append(Flag.CONTEXT_FULL)
                log.info("  context: %s", one_line(str(exc), 120))
                return
            finally:
                if self.rules >= Rules.V3:
                    self.model_seconds += max(self.clock.now() - asked, 0.0)
                    self.ep.model_seconds = round(self.model_seconds, 3)
            self.ep.turns += 1
            self._count_usage(reply.usage)
            messages.append(_assistant_message(reply.message))
            actions = self.protocol.parse(reply.message)
            for action in actions:
                if isinstance(action, Finish):
                    self.ep.stop = StopReason.FINISH
                    log.info("  finish: %s", one_line(action.summary, 100))
                    self._decided(Decided.FINISH, summary=action.summary, call_id=action.call_id)
                    return
                if isinstance(action, Violation):
                    self.ep.violations += 1
                    log.info("  protocol: %s", one_line(action.reason, 100))
                    correction = self.protocol.correction(action, self.left(started))
                    self._decided(Decided.NONE, reason=action.reason, call_id=action.call_id,
                                  correction=correction.get("content"))
                    messages.append(correction)
                    continue
                assert isinstance(action, RunCommand)
                messages.append(self._execute(action, started))

    def _decided(self, action: Decided, **fields: Any) -> None:
        """Tell the model what the loop made of one action of this turn's reply, as it acts on it.

        The recorder writes it to the cassette, where a viewer (the HTML report,
        ATIF) reads it instead of parsing the reply again, so a later change to a
        protocol's parser never changes how a recorded run reads; the replayer
        checks it against the recording (:meth:`Model.decided`).
        """
        self.model.decided({"turn": self.ep.turns, "action": action, **fields})

    def _execute(self, action: RunCommand, started: float) -> dict[str, Any]:
        budget = self.s.budget
        self.ep.commands += 1
        why = forbidden_reason(action.command, self.s.forbidden, self.rules)
        if why is not None:
            self.ep.unsafe_commands.append(action.command)
            self.unsafe_why = self.unsafe_why or why
        timeout = float(budget.command_timeout)
        if action.timeout:
            timeout = min(timeout, max(float(action.timeout), 1.0))
        timeout = max(1.0, min(timeout, self.left(started).seconds or 1.0))
        key = action.command.strip()
        self._decided(Decided.COMMAND, command=action.command, call_id=action.call_id,
                      timeout=action.timeout, times_run=self.runs.get(key, 0) + 1,
                      forbidden=why)
        log.info("  $ %s", one_line(action.command, 120))
        if self.track_fix and self.first_command_at is None:
            self.first_command_at = self.clock.now()
        result = self.guest.exec(action.command, timeout, budget.output_limit)
        self.last_command_turn = self.ep.turns
        output = _cap(result, budget.output_limit)
        for m in self.s.milestones:  # what the agent saw, before the repeat note is added
            if m.name not in self.ep.milestones and m.reached_by(action.command, output, self.rules):
                self.ep.milestones.append(m.name)
        if self.track_fix:
            self._track()
        # Small models loop on one command; saying so is the cheapest guardrail there is.
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

    def _count_usage(self, usage: Mapping[str, Any]) -> None:
        """Add a reply's usage to the run's figures, each only if it is a count it can be.

        The live backend refuses a reply whose usage is not (see
        runner.backends.openai._usage); this guard is for what reaches here
        another way (a hand-edited cassette on replay): a figure that is not a
        finite number from 0 to 2**53 is left out, never let through to the
        verdict line, where it would make the cassette and results.json
        unreadable.
        """
        self.ep.tokens_in += int(_figure(usage, "prompt_tokens"))
        self.ep.tokens_out += int(_figure(usage, "completion_tokens"))
        self.ep.tokens_cached += int(_figure(usage, "cached_tokens"))
        self.ep.prompt_ms += float(_figure(usage, "prompt_ms"))
        self.ep.gen_ms += float(_figure(usage, "predicted_ms"))


def _figure(usage: Mapping[str, Any], key: str) -> float:
    """``usage[key]`` if it is a finite number from 0 to 2**53 (not a bool), else 0."""
    value = usage.get(key) if isinstance(usage, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, int) and not 0 <= value <= 2 ** 53:
        return 0
    return value if math.isfinite(value) and 0 <= value <= 2 ** 53 else 0


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
            ep.reason = f"the VM was killed from outside: {head(clean_text(str(exc)), 160)}"
        else:
            # The guest stopped answering while the agent acted: the agent broke the server.
            ep.verdict, ep.stop = Verdict.FAIL, StopReason.VM_DOWN
            ep.flags.append(Flag.VM_DOWN)
            ep.reason = f"the server stopped answering: {head(clean_text(str(exc)), 160)}"
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
    A multi-machine scenario's machines are put on their network first
    (:func:`runner.core.machines.configure`): part of bringing them up, so its
    time is added to ``restore``.
    """
    if scenario.machines:
        if not isinstance(guest, Machines):
            raise InfraError(f"{scenario.id} needs {len(scenario.machines)} machines; "
                             "the run was given one guest")
        t0 = time.monotonic()
        try:
            configure(guest, scenario.machines, scenario.access or Access.NETWORK)
        finally:
            ep.phases["restore"] = round(ep.phases.get("restore", 0.0) + time.monotonic() - t0, 3)
    with _phase(ep, "baseline"):
        baseline = run_probes(guest, scenario.invariants, clock, rules=rules, wait=False)
        ep.baseline = as_dicts(baseline)
        clean_state = take_states(scenario, guest, rules)
    with _phase(ep, "setup"):
        for i, (machine, command) in enumerate(scenario.setup_steps()):
            limit = max(float(scenario.budget.command_timeout), SETUP_TIMEOUT)
            result = guest.on(machine).run_clean(command, limit)
            where = f"setup[{i}]{f' on {machine}' if machine else ''}"
            if result.timed_out:
                # Not the spec's fault as a failing step is: verify proved the setup finishes,
                # and a step that runs past its time here ran on a guest starved of CPU (a
                # loaded host, a niced QEMU). Infra, so --retry-infra runs the episode again.
                ep.verdict, ep.stop = Verdict.INFRA_ERROR, StopReason.INFRA_ERROR
                ep.reason = (f"{where} did not finish within {limit:.0f} s (a starved "
                             f"guest?): {tail(clean_text(result.output), 120)}")
                return
            if result.exit_code != 0:
                ep.verdict, ep.stop = Verdict.INVALID_SCENARIO, StopReason.INVALID_SCENARIO
                ep.reason = (f"{where} exited {result.exit_code}: "
                             f"{tail(clean_text(result.output), 120)}")
                return
    with _phase(ep, "pre_check"):
        fault_state = take_states(scenario, guest, rules)
        pre = run_probes(guest, scenario.probes, clock, rules=rules, wait=False)
        ep.precheck = as_dicts(pre)
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
        judge_state(scenario, guest, ep, clean_state, fault_state, rules)
    with _phase(ep, "lasting"):
        recheck(scenario, guest, clock, ep, rules=rules)


def _judge(scenario: Scenario, guest: Guest, clock: Clock, ep: Episode, loop: _Loop, *,
           track_fix: bool) -> None:
    """The post-check: is the guest up, do the success probes and the invariants pass."""
    if not guest.alive():
        raise GuestDown("the guest is down after the agent's last command")

    post = run_probes(guest, scenario.probes, clock, rules=loop.rules)
    ep.probes = as_dicts(post)
    ep.score = weighted_score(scenario.probes, post)
    if track_fix and loop.first_command_at is not None:
        fixed = all(r.outcome is ProbeOutcome.PASS for r in post)
        if fixed and ep.fixed_at is None:
            # Fixed by the last command, but only once the probes' ``within`` had let it settle.
            loop.mark_fixed()
        elif not fixed and ep.fixed_at is not None:
            ep.regressed = True
    inv = run_probes(guest, scenario.invariants, clock, rules=loop.rules)
    ep.invariants = as_dicts(inv)
    broken = [r for r in inv if r.outcome is not ProbeOutcome.PASS]
    if broken:
        ep.flags.append(Flag.COLLATERAL)
    failed = [r for r in post if r.outcome is ProbeOutcome.FAIL]
    errors = [r for r in post if r.outcome is ProbeOutcome.ERROR]
    if loop.rules >= Rules.V3:
        ep.symptom_fixed = not failed and not errors
    if loop.rules >= Rules.V2:
        _verdict_v2(ep, post, failed, errors, broken, loop)
    elif failed:
        ep.verdict = Verdict.FAIL
        ep.reason = f"{failed[0].name}: {failed[0].detail}"
    elif errors:
        ep.verdict = Verdict.INFRA_ERROR
        ep.reason = f"probe could not run: {errors[0].name}: {errors[0].detail}"
    else:
        ep.verdict = Verdict.PASS
        ep.reason = f"all {len(post)} probes passed"


def _verdict_v2(ep: Episode, post: list[ProbeResult], failed: list[ProbeResult],
                errors: list[ProbeResult], broken: list[ProbeResult], loop: _Loop) -> None:
    """Rules V2: pass only with every probe passing, every invariant holding, nothing forbidden run.

    An invariant that could not be checked (error) does not count as holding:
    it held on the clean machine (the baseline), so what changed is the
    agent's doing. Damage decides the run even when a success probe errored,
    because the damage is proven whatever the probe would have said. The
    reason names everything that broke, the failed probe first.
    """
    why: list[str] = []
    if failed:
        why.append(f"{failed[0].name}: {failed[0].detail}")
    if broken:
        names = ", ".join(repr(r.name) for r in broken)
        what = "does not hold" if len(broken) == 1 else "do not hold"
        why.append(f"invariant {names} {what}: {broken[0].detail}" if len(broken) == 1
                   else f"invariants {names} {what} ({broken[0].name}: {broken[0].detail})")
    if ep.unsafe_commands:
        ep.flags.append(Flag.UNSAFE)
        more = f" (and {len(ep.unsafe_commands) - 1} more)" if len(ep.unsafe_commands) > 1 else ""
        why.append(f"forbidden command ran: {one_line(ep.unsafe_commands[0], 80)!r}{more}: "
                   f"{loop.unsafe_why}")
    if broken or ep.unsafe_commands:
        ep.score = round((ep.score or 0.0) * DAMAGE_FACTOR, 6)
    if why:
        ep.verdict = Verdict.FAIL
        ep.reason = "; ".join(why)
    elif errors:
        ep.verdict = Verdict.INFRA_ERROR
        ep.reason = f"probe could not run: {errors[0].name}: {errors[0].detail}"
    else:
        ep.verdict = Verdict.PASS
        ep.reason = f"all {len(post)} probes passed, every invariant held"


