"""A scenario's checks run on real VMs: the noop, the oracle, each shortcut and alternative.

Each run is a real episode (:func:`runner.app.episodes.run_one`) with a
scripted agent speaking native tool calls, recorded as a cassette so that
``make test`` can later prove the same check from the recording
(:mod:`runner.app.verify`). ``--repeat N`` runs the checks N times and merges
them: a scenario whose tries disagree is flaky, and so invalid.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from runner.app.episodes import RunOptions, run_one
from runner.app.verify import (
    ALTERNATIVE_KIND,
    WHY,
    ShortcutRun,
    Verification,
    baseline_check,
    broken_invariants,
    ended_by_infrastructure,
    fault_check,
    judge_alternative,
    judge_shortcut,
    merge,
    noop_check,
    oracle_check,
    recorded_noop,
    recorded_oracle,
    shortcut_cassette,
)
from runner.core import layout
from runner.core.episode import Episode
from runner.core.model import noop, oracle, scripted
from runner.core.outcomes import Verdict
from runner.core.protocol import get_protocol
from runner.core.spec import Scenario

log = logging.getLogger("rootbench.verify")


def verify_repeated(scenario: Scenario, run_dir: Path, repeat: int, *, accel: str = "auto",
                    transport: str = "serial", record_to: Path | None = None,
                    noop_from: Path | None = None,
                    oracle_from: Path | None = None) -> Verification:
    """The noop and oracle checks ``repeat`` times; only the last try records to ``record_to``.
    ``noop_from``: prove the noop check from the recording under it instead of a live run.
    ``oracle_from``: prove the oracle's checks from the recording under it when nothing it
    depended on changed (:func:`recorded_oracle`; the noop's then too); else run them live."""
    if oracle_from is not None:
        v = Verification(scenario.id)
        t0 = time.monotonic()
        if recorded_oracle(scenario, oracle_from, v):
            recorded_noop(scenario, noop_from or oracle_from, v)
            v.seconds = round(time.monotonic() - t0, 1)
            return v
    tries = []
    for i in range(1, repeat + 1):
        last = i == repeat
        folder = run_dir if last else run_dir / f"try{i}"
        folder.mkdir(parents=True, exist_ok=True)
        if repeat > 1:
            log.info("%s: try %d of %d", scenario.id, i, repeat)
        tries.append(verify_scenario(scenario, folder, accel=accel, transport=transport,
                                     record_to=record_to if last else None, noop_from=noop_from))
    return merge(tries)


def verify_scenario(scenario: Scenario, run_dir: Path, *, accel: str = "auto",
                    transport: str = "serial", record_to: Path | None = None,
                    noop_from: Path | None = None) -> Verification:
    """Run the noop and oracle checks on ``scenario``; the oracle cassette goes to ``record_to``,
    and so does the noop's (at ``noop/<id>.jsonl``; else it stays in ``run_dir``).

    With ``noop_from`` the noop is not run: "noop fails" is proven from its
    recording there, and the baseline and "fault lands" from the oracle's own
    episode, which checks both before its agent acts, just as the noop's does.
    """
    t0 = time.monotonic()
    v = Verification(scenario.id)
    opts = RunOptions(accel=accel, transport=transport, protocol="tools")
    tools = get_protocol("tools")
    why = WHY

    if noop_from is None:
        log.info("%s: noop agent", scenario.id)
        noop_at = (layout.noop_cassette_path(record_to, scenario.id) if record_to
                   else run_dir / layout.noop_cassette_name(scenario.id))
        noop_at.parent.mkdir(parents=True, exist_ok=True)
        ep = run_one(scenario, noop(), tools, why, opts, noop_at)
        v.noop_cassette = str(noop_at)
        if ep.verdict is Verdict.INFRA_ERROR:
            return ended_by_infrastructure(ep, v, t0)
        baseline_check(ep, v)
        fault_check(ep, v)
        noop_check(ep.verdict, ep.reason, broken_invariants(ep.invariants), v)

    log.info("%s: oracle agent (the solution)", scenario.id)
    target = (record_to or run_dir) / layout.oracle_cassette_name(scenario.id)
    ep = run_one(scenario, oracle(list(scenario.solution)), tools, why, opts, target)
    v.cassette = str(target)
    if noop_from is not None:
        if ep.verdict is Verdict.INFRA_ERROR and not ep.precheck:
            return ended_by_infrastructure(ep, v, t0)
        baseline_check(ep, v)
        fault_check(ep, v)
        recorded_noop(scenario, noop_from, v)
    oracle_check(ep, v)
    v.seconds = round(time.monotonic() - t0, 1)
    return v


def verify_shortcut(scenario: Scenario, index: int, run_dir: Path, repeat: int = 1, *,
                    accel: str = "auto", transport: str = "serial",
                    record_to: Path | None = None, alternative: bool = False) -> ShortcutRun:
    """Run shortcut ``index`` (or, with ``alternative``, the valid alternative fix ``index``)
    as the scripted agent ``repeat`` times; the last try records to ``record_to`` (else
    ``run_dir``), earlier ones to ``run_dir/try<i>``."""
    t0 = time.monotonic()
    entry = (scenario.alternatives if alternative else scenario.shortcuts)[index]
    kind = ALTERNATIVE_KIND if alternative else scenario.shortcuts[index].kind.value
    opts = RunOptions(accel=accel, transport=transport, protocol="tools")
    tools = get_protocol("tools")
    episodes: list[Episode] = []
    target = shortcut_cassette(record_to or run_dir, scenario, index, alternative)
    for i in range(1, repeat + 1):
        path = target if i == repeat else shortcut_cassette(run_dir / f"try{i}", scenario, index,
                                                            alternative)
        path.parent.mkdir(parents=True, exist_ok=True)
        log.info("%s: %s %r%s", scenario.id, "alternative" if alternative else "shortcut",
                 entry.name, f" (try {i} of {repeat})" if repeat > 1 else "")
        agent = scripted(entry.name, list(entry.commands))
        episodes.append(run_one(scenario, agent, tools, WHY, opts, path))
    run = (judge_alternative if alternative else judge_shortcut)(entry.name, kind, episodes)
    run.cassette, run.seconds = str(target), round(time.monotonic() - t0, 1)
    return run
