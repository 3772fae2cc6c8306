"""Scenarios that prove themselves: four checks per scenario, all on real VMs.

A benchmark task is only worth something if (1) the clean machine satisfies
its invariants, (2) its fault really lands (a success probe fails after
setup and none errors), (3) doing nothing fails it without tripping an
invariant and (4) its reference
solution passes it without collateral damage. Peers have shipped tasks that
failed each of these; ``rootbench verify`` runs them all.

Two episodes per scenario cover the four checks: the noop agent's
(baseline, precheck, final verdict) and the oracle's (recorded as a
cassette, so ``make test`` can replay it offline).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from runner.app.episodes import RunOptions, run_one
from runner.core.episode import Episode
from runner.core.model import noop, oracle
from runner.core.outcomes import Flag, ProbeOutcome, StopReason, Verdict
from runner.core.protocol import get_protocol
from runner.core.spec import Scenario

log = logging.getLogger("rootbench.verify")

CHECKS = ("baseline", "fault lands", "noop fails", "oracle passes")


@dataclass
class Verification:
    scenario: str
    checks: dict[str, bool | None] = field(default_factory=dict)  # None: not reached
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cassette: str | None = None
    tries: int = 1  # how many times the four checks ran (verify --repeat)
    flaky: bool = False  # the tries disagreed on some check

    @property
    def valid(self) -> bool:
        """Every check passed, every time: a scenario that passes only sometimes is not valid."""
        return not self.flaky and all(self.checks.get(c) is True for c in CHECKS)


def merge(tries: list[Verification]) -> Verification:
    """One verdict from several tries of the same scenario's checks.

    A check counts as passed only if it passed in every try; a check whose
    tries disagree makes the scenario ``flaky`` (a restart that hits
    systemd's start limit on the second run, a race with a timer), which is
    reported as a problem of its own. The last try's cassette is kept.
    """
    if not tries:
        raise ValueError("nothing to merge")
    merged = Verification(tries[0].scenario, tries=len(tries), cassette=tries[-1].cassette,
                          seconds=round(sum(t.seconds for t in tries), 1))
    for check in CHECKS:
        seen = [t.checks.get(check) for t in tries]
        merged.checks[check] = None if any(x is None for x in seen) else all(seen)
        if len({x for x in seen if x is not None}) > 1:
            merged.flaky = True
            passed = sum(1 for x in seen if x is True)
            merged.problems.append(f"flaky: {check!r} held in {passed} of {len(seen)} tries")
    for i, t in enumerate(tries, 1):
        merged.problems += [f"{p} (try {i})" if len(tries) > 1 else p for p in t.problems]
    return merged


def _broken_invariants(ep: Episode) -> list[str]:
    return [p["name"] for p in ep.invariants if p["outcome"] != ProbeOutcome.PASS]


def _baseline(ep: Episode, v: Verification) -> None:
    bad = [p for p in ep.baseline if p["outcome"] != ProbeOutcome.PASS]
    v.checks["baseline"] = not bad and ep.stop is not StopReason.INFRA_ERROR
    if bad:
        v.problems.append(f"baseline: invariant {bad[0]['name']!r} does not hold on a clean VM "
                          f"({bad[0]['detail']})")


def _fault(ep: Episode, v: Verification) -> None:
    if ep.verdict is Verdict.INVALID_SCENARIO and not ep.precheck:
        v.checks["fault lands"] = False
        v.problems.append(f"fault lands: {ep.reason}")
        return
    failing = [p for p in ep.precheck if p["outcome"] == ProbeOutcome.FAIL]
    errors = [p for p in ep.precheck if p["outcome"] == ProbeOutcome.ERROR]
    v.checks["fault lands"] = bool(failing) and not errors
    if errors:
        v.problems.append(f"fault lands: probe {errors[0]['name']!r} errored after setup "
                          f"({errors[0]['detail']})")
    elif not failing:
        v.problems.append("fault lands: every success probe passed after setup")


def verify_repeated(scenario: Scenario, run_dir: Path, repeat: int, *, accel: str = "auto",
                    transport: str = "serial", record_to: Path | None = None) -> Verification:
    """The four checks ``repeat`` times; only the last try records to ``record_to``."""
    tries = []
    for i in range(1, repeat + 1):
        last = i == repeat
        folder = run_dir if last else run_dir / f"try{i}"
        folder.mkdir(parents=True, exist_ok=True)
        if repeat > 1:
            log.info("%s: try %d of %d", scenario.id, i, repeat)
        tries.append(verify_scenario(scenario, folder, accel=accel, transport=transport,
                                     record_to=record_to if last else None))
    return merge(tries)


def verify_scenario(scenario: Scenario, run_dir: Path, *, accel: str = "auto",
                    transport: str = "serial", record_to: Path | None = None) -> Verification:
    """Run the four checks on ``scenario``; the oracle cassette goes to ``record_to``."""
    t0 = time.monotonic()
    v = Verification(scenario.id)
    opts = RunOptions(accel=accel, transport=transport, protocol="tools")
    tools = get_protocol("tools")
    why = "verify: scripted agents speak native tool calls"

    log.info("%s: noop agent", scenario.id)
    ep = run_one(scenario, noop(), tools, why, opts, run_dir / f"{scenario.id}.noop.jsonl")
    if ep.verdict is Verdict.INFRA_ERROR:
        v.problems.append(f"infrastructure: {ep.reason}")
        v.seconds = round(time.monotonic() - t0, 1)
        return v
    _baseline(ep, v)
    _fault(ep, v)
    tripped = _broken_invariants(ep)
    v.checks["noop fails"] = ep.verdict is Verdict.FAIL and not tripped
    if ep.verdict is not Verdict.FAIL:
        v.problems.append(f"noop fails: the noop agent's run ended {ep.verdict} ({ep.reason})")
    elif tripped:
        # An invariant that the fault itself breaks would blame every agent for collateral damage.
        v.problems.append(f"noop fails: doing nothing broke invariant {tripped[0]!r}; "
                          "it depends on the fault, not on what the agent does")

    log.info("%s: oracle agent (the solution)", scenario.id)
    target = (record_to or run_dir) / f"{scenario.id}.jsonl"
    ep = run_one(scenario, oracle(list(scenario.solution)), tools, why, opts, target)
    v.cassette = str(target)
    ok = ep.verdict is Verdict.PASS and Flag.COLLATERAL not in ep.flags
    v.checks["oracle passes"] = ok
    if not ok:
        broken = _broken_invariants(ep)
        detail = f"invariant {broken[0]!r} broke" if broken and ep.verdict is Verdict.PASS else ep.reason
        v.problems.append(f"oracle passes: the solution's run ended {ep.verdict} ({detail})")
    v.seconds = round(time.monotonic() - t0, 1)
    return v


def table_rows(results: list[Verification]) -> tuple[list[str], list[list[str]]]:
    repeated = any(v.tries > 1 for v in results)
    headers = ["scenario", *CHECKS, *(["tries", "flaky"] if repeated else []), "seconds", "problem"]

    def mark(x: bool | None) -> str:
        return "ok" if x is True else ("FAIL" if x is False else "-")

    rows = [[v.scenario, *(mark(v.checks.get(c)) for c in CHECKS),
             *([str(v.tries), "FLAKY" if v.flaky else "no"] if repeated else []),
             f"{v.seconds:.1f}", v.problems[0][:90] if v.problems else ""] for v in results]
    return headers, rows
