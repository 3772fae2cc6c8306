"""A bench: many episodes, each in a fresh sandbox, results kept on disk as each one ends.

One episode's infrastructure failure never stops the bench: it is recorded
as ``infra-error`` and the next scenario runs. See :mod:`runner.app.runs`
for the run directory's layout.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

from runner import __version__
from runner.app import html_report
from runner.app.agents import AgentChoice, ModelProvider
from runner.app.episodes import RunOptions, run_one
from runner.app.replay import replay_one
from runner.app.runs import atomic_write, load_results, write_results
from runner.app.signals import signals_raise
from runner.backends.sandbox import Sandbox
from runner.core.cassette import Cassette, RecordMode
from runner.core.episode import Episode
from runner.core.errors import InfraError, InvalidInput
from runner.core.outcomes import AgentKind, Verdict
from runner.core.protocol import Protocol
from runner.core.spec import Scenario
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
                how = "restored from its snapshot" if box.info.restored else "cold boot"
                log.info("sandbox %s ready in %.2fs (%s, %s)", image, box.info.ready_s,
                         box.info.accel, how)
        except InfraError as exc:
            log.warning("the sandbox %s could not start (%s); each scenario will try again",
                        image, one_line(str(exc)))


def _cassette_name(scenario: Scenario, round_: int, level: int = 0) -> str:
    """``<id>.r<round>.jsonl`` at level 0 (as before hints, so resume and record modes still find
    old cassettes), ``<id>.r<round>.h<level>.jsonl`` for a run with hints."""
    return f"{scenario.id}.r{round_}" + (f".h{level}" if level else "") + ".jsonl"


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


GRADED = ("score", "milestones", "milestone_fraction", "fixed_at", "regressed")


def _from_recording(round_: int, level: int, recorded: Path,
                    cassette: Path) -> Episode:
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
    if int(loaded.header.get("hint_level", 0)) != level:
        raise InvalidInput(f"the recorded cassette ran at hint level "
                           f"{loaded.header.get('hint_level', 0)}, this run is at {level}",
                           path=str(recorded), field="header.hint_level")
    cassette.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(recorded, cassette)
    verdict = loaded.verdict or {}
    fields = set(Episode.__dataclass_fields__)
    ep = Episode(**{k: v for k, v in verdict.items() if k in fields})
    if outcome.episode is not None:
        for key in GRADED:
            setattr(ep, key, getattr(outcome.episode, key))
    ep.hint_level, ep.round = level, round_
    ep.cassette = str(cassette)
    return ep


Key = tuple[str, int, int]  # (scenario, round, hint level): one episode, one cassette


def run_bench(scenarios: list[Scenario], choice: AgentChoice, opts: RunOptions, run_dir: Path,
              *, resume: bool = False, retry_infra: int = 0, record_to: Path | None = None,
              record_mode: RecordMode = RecordMode.ALL) -> list[Episode]:
    """Run every scenario ``opts.repeat`` times; results are on disk after each one.

    With ``record_to``, every cassette is also copied there. ``record_mode``
    says what to do with cassettes already there: ``all`` runs everything
    live, ``once`` replays those it has and runs the rest, ``none`` replays
    only (a missing cassette is an error, found before anything runs).

    Each round runs at ``opts.hints`` (capped per scenario), or with
    ``opts.ladder`` at level 0 and then one level higher after each failure,
    until a pass or the last hint: every step is its own episode.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    info = {"agent": {**dataclasses.asdict(choice), "kind": choice.kind.value},
            "options": dataclasses.asdict(opts), "scenarios": [s.path for s in scenarios],
            "harness": __version__}
    _, done = load_results(run_dir) if resume else ({}, [])
    if not resume:
        atomic_write(run_dir / "run.json", json.dumps(info, indent=2) + "\n")
    episodes: dict[Key, Episode] = {(e.scenario, e.round, e.hint_level): e for e in done}
    wanted = [(s, r) for r in range(opts.repeat) for s in scenarios]
    position = {(s.id, r): i for i, (s, r) in enumerate(wanted)}

    def recorded(s: Scenario, r: int, level: int) -> Path | None:
        """The cassette in ``record_to`` this run would be replayed from (round 0 at level 0 may be
        ``<id>.jsonl``, as ``verify`` names its oracle cassettes)."""
        if record_to is None or record_mode is RecordMode.ALL:
            return None
        names = [_cassette_name(s, r, level)] + ([f"{s.id}.jsonl"] if r == 0 and not level else [])
        return next((record_to / n for n in names if (record_to / n).is_file()), None)

    def needs(key: Key, retry: bool) -> bool:
        return key not in episodes or (retry and episodes[key].verdict is Verdict.INFRA_ERROR)

    def next_step(s: Scenario, r: int, retry: bool) -> int | None:
        """The level this round must run next, walking its ladder over what is done; None: done."""
        for level in levels(s, opts):
            key = (s.id, r, level)
            if needs(key, retry):
                return level
            if not climbs(episodes[key], opts):
                return None
        return None

    if record_mode is RecordMode.NONE:
        missing = [f"{s.id} (round {r + 1})" for s, r in wanted
                   if (lv := next_step(s, r, resume)) is not None and recorded(s, r, lv) is None]
        if record_to is None or missing:
            raise InvalidInput(f"--record-mode none needs a cassette for every run; missing: "
                               f"{', '.join(missing[:5]) or 'no --record-to'}", field="--record-mode")

    def ordered() -> list[Episode]:
        # Stable order: as asked (round by round, scenarios as given, levels up); anything else after.
        return sorted(episodes.values(),
                      key=lambda e: (position.get((e.scenario, e.round), len(position)),
                                     e.scenario, e.round, e.hint_level))

    def todo(attempt: int) -> list[tuple[Scenario, int]]:
        """Rounds with a step still to do: a missing one, and on a retry (or a resume) an infra-error."""
        retry = attempt > 0 or resume
        return [(s, r) for s, r in wanted if next_step(s, r, retry) is not None]

    # Scripted agents start nothing; a model server only when some step must run live.
    scripted = choice.kind is not AgentKind.MODEL
    live = [(s, r) for s, r in todo(0)
            if recorded(s, r, next_step(s, r, resume) or 0) is None]
    with signals_raise():
        _prepare_sandboxes(sorted({s.image for s, _r in live}), opts)
    with signals_raise(), ModelProvider(choice if live or scripted else
                                        dataclasses.replace(choice, kind=AgentKind.NOOP),
                                        run_dir) as provider:
        protocol, reason = provider.protocol(opts.protocol)
        if live:
            log.info("protocol %s: %s", protocol.name, reason)
        for attempt in range(retry_infra + 1):
            runs = todo(attempt)
            if attempt > 0 and not runs:
                break
            if attempt > 0:
                log.info("retrying %d infra-error run(s), try %d", len(runs), attempt)
            retry = attempt > 0 or resume
            for i, (s, r) in enumerate(runs, 1):
                while (level := next_step(s, r, retry)) is not None:
                    tag = s.id + (f" (round {r + 1})" if opts.repeat > 1 else "") + \
                        (f" (hint level {level})" if level else "")
                    log.info("%d/%d %s", i, len(runs), tag)
                    ep, source = _step(s, r, level, recorded(s, r, level), provider, protocol,
                                       reason, opts, run_dir)
                    episodes[(s.id, r, level)] = ep
                    write_results(run_dir, info, ordered())
                    report = html_report.refresh(run_dir, log)
                    if report is not None and i == 1 and attempt == 0 and not level:
                        log.info("report (rewritten after each scenario): %s", report)
                    if record_to is not None and source is None and ep.cassette:
                        record_to.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(ep.cassette, record_to / Path(ep.cassette).name)
                    how = " (replayed from its recording)" if source is not None else ""
                    log.info("%s: %s in %.1fs%s%s", tag, ep.verdict, ep.seconds, how,
                             f" ({one_line(ep.reason, 120)})" if ep.verdict is not Verdict.PASS
                             else "")
                    if ep.verdict is Verdict.INFRA_ERROR:
                        break  # a retry (--retry-infra) picks it up; never climb past it
        write_results(run_dir, info, ordered())
        report = html_report.refresh(run_dir, log)
        if report is not None:
            log.info("report: %s", report)
    return ordered()


def _step(s: Scenario, r: int, level: int, source: Path | None, provider: ModelProvider,
          protocol: Protocol, reason: str, opts: RunOptions,
          run_dir: Path) -> tuple[Episode, Path | None]:
    """One episode of a round at one hint level: replayed from ``source``, else run live."""
    cassette = run_dir / "cassettes" / _cassette_name(s, r, level)
    if source is not None:
        return _from_recording(r, level, source, cassette), source
    return run_one(s, provider.for_scenario(s, r), protocol, reason, opts, cassette,
                   round_=r, hint_level=level), None
