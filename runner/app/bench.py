"""A bench: many episodes, each in a fresh sandbox, results kept on disk as each one ends.

One episode's infrastructure failure never stops the bench: it is recorded
as ``infra-error`` and the next scenario runs. See :mod:`runner.app.runs`
for the run directory's layout.

A bench may be a matrix: several :class:`~runner.app.plan.Arm` (model x
protocol x hint level) over the same scenarios and rounds, into one run
directory, one model server at a time. What runs next and what is already
done is the plan's (:mod:`runner.app.plan`, no VM, no model); episodes run
through an executor (:mod:`runner.app.executors`: one at a time in this
process, N at once in child processes, or as Ray tasks) fed by the one
driver loop (:mod:`runner.app.driver`); whichever it is, only this process
writes the run directory, after each episode, in a stable order. What
happened is told to listeners (:mod:`runner.app.events`): the results files,
the progress lines, ``--record-to``'s copies, and from the CLI the HTML
report, so running never imports reporting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from runner import __version__
from runner.app.agents import AgentChoice, ModelProvider
from runner.app.builds import Builds, Need, in_order, llama_missing
from runner.app.driver import Job, drive
from runner.app.episodes import EpisodeJob, JobResult, RunOptions, run_job
from runner.app.estimate import estimate
from runner.app.events import BenchListener, Step
from runner.app.executors import Done, Executor, InProcess, WorkerLost
from runner.app.outputs import atomic_write
from runner.app.plan import Arm, BenchPlan, Key, Round
from runner.app.progress import Eta
from runner.app.replay import load_replayable, replay_loaded
from runner.app.runs import load_results, slug, write_results
from runner.app.signals import signals_raise
from runner.backends.lan import Lan
from runner.backends.sandbox import Sandbox
from runner.core import layout, measured
from runner.core.cassette import RecordMode
from runner.core.episode import GRADED_FIELDS, Episode
from runner.core.errors import InfraError, InvalidInput
from runner.core.machines import SNAPSHOT_LAN_MAC
from runner.core.outcomes import AgentKind, Verdict
from runner.core.protocol import Protocol
from runner.core.spec import Scenario, load_spec
from runner.core.text import one_line

log = logging.getLogger("rootbench.bench")


def _prepare_sandboxes(images: list[Need], opts: RunOptions) -> None:
    """Build each image and its golden snapshot, in the driver, before an episode needs them
    (:class:`~runner.app.builds.Builds` calls this as the episodes come).

    On a fresh machine this is minutes of work: done here, it shows as set-up
    rather than inside the episode (whose restore phase and time it would
    swell). One sandbox is started and stopped per image. If that fails,
    the bench still goes on: each scenario tries again and reports infra-error.
    """
    for image, lan in images:
        try:
            with contextlib.ExitStack() as stack:
                port = stack.enter_context(Lan(1)).port(0, SNAPSHOT_LAN_MAC) if lan else None
                box = stack.enter_context(Sandbox(image, accel=opts.accel,
                                                  transport=opts.transport, lan=port))
                how = "cold boot" if box.info.restore == "cold" else f"{box.info.restore} restore"
                log.info("sandbox %s ready in %.2fs (%s, %s)", image, box.info.ready_s,
                         box.info.accel, how)
        except InfraError as exc:
            log.warning("the sandbox %s could not start (%s); each scenario will try again",
                        image, one_line(str(exc)))


def _from_recording(round_: int, level: int, recorded: Path,
                    cassette: Path, protocol: str = "auto") -> Episode:
    """``--record-mode once|none``: the episode replayed offline from its recorded cassette.

    The recorded verdict gives the run's figures (time, tokens); the grading
    (score, milestones, fix tracking) is the replay's, so a cassette recorded
    before grading existed is graded too, exactly as a live run would be.
    """
    replayable = load_replayable(recorded)
    outcome = replay_loaded(replayable, offline=True)
    if not outcome.same:
        raise InvalidInput(f"the recorded cassette no longer replays to its verdict "
                           f"({outcome.recorded} -> {outcome.replayed}); re-record it",
                           path=str(recorded))
    loaded = replayable.cassette
    if loaded.head.hint_level != level:
        raise InvalidInput(f"the recorded cassette ran at hint level "
                           f"{loaded.head.hint_level}, this run is at {level}",
                           path=str(recorded), field="header.hint_level")
    spoken = loaded.head.protocol.name
    if protocol != "auto" and spoken != protocol:
        raise InvalidInput(f"the recorded cassette speaks protocol {spoken}, this run asks "
                           f"for {protocol}", path=str(recorded), field="header.protocol")
    cassette.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(recorded, cassette)  # a new file: the umask's mode, not the source's
    verdict = loaded.verdict or {}
    ep = Episode.from_dict(verdict)
    if outcome.episode is not None:
        for key in GRADED_FIELDS:
            setattr(ep, key, getattr(outcome.episode, key))
    ep.hint_level, ep.round = level, round_
    ep.cassette = str(cassette)
    return ep


def run_bench(scenarios: list[Scenario], choice: AgentChoice, opts: RunOptions, run_dir: Path,
              *, resume: bool = False, retry_infra: int = 0, record_to: Path | None = None,
              record_mode: RecordMode = RecordMode.ALL, arms: list[Arm] | None = None,
              executor: Executor | None = None,
              listeners: Sequence[BenchListener] = ()) -> list[Episode]:
    """Run every scenario ``opts.repeat`` times for every arm; results are on disk after each one.

    With ``record_to``, every cassette is also copied there. ``record_mode``
    says what to do with cassettes already there: ``all`` runs everything
    live, ``once`` replays those it has and runs the rest, ``none`` replays
    only (a missing cassette is an error, found before anything runs).

    Each round runs at its arm's hint level (capped per scenario), or with
    ``opts.ladder`` at level 0 and then one level higher after each failure,
    until a pass or the last hint: every step is its own episode
    (:class:`~runner.app.plan.BenchPlan` says which).

    ``arms`` (default: ``choice`` with ``opts.protocol`` and ``opts.hints``)
    are run one model at a time: each model's server starts once, for all its
    protocols. ``executor`` (default: one episode at a time, here) runs the
    episodes; the caller owns it (and closes it). ``listeners`` are told each
    episode's start and end and the bench's end, after the bench's own (the
    results files, ``record_to``'s copies, the progress lines): the CLI adds
    the HTML report there.
    """
    arms = list(arms) if arms else [Arm(choice, opts.protocol, opts.hints)]
    _, done = load_results(run_dir) if resume else ({}, [])
    if resume:
        _same_arms(run_dir, arms)
    plan = BenchPlan(scenarios, arms, opts, done, record_to, record_mode)
    plan.check(resume)  # before anything is made: a refused bench leaves no run directory
    executor = executor if executor is not None else InProcess()
    run_dir.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"agent": {**dataclasses.asdict(choice), "kind": choice.kind.value},
                            "options": dataclasses.asdict(opts),
                            "scenarios": [s.path for s in scenarios], "harness": __version__,
                            "jobs": executor.slots}
    if arms[0].label:
        info["arms"] = [{"label": a.label, "model": a.choice.label(), "protocol": a.protocol,
                         "hints": a.hints} for a in arms]
    if not resume:
        atomic_write(run_dir / layout.RUN_INFO, json.dumps(info, indent=2) + "\n")
    told: list[BenchListener] = [_ResultsFile(run_dir, info, plan)]
    if record_to is not None:
        told.append(_RecordTo(record_to))
    told += [_Progress(executor.slots), *listeners]

    live = plan.live(None, resume)
    builds = None
    if not executor.remote:  # a Ray node builds its own images and snapshots
        builds = Builds(in_order(rd.scenario for rd in live), opts,
                        lambda needs, o: _prepare_sandboxes(needs, o))
    models = plan.models()
    llama = any(m.kind is AgentKind.MODEL and not m.endpoint and llama_missing(m.llama_server)
                and plan.live(m, resume) for m in models)
    said = estimate(live, opts.ladder, measured.load(), executor.slots).text()
    building = builds.plan_text(llama) if builds is not None else ""
    log.info("%s%s", said, f"; {building}" if building else "")
    try:
        if builds is not None and llama:
            builds.start_beside_llama()
        for model in models:
            needed = plan.live(model, resume)
            # Scripted agents start nothing; a model server only when some step must run live.
            scripted = model.kind is not AgentKind.MODEL
            serve = model if needed or scripted else dataclasses.replace(model, kind=AgentKind.NOOP)
            with signals_raise(), executor.provider(serve, run_dir,
                                                    log_label=slug(model.label()) if len(models) > 1
                                                    else None) as provider, executor.cancelling():
                group = [a for a in arms if a.choice == model]
                protocols = {a.label: provider.protocol(a.protocol) for a in group}
                if needed:
                    for a in group:
                        log.info("%sprotocol %s: %s", f"{a.label}: " if a.label else "",
                                 protocols[a.label][0].name, protocols[a.label][1])
                for attempt in range(retry_infra + 1):
                    retry = attempt > 0 or resume  # a retry (or a resume) runs infra-errors again
                    rounds = plan.todo(model, retry)
                    if attempt > 0 and not rounds:
                        break
                    if attempt > 0:
                        log.info("retrying %d infra-error run(s), try %d", len(rounds), attempt)
                    _Rounds(plan, provider, protocols, executor, run_dir, told, retry,
                            builds).run(rounds)
    except BaseException:
        ended = plan.ordered()
        for listener in told:  # what ended since the last refresh: an interrupted bench has it all
            listener.bench_ended(ended, interrupted=True)
        raise
    finally:
        if builds is not None:
            builds.close()
    episodes = plan.ordered()
    for listener in told:
        listener.bench_ended(episodes, interrupted=False)
    return episodes


class _ResultsFile(BenchListener):
    """results.json and results.xml, rewritten after every episode: nothing ended is ever lost."""

    def __init__(self, run_dir: Path, info: dict[str, Any], plan: BenchPlan) -> None:
        self.run_dir, self.info, self.plan = run_dir, info, plan

    def episode_finished(self, step: Step, episode: Episode) -> None:
        write_results(self.run_dir, self.info, self.plan.ordered())

    def bench_ended(self, episodes: list[Episode], *, interrupted: bool) -> None:
        if not interrupted:  # an interrupted bench's results are already written, episode by episode
            write_results(self.run_dir, self.info, episodes)


class _RecordTo(BenchListener):
    """``--record-to``: each cassette run live is copied into the recordings folder as it ends."""

    def __init__(self, record_to: Path) -> None:
        self.record_to = record_to

    def episode_finished(self, step: Step, episode: Episode) -> None:
        if step.replayed or not episode.cassette or not Path(episode.cassette).is_file():
            return
        folder = layout.arm_folder(self.record_to, step.arm)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(episode.cassette, folder / Path(episode.cassette).name)


class _Progress(BenchListener):
    """The progress lines: "3/29 scenario (about 12 min left)" as a step starts, its verdict as it
    ends. Only live episodes count towards the estimate (a replay takes no time)."""

    def __init__(self, slots: int) -> None:
        self.eta = Eta(slots)

    def episode_started(self, step: Step) -> None:
        log.info("%d/%d %s (%s)", step.index, step.total, step.tag, self.eta.left(step.remaining))
        if not step.replayed:
            self.eta.started(step.key)

    def episode_finished(self, step: Step, episode: Episode) -> None:
        if not step.replayed:
            self.eta.finished(step.key)
        how = " (replayed from its recording)" if step.replayed else ""
        log.info("%s: %s in %.1fs%s%s", step.tag, episode.verdict, episode.seconds, how,
                 f" ({one_line(episode.reason, 160, keep_end=True)})" if episode.verdict is not Verdict.PASS
                 else "")


def check_bench(scenarios: list[Scenario], arms: list[Arm], opts: RunOptions, *,
                resume: Path | None = None, record_to: Path | None = None,
                record_mode: RecordMode = RecordMode.ALL) -> None:
    """Refuse, before any work (no run directory made, no VM, no model call), a bench that
    :func:`run_bench` would refuse: a resume that asks for other arms or another agent, or a
    ``--record-mode none`` missing a recording."""
    done: list[Episode] = []
    if resume is not None:
        _same_arms(resume, arms)
        same_agent(resume, arms, opts)
        done = load_results(resume)[1]
    BenchPlan(scenarios, arms, opts, done, record_to, record_mode).check(resume is not None)


def _run_json(run_dir: Path) -> dict[str, Any]:
    """A run directory's run.json as a dict ({} when missing or unreadable: nothing to hold to)."""
    try:
        data = json.loads((run_dir / layout.RUN_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


# What a resume must ask for as the run did: another value would add episodes of another agent,
# model, server, sampling or protocol to the run, under the same name.
_AGENT_FIELDS = ("kind", "model", "model_file", "endpoint", "temperature", "seed", "max_tokens",
                 "ctx_size")
_OPTION_FIELDS = ("protocol", "hints", "ladder", "track_fix")
_FLAG = {"kind": "--agent", "model": "--model", "model_file": "--model-file",
         "endpoint": "--endpoint", "temperature": "--temperature", "seed": "--seed",
         "max_tokens": "--max-tokens", "ctx_size": "--ctx-size", "protocol": "--protocol",
         "hints": "--hints", "ladder": "--ladder", "track_fix": "--track-fix"}


def same_agent(run_dir: Path, arms: list[Arm], opts: RunOptions) -> None:
    """``--resume`` must ask for the agent, model, server, sampling and protocol run.json says;
    else it would append mismatched episodes. One line naming the field, InvalidInput."""
    info = _run_json(run_dir)
    had_agent = v if isinstance(v := info.get("agent"), dict) else {}
    had_opts = v if isinstance(v := info.get("options"), dict) else {}
    choice = arms[0].choice
    scripted = choice.kind is not AgentKind.MODEL
    now_agent: dict[str, Any] = {**dataclasses.asdict(choice), "kind": choice.kind.value}
    now_opts = {**dataclasses.asdict(opts), "protocol": arms[0].protocol, "hints": arms[0].hints}
    checks = [("agent", k, had_agent, now_agent) for k in _AGENT_FIELDS
              if k == "kind" or not scripted] + [("options", k, had_opts, now_opts)
                                                 for k in _OPTION_FIELDS]
    for part, key, had, now in checks:
        if key not in had:
            continue  # an older run.json without it: nothing to hold the resume to
        then, asked = had[key], now.get(key)
        if key == "endpoint" and isinstance(then, str) and isinstance(asked, str):
            then, asked = then.rstrip("/"), asked.rstrip("/")
        if then != asked:
            raise InvalidInput(f"the run was made with {_FLAG[key]} {then!r}, this resume asks "
                               f"for {asked!r}: resume with the run's own flags",
                               path=str(run_dir / layout.RUN_INFO), field=f"{part}.{key}")


def resume_scenarios(run_dir: Path, asked: list[Scenario] | None) -> list[Scenario]:
    """The scenarios a ``--resume`` runs: the run's own list (run.json ``scenarios``).

    ``asked`` (paths or ``--only`` given) must be that same list, else
    InvalidInput in one line: a resume finishes a run, it does not grow or
    shrink it. A run.json without a list (an older one) takes ``asked``.
    """
    listed = _run_json(run_dir).get("scenarios")
    where = str(run_dir / layout.RUN_INFO)
    if not isinstance(listed, list) or not listed or not all(isinstance(p, str) for p in listed):
        if asked is None:
            raise InvalidInput("run.json has no scenario list: name the scenarios to resume",
                               path=where, field="scenarios")
        return asked
    own: list[Scenario] = []
    for p in listed:
        if not Path(p).is_file():
            raise InvalidInput(f"the run's spec {p} is not there (resume from the directory the "
                               "run was started in)", path=where, field="scenarios")
        own.append(load_spec(p))
    if asked is not None:
        key = sorted((s.id, str(Path(s.path).resolve())) for s in own)
        if sorted((s.id, str(Path(s.path).resolve())) for s in asked) != key:
            raise InvalidInput(f"this run is of {len(own)} scenario(s) "
                               f"({', '.join(s.id for s in own[:5])}{', ...' if len(own) > 5 else ''}); "
                               f"a resume runs those: give no specs and no --only, or the same ones",
                               path=where, field="scenarios")
    return own


def _same_arms(run_dir: Path, arms: list[Arm]) -> None:
    """``--resume`` of a matrix bench must ask for the same arms (else every episode would run
    again under other names); a bench of one arm resumes as it always did."""
    asked = _run_json(run_dir).get("arms") or []  # none (an old run.json): a bench of one
    if not isinstance(asked, list):
        return  # nothing to hold the resume to
    had = [a.get("label") for a in asked if isinstance(a, dict)]
    now = [a.label for a in arms if a.label]
    if had != now:
        raise InvalidInput(f"this run directory is a bench of {', '.join(map(str, had)) or 'one arm'}; "
                           f"resume it with the same --model, --protocol and --hints (asked: "
                           f"{', '.join(now) or 'one arm'})", path=str(run_dir), field="--resume")


class _Rounds:
    """One pass over a model's rounds: each step replayed here from its recording
    (``--record-mode once``) or submitted to the executor through :func:`~runner.app.driver.drive`,
    a ladder's next level as soon as the level before it failed, every ending told to the
    listeners here, in the driver."""

    def __init__(self, plan: BenchPlan, provider: ModelProvider,
                 protocols: dict[str | None, tuple[Protocol, str]], executor: Executor,
                 run_dir: Path, listeners: list[BenchListener], retry: bool,
                 builds: Builds | None = None) -> None:
        self.plan, self.provider, self.protocols = plan, provider, protocols
        self.builds = builds
        self.executor, self.run_dir, self.listeners, self.retry = executor, run_dir, listeners, retry
        self.in_flight: dict[Key, tuple[EpisodeJob, int, Round, Step]] = {}
        self.total = self.unstarted = 0
        # How many episodes a round takes (a ladder's several): counted over the rounds ended.
        self.rounds_ended = self.episodes_ended = 0
        self.steps_so_far: dict[tuple[str | None, str, int], int] = {}  # by (arm, scenario, round)

    def run(self, rounds: list[Round]) -> None:
        """Run ``rounds`` (each a chain of hint levels), ``executor.slots`` episodes at once."""
        self.total = self.unstarted = len(rounds)
        drive(self.executor, [functools.partial(self._start, i, rd)
                              for i, rd in enumerate(rounds, 1)], self._done)

    def _start(self, index: int, rd: Round) -> Job | None:
        self.unstarted -= 1
        return self._advance(index, rd)

    def _advance(self, index: int, rd: Round) -> Job | None:
        """Replay this round's next steps while they are recorded; the first one that must run
        live is returned as the job to submit (None: the round is done)."""
        opts = self.plan.arm_opts[rd.arm.label]
        while (level := self.plan.next_step(rd, self.retry)) is not None:
            source = self.plan.recorded(rd, level)
            if source is None and self.builds is not None:
                # What this episode restores from, built now: before its start is told, so
                # neither its time nor the estimate of the time left counts the build.
                self.builds.ready(rd.scenario)
            tag = ((f"{rd.arm.label}: " if rd.arm.label else "") + rd.scenario.id
                   + (f" (round {rd.number})" if opts.repeat > 1 else "")
                   + (f" (hint level {level})" if level else ""))
            step = Step(rd.arm.label, rd.scenario.id, rd.number, level, tag, index, self.total,
                        self._remaining(), replayed=source is not None)
            for listener in self.listeners:
                listener.episode_started(step)
            cassette = layout.cassette_path(self.run_dir, rd.scenario.id, rd.number, level,
                                            rd.arm.label)
            if source is not None:
                ep = _from_recording(rd.number, level, source, cassette, rd.arm.protocol)
                ep.arm = rd.arm.label
                self._finish(rd, step, ep)
                if ep.verdict is Verdict.INFRA_ERROR:
                    break
                continue
            protocol, reason = self.protocols[rd.arm.label]
            job = EpisodeJob(rd.scenario, self.provider.for_scenario(rd.scenario, rd.number,
                                                                     protocol.name),
                             protocol.name, reason, opts, cassette, rd.number, level,
                             rd.arm.label, ship=self.executor.remote)
            self.in_flight[step.key] = (job, index, rd, step)
            return Job(step.key, run_job, (job,),
                       timeout=2 * rd.scenario.budget.seconds + self.executor.setup_slack)
        self._round_ended(rd)
        return None

    def _round_ended(self, rd: Round) -> None:
        self.rounds_ended += 1
        self.episodes_ended += self.steps_so_far.pop(rd.key(0)[:3], 0)

    def _remaining(self) -> int:
        """Episodes still to finish, the one starting now included: those running, and the rounds
        not started times the episodes a round has taken so far (a ladder's round is several)."""
        per_round = self.episodes_ended / self.rounds_ended if self.rounds_ended else 1.0
        return 1 + len(self.in_flight) + math.ceil(self.unstarted * per_round)

    def _done(self, done: Done) -> Job | None:
        """A submitted episode came back: record it, then the ladder's next level, if it climbs."""
        key = cast(Key, done.key)  # the key given with the job
        job, index, rd, step = self.in_flight.pop(key)
        if isinstance(done.error, WorkerLost):
            log.warning("%s: %s", step.tag, one_line(str(done.error)))
            ep = job.lost(str(done.error))
        elif done.error is not None:
            raise done.error
        else:
            result: JobResult = done.value
            ep = result.episode
            if result.cassette_text is not None:
                atomic_write(job.cassette, result.cassette_text)
        self._finish(rd, step, ep)
        if ep.verdict is Verdict.INFRA_ERROR:  # a retry (--retry-infra) picks that up
            self._round_ended(rd)
            return None
        return self._advance(index, rd)

    def _finish(self, rd: Round, step: Step, ep: Episode) -> None:
        self.plan.record(step.key, ep)
        at = rd.key(0)[:3]
        self.steps_so_far[at] = self.steps_so_far.get(at, 0) + 1
        for listener in self.listeners:
            listener.episode_finished(step, ep)
