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


def _cassette_name(scenario: Scenario, round_: int) -> str:
    return f"{scenario.id}.r{round_}.jsonl"


def _from_recording(scenario: Scenario, round_: int, recorded: Path, cassette: Path) -> Episode:
    """``--record-mode once|none``: the episode replayed offline from its recorded cassette."""
    outcome = replay_one(recorded, offline=True)
    if not outcome.same:
        raise InvalidInput(f"the recorded cassette no longer replays to its verdict "
                           f"({outcome.recorded} -> {outcome.replayed}); re-record it",
                           path=str(recorded))
    cassette.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(recorded, cassette)
    verdict = Cassette.load(cassette).verdict or {}
    fields = set(Episode.__dataclass_fields__)
    ep = Episode(**{k: v for k, v in verdict.items() if k in fields})
    ep.cassette = str(cassette)
    ep.round = round_  # the recording may have been made as another round (verify's are round 0)
    return ep


def run_bench(scenarios: list[Scenario], choice: AgentChoice, opts: RunOptions, run_dir: Path,
              *, resume: bool = False, retry_infra: int = 0, record_to: Path | None = None,
              record_mode: RecordMode = RecordMode.ALL) -> list[Episode]:
    """Run every scenario ``opts.repeat`` times; results are on disk after each one.

    With ``record_to``, every cassette is also copied there. ``record_mode``
    says what to do with cassettes already there: ``all`` runs everything
    live, ``once`` replays those it has and runs the rest, ``none`` replays
    only (a missing cassette is an error, found before anything runs).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    info = {"agent": {**dataclasses.asdict(choice), "kind": choice.kind.value},
            "options": dataclasses.asdict(opts), "scenarios": [s.path for s in scenarios],
            "harness": __version__}
    _, done = load_results(run_dir) if resume else ({}, [])
    if not resume:
        atomic_write(run_dir / "run.json", json.dumps(info, indent=2) + "\n")
    episodes: dict[tuple[str, int], Episode] = {(e.scenario, e.round): e for e in done}
    wanted = [(s, r) for r in range(opts.repeat) for s in scenarios]
    position = {(s.id, r): i for i, (s, r) in enumerate(wanted)}

    def recorded(s: Scenario, r: int) -> Path | None:
        """The cassette in ``record_to`` this run would be replayed from (round 0 may be ``<id>.jsonl``,
        as ``verify`` names its oracle cassettes)."""
        if record_to is None or record_mode is RecordMode.ALL:
            return None
        names = [_cassette_name(s, r)] + ([f"{s.id}.jsonl"] if r == 0 else [])
        return next((record_to / n for n in names if (record_to / n).is_file()), None)

    if record_mode is RecordMode.NONE:
        missing = [f"{s.id} (round {r + 1})" for s, r in wanted if recorded(s, r) is None]
        if record_to is None or missing:
            raise InvalidInput(f"--record-mode none needs a cassette for every run; missing: "
                               f"{', '.join(missing[:5]) or 'no --record-to'}", field="--record-mode")

    def ordered() -> list[Episode]:
        # Stable order: as asked (round by round, scenarios as given); anything else after.
        return sorted(episodes.values(),
                      key=lambda e: (position.get((e.scenario, e.round), len(position)),
                                     e.scenario, e.round))

    def todo(attempt: int) -> list[tuple[Scenario, int]]:
        """Runs still to do: missing ones, and on a retry (or a resume) infra-errors."""
        retry = attempt > 0 or resume
        return [(s, r) for s, r in wanted
                if (s.id, r) not in episodes
                or (retry and episodes[(s.id, r)].verdict is Verdict.INFRA_ERROR)]

    live = [(s, r) for s, r in todo(0) if recorded(s, r) is None]
    with signals_raise():
        _prepare_sandboxes(sorted({s.image for s, _r in live}), opts)
    with signals_raise(), ModelProvider(choice if live else
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
            for i, (s, r) in enumerate(runs, 1):
                tag = s.id + (f" (round {r + 1})" if opts.repeat > 1 else "")
                log.info("%d/%d %s", i, len(runs), tag)
                cassette = run_dir / "cassettes" / _cassette_name(s, r)
                source = recorded(s, r)
                if source is not None:
                    ep = _from_recording(s, r, source, cassette)
                else:
                    ep = run_one(s, provider.for_scenario(s), protocol, reason, opts, cassette,
                                 round_=r)
                episodes[(s.id, r)] = ep
                write_results(run_dir, info, ordered())
                report = html_report.refresh(run_dir, log)
                if report is not None and i == 1 and attempt == 0:
                    log.info("report (rewritten after each scenario): %s", report)
                if record_to is not None and source is None:
                    record_to.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(cassette, record_to / cassette.name)
                how = " (replayed from its recording)" if source is not None else ""
                log.info("%s: %s in %.1fs%s%s", tag, ep.verdict, ep.seconds, how,
                         f" ({one_line(ep.reason, 120)})" if ep.verdict is not Verdict.PASS else "")
        write_results(run_dir, info, ordered())
        report = html_report.refresh(run_dir, log)
        if report is not None:
            log.info("report: %s", report)
    return ordered()
