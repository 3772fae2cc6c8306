"""A bench: many episodes, each in a fresh sandbox, results kept on disk as each one ends.

One episode's infrastructure failure never stops the bench: it is recorded
as ``infra-error`` and the next scenario runs. See :mod:`runner.app.runs`
for the run directory's layout.

A bench may be a matrix: several :class:`Arm` (model x protocol x hint level)
over the same scenarios and rounds, into one run directory, one model server
at a time. Episodes run through an executor (:mod:`runner.app.executors`):
one at a time in this process, N at once in child processes, or as Ray tasks;
whichever it is, only this driver writes the run directory, after each
episode, in a stable order.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from runner import __version__
from runner.app import html_report
from runner.app.agents import AgentChoice, ModelProvider
from runner.app.episodes import EpisodeJob, JobResult, RunOptions, run_job
from runner.app.executors import Executor, InProcess, WorkerLost
from runner.app.progress import Eta
from runner.app.replay import replay_one
from runner.app.runs import atomic_write, load_results, slug, write_results
from runner.app.signals import signals_raise
from runner.backends.sandbox import Sandbox
from runner.core import layout
from runner.core.cassette import Cassette, RecordMode
from runner.core.episode import GRADED_FIELDS, Episode
from runner.core.errors import InfraError, InvalidInput
from runner.core.outcomes import AgentKind, Verdict
from runner.core.protocol import Protocol
from runner.core.spec import Scenario, load_spec
from runner.core.text import one_line

log = logging.getLogger("rootbench.bench")


def _prepare_sandboxes(images: list[str], opts: RunOptions) -> None:
    """Build each image and its golden snapshot before the model server starts.

    On a fresh machine this is minutes of work: done here, it shows as set-up
    rather than inside the first scenario, and llama-server does not sit idle
    meanwhile. One sandbox is started and stopped per image. If that fails,
    the bench still goes on: each scenario tries again and reports infra-error.
    """
    for image in images:
        try:
            with Sandbox(image, accel=opts.accel, transport=opts.transport) as box:
                how = "cold boot" if box.info.restore == "cold" else f"{box.info.restore} restore"
                log.info("sandbox %s ready in %.2fs (%s, %s)", image, box.info.ready_s,
                         box.info.accel, how)
        except InfraError as exc:
            log.warning("the sandbox %s could not start (%s); each scenario will try again",
                        image, one_line(str(exc)))


def levels(scenario: Scenario, opts: RunOptions) -> list[int]:
    """The hint levels a scenario may run at, in order: the ladder climbs them one failure at a
    time; otherwise it is the one level asked for, capped at the hints the scenario has."""
    if opts.ladder:
        return list(range(len(scenario.hints) + 1))
    return [min(opts.hints, len(scenario.hints))]


def climbs(ep: Episode, opts: RunOptions) -> bool:
    """Whether the ladder goes on to the next level after ``ep``: only after a plain failure
    (an infra-error or invalid scenario says nothing about how much help the model needs)."""
    return opts.ladder and ep.verdict is Verdict.FAIL


def _from_recording(round_: int, level: int, recorded: Path,
                    cassette: Path, protocol: str = "auto") -> Episode:
    """``--record-mode once|none``: the episode replayed offline from its recorded cassette.

    The recorded verdict gives the run's figures (time, tokens); the grading
    (score, milestones, fix tracking) is the replay's, so a cassette recorded
    before grading existed is graded too, exactly as a live run would be.
    """
    outcome = replay_one(recorded, offline=True)
    if not outcome.same:
        raise InvalidInput(f"the recorded cassette no longer replays to its verdict "
                           f"({outcome.recorded} -> {outcome.replayed}); re-record it",
                           path=str(recorded))
    loaded = Cassette.load(recorded)
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


@dataclasses.dataclass(frozen=True)
class Arm:
    """One cell of a bench's matrix: who acts, the protocol asked for, the hint level asked for.

    ``label`` names the cell in results (``Episode.arm``), in the cassette
    folder (``cassettes/<label>/``) and in the tables; it is None when the
    bench has only this one cell, whose run directory looks as it always did.
    """

    choice: AgentChoice
    protocol: str = "auto"
    hints: int = 0
    label: str | None = None


def matrix(choices: list[AgentChoice], protocols: list[str], hints: list[int]) -> list[Arm]:
    """Every model x protocol x hint level, in the order given, without repeats; one arm: unlabelled."""
    cells: list[tuple[AgentChoice, str, int]] = []
    for c in choices:
        for p in protocols:
            for h in hints:
                if (c, p, h) not in cells:
                    cells.append((c, p, h))
    if len(cells) == 1:
        c, p, h = cells[0]
        return [Arm(c, p, h)]
    several_hints = len({h for _c, _p, h in cells}) > 1
    return [Arm(c, p, h, slug(f"{c.label()}-{p}" + (f"-h{h}" if several_hints else "")))
            for c, p, h in cells]


Key = tuple[str | None, str, int, int]  # (arm, scenario, round, hint level): one episode, one cassette


def run_bench(scenarios: list[Scenario], choice: AgentChoice, opts: RunOptions, run_dir: Path,
              *, resume: bool = False, retry_infra: int = 0, record_to: Path | None = None,
              record_mode: RecordMode = RecordMode.ALL, arms: list[Arm] | None = None,
              executor: Executor | None = None) -> list[Episode]:
    """Run every scenario ``opts.repeat`` times for every arm; results are on disk after each one.

    With ``record_to``, every cassette is also copied there. ``record_mode``
    says what to do with cassettes already there: ``all`` runs everything
    live, ``once`` replays those it has and runs the rest, ``none`` replays
    only (a missing cassette is an error, found before anything runs).

    Each round runs at its arm's hint level (capped per scenario), or with
    ``opts.ladder`` at level 0 and then one level higher after each failure,
    until a pass or the last hint: every step is its own episode.

    ``arms`` (default: ``choice`` with ``opts.protocol`` and ``opts.hints``)
    are run one model at a time: each model's server starts once, for all its
    protocols. ``executor`` (default: one episode at a time, here) runs the
    episodes; the caller owns it (and closes it).
    """
    arms = list(arms) if arms else [Arm(choice, opts.protocol, opts.hints)]
    _, done = load_results(run_dir) if resume else ({}, [])
    if resume:
        _same_arms(run_dir, arms)
    plan = _Plan(scenarios, arms, opts, done, record_to, record_mode)
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
    episodes, wanted, arm_opts = plan.episodes, plan.wanted, plan.arm_opts
    recorded, next_step = plan.recorded, plan.next_step
    position = {(a.label, s.id, r): i for i, (a, s, r) in enumerate(wanted)}

    def ordered() -> list[Episode]:
        # Stable order: as asked (arm by arm, round by round, scenarios as given, levels up);
        # anything else after.
        return sorted(episodes.values(),
                      key=lambda e: (position.get((e.arm, e.scenario, e.round), len(position)),
                                     e.arm or "", e.scenario, e.round, e.hint_level))

    def todo(group: list[Arm], attempt: int) -> list[tuple[Arm, Scenario, int]]:
        """Rounds with a step still to do: a missing one, and on a retry (or a resume) an infra-error."""
        retry = attempt > 0 or resume
        return [(a, s, r) for a, s, r in wanted
                if a in group and next_step(a, s, r, retry) is not None]

    def live(group: list[Arm]) -> list[tuple[Arm, Scenario, int]]:
        return [(a, s, r) for a, s, r in todo(group, 0)
                if recorded(a, s, r, next_step(a, s, r, resume) or 0) is None]

    if not executor.remote:  # a Ray node builds its own images and snapshots
        with signals_raise():
            _prepare_sandboxes(sorted({s.image for _a, s, _r in live(arms)}), opts)
    models: list[AgentChoice] = []
    for a in arms:
        if a.choice not in models:
            models.append(a.choice)
    # Refreshed at most every REFRESH_SECONDS during the bench (a full rewrite per episode
    # costs quadratic time over a long bench), after the first episode, and always at the end.
    report = html_report.Refresher(run_dir, log)
    try:
        for model in models:
            group = [a for a in arms if a.choice == model]
            needed = live(group)
            # Scripted agents start nothing; a model server only when some step must run live.
            scripted = model.kind is not AgentKind.MODEL
            serve = model if needed or scripted else dataclasses.replace(model, kind=AgentKind.NOOP)
            with signals_raise(), executor.provider(serve, run_dir,
                                                    log_label=slug(model.label()) if len(models) > 1
                                                    else None) as provider, executor.cancelling():
                protocols = {a.label: provider.protocol(a.protocol) for a in group}
                if needed:
                    for a in group:
                        log.info("%sprotocol %s: %s", f"{a.label}: " if a.label else "",
                                 protocols[a.label][0].name, protocols[a.label][1])
                for attempt in range(retry_infra + 1):
                    runs = todo(group, attempt)
                    if attempt > 0 and not runs:
                        break
                    if attempt > 0:
                        log.info("retrying %d infra-error run(s), try %d", len(runs), attempt)
                    _drive(runs, attempt > 0 or resume, next_step, recorded, provider, protocols,
                           arm_opts, executor, run_dir, record_to, episodes,
                           lambda: write_results(run_dir, info, ordered()), report)
    except BaseException:
        report.flush()  # what ended since the last refresh: an interrupted bench has it all
        raise
    write_results(run_dir, info, ordered())
    path = report.final()
    if path is not None:
        log.info("report: %s", path)
    return ordered()


class _Plan:
    """What a bench must do, from what it asks and what is already done (on a resume).

    Built before anything runs, so everything that can refuse a bench (a
    missing recording under ``--record-mode none``) does so before any work.
    """

    def __init__(self, scenarios: list[Scenario], arms: list[Arm], opts: RunOptions,
                 done: list[Episode], record_to: Path | None, record_mode: RecordMode) -> None:
        self.episodes: dict[Key, Episode] = {(e.arm, e.scenario, e.round, e.hint_level): e
                                             for e in done}
        self.wanted = [(a, s, r) for a in arms for r in range(opts.repeat) for s in scenarios]
        self.arm_opts = {a.label: dataclasses.replace(opts, protocol=a.protocol, hints=a.hints)
                         for a in arms}
        self.record_to, self.record_mode = record_to, record_mode

    def recorded(self, a: Arm, s: Scenario, r: int, level: int) -> Path | None:
        """The cassette in ``record_to`` this run would be replayed from (round 0 at level 0 may be
        ``<id>.jsonl``, as ``verify`` names its oracle cassettes)."""
        if self.record_to is None or self.record_mode is RecordMode.ALL:
            return None
        folder = layout.arm_folder(self.record_to, a.label)
        names = layout.recorded_names(s.id, r, level)
        return next((folder / n for n in names if (folder / n).is_file()), None)

    def needs(self, key: Key, retry: bool) -> bool:
        return key not in self.episodes or (retry and
                                             self.episodes[key].verdict is Verdict.INFRA_ERROR)

    def next_step(self, a: Arm, s: Scenario, r: int, retry: bool) -> int | None:
        """The level this round must run next, walking its ladder over what is done; None: done."""
        for level in levels(s, self.arm_opts[a.label]):
            key = (a.label, s.id, r, level)
            if self.needs(key, retry):
                return level
            if not climbs(self.episodes[key], self.arm_opts[a.label]):
                return None
        return None

    def check(self, resume: bool) -> None:
        """``--record-mode none`` needs a recording for every step still to run."""
        if self.record_mode is not RecordMode.NONE:
            return
        missing = [f"{(a.label + ' ') if a.label else ''}{s.id} (round {r + 1})"
                   for a, s, r in self.wanted
                   if (lv := self.next_step(a, s, r, resume)) is not None
                   and self.recorded(a, s, r, lv) is None]
        if self.record_to is None or missing:
            raise InvalidInput(f"--record-mode none needs a cassette for every run; missing: "
                               f"{', '.join(missing[:5]) or 'no --record-to'}", field="--record-mode")


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
    _Plan(scenarios, arms, opts, done, record_to, record_mode).check(resume is not None)


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


def _drive(runs: list[tuple[Arm, Scenario, int]], retry: bool,
           next_step: Callable[[Arm, Scenario, int, bool], int | None],
           recorded: Callable[[Arm, Scenario, int, int], Path | None], provider: ModelProvider,
           protocols: dict[str | None, tuple[Protocol, str]], arm_opts: dict[str | None, RunOptions],
           executor: Executor, run_dir: Path, record_to: Path | None,
           episodes: dict[Key, Episode], save: Callable[[], None],
           report: html_report.Refresher) -> None:
    """Run ``runs`` (each a round's chain of hint levels) through ``executor``, keeping
    ``executor.slots`` episodes going, and record each episode here, in the driver, as it ends.

    Recorded steps (``--record-mode once``) are replayed here at once; a
    ladder's next level is submitted when the level before it fails; ``report`` is told of
    each episode that ends (it rewrites the report when one is due).
    """
    pending = [(i, a, s, r) for i, (a, s, r) in enumerate(runs, 1)]
    in_flight: dict[Key, tuple[EpisodeJob, int, str, Arm, Scenario]] = {}
    eta = Eta(executor.slots)  # the progress line's estimate of the time left

    def tag_of(a: Arm, s: Scenario, r: int, level: int) -> str:
        return ((f"{a.label}: " if a.label else "") + s.id
                + (f" (round {r + 1})" if arm_opts[a.label].repeat > 1 else "")
                + (f" (hint level {level})" if level else ""))

    def finish(key: Key, ep: Episode, replayed: bool, tag: str, a: Arm) -> None:
        episodes[key] = ep
        save()
        first = report.writes == 0
        path = report.done()
        if path is not None and first:
            log.info("report (refreshed at most every %g s, and at the end): %s", report.every, path)
        if record_to is not None and not replayed and ep.cassette and Path(ep.cassette).is_file():
            folder = layout.arm_folder(record_to, a.label)
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ep.cassette, folder / Path(ep.cassette).name)
        how = " (replayed from its recording)" if replayed else ""
        log.info("%s: %s in %.1fs%s%s", tag, ep.verdict, ep.seconds, how,
                 f" ({one_line(ep.reason, 120)})" if ep.verdict is not Verdict.PASS else "")

    def advance(i: int, a: Arm, s: Scenario, r: int) -> None:
        """Replay or submit this round's next step (replays go on to the step after)."""
        while (level := next_step(a, s, r, retry)) is not None:
            key = (a.label, s.id, r, level)
            tag = tag_of(a, s, r, level)
            # Still to finish: this round, those running, those not started.
            log.info("%d/%d %s (%s)", i, len(runs), tag,
                     eta.left(1 + len(pending) + len(in_flight)))
            cassette = layout.cassette_path(run_dir, s.id, r, level, a.label)
            source = recorded(a, s, r, level)
            if source is not None:
                ep = _from_recording(r, level, source, cassette, a.protocol)
                ep.arm = a.label
                finish(key, ep, True, tag, a)
                if ep.verdict is Verdict.INFRA_ERROR:
                    return
                continue
            protocol, reason = protocols[a.label]
            job = EpisodeJob(s, provider.for_scenario(s, r, protocol.name), protocol.name, reason,
                             arm_opts[a.label], cassette, r, level, a.label, ship=executor.remote)
            executor.submit(key, run_job, (job,),
                            timeout=2 * s.budget.seconds + executor.setup_slack)
            in_flight[key] = (job, i, tag, a, s)
            eta.started(key)
            return

    while pending or in_flight:
        while pending and executor.free():
            advance(*pending.pop(0))
        if not in_flight:
            continue
        done = executor.next_done(1.0)
        if done is None:
            continue
        key = cast(Key, done.key)  # the executor hands back the key it was given in submit()
        job, i, tag, a, s = in_flight.pop(key)
        eta.finished(key)
        if isinstance(done.error, WorkerLost):
            log.warning("%s: %s", tag, one_line(str(done.error)))
            ep = job.lost(str(done.error))
        elif done.error is not None:
            raise done.error
        else:
            result: JobResult = done.value
            ep = result.episode
            if result.cassette_text is not None:
                atomic_write(job.cassette, result.cassette_text)
        finish(key, ep, False, tag, a)
        if ep.verdict is not Verdict.INFRA_ERROR:  # a retry (--retry-infra) picks that up
            advance(i, a, s, job.round)  # the ladder's next level, if it climbs
