"""verify's orchestrator: every scenario's checks, shortcuts and alternatives as jobs.

``rootbench verify`` proves scenarios valid (:mod:`runner.app.verify` says
what each check means). This module schedules the work, as the bench's
orchestrator does for episodes: one job per scenario's noop and oracle
checks and one per shortcut and per valid alternative, at most ``jobs`` at
once through the bench's own driver loop (each in a child process of its
own when there are several), the slowest scenarios first. What can be
proven from a recording instead (``--noop``, ``--shortcuts``,
``--alternatives recorded``) is proven here without a VM. The command line
only parses its arguments, has them checked here (:func:`check_numbers`,
:func:`recorded_dir`) and prints what :func:`run_verify` returns, as
:func:`answer` words it.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import cast

from runner.app import html_report
from runner.app.cliparse import check_range
from runner.app.driver import Job, Start, drive
from runner.app.executors import Done, WorkerLost, auto_jobs, make_local
from runner.app.report import render_rows
from runner.app.runs import new_run_dir
from runner.app.signals import signals_raise
from runner.app.verify import (
    ALTERNATIVE_KIND,
    EPISODE_CHECKS,
    ShortcutRun,
    Verification,
    add_alternatives,
    add_shortcuts,
    json_rows,
    recorded_alternative,
    recorded_shortcut,
    slowest_first,
    stale_proof,
    table_rows,
)
from runner.app.verify_live import verify_repeated, verify_shortcut
from runner.core import layout
from runner.core.errors import InvalidInput
from runner.core.spec import Scenario
from runner.core.text import one_line

log = logging.getLogger("rootbench.verify")


@dataclass(frozen=True)
class VerifyOptions:
    """What ``rootbench verify`` was asked; see its ``--help`` for each."""

    jobs: int | None  # None: --jobs auto, sized from cores and free memory when the run starts
    repeat: int = 1
    accel: str = "auto"
    transport: str = "serial"
    record_to: Path | None = None
    recorded: Path = Path("recordings/oracle")  # where recorded proofs are read
    noop_recorded: bool = False
    shortcuts_recorded: bool = False
    alternatives_recorded: bool = False
    runs_dir: Path = Path("runs")
    # True (``--oracle changed``): prove the oracle's checks from the recording when nothing it
    # depended on changed, and run live only the rest and ``sample`` others that rotate daily.
    oracle_changed: bool = False
    sample: int = 3
    today: int = 0  # the day the sample rotates by (date.toordinal()); 0: today's
    # With oracle_changed: at most this many scenarios whose recordings no longer prove them
    # run live in one verify (a window over them that rotates daily); the others are deferred,
    # reported apart, neither valid nor invalid. None: all of them. make test's bound, so a
    # change that makes every recording stale (a judging-rules bump) cannot outgrow CI's time.
    max_live: int | None = None


def check_numbers(repeat: int, sample: int, max_live: int | None, oracle_changed: bool) -> None:
    """``--repeat``, ``--sample`` and ``--max-live`` in range, before any spec is read; a
    ``--max-live`` without ``--oracle changed`` would bound nothing, so it is refused."""
    check_range(repeat, "--repeat", 1, 20)
    check_range(sample, "--sample", 0, 1000)
    if max_live is not None:
        check_range(max_live, "--max-live", 1, 1000)
        if not oracle_changed:
            raise InvalidInput("goes with --oracle changed", field="--max-live")


def recorded_dir(name: str, needed: bool) -> Path:
    """``--recorded-from``: a folder that must be there when anything is proven from it
    (``needed``: some check recorded, or ``--oracle changed``), named as given when it is not."""
    recorded = Path(name)
    if needed and not recorded.is_dir():
        raise InvalidInput("not a directory", path=name, field="--recorded-from")
    return recorded


def sized(jobs: int | None) -> int:
    """``--jobs``: as given, or for ``auto`` (None) from cores and free memory, said in one line."""
    if jobs is None:
        jobs, why = auto_jobs()
        log.info("--jobs auto: %s", why)
    return jobs


def answer(results: list[Verification], fmt: str) -> list[str]:
    """What ``verify`` prints, each item one print: the table (or the JSON document), then, in a
    table's format, how many scenarios are valid (the deferred apart, neither valid nor invalid)
    and each invalid one's problems."""
    if fmt == "json":
        return [json.dumps(json_rows(results), indent=2)]
    headers, rows = table_rows(results)
    out = [render_rows(headers, rows, fmt)]
    deferred = [v for v in results if v.deferred]
    bad = invalid(results)
    checked = len(results) - len(deferred)
    more = (f"; {len(deferred)} deferred (stale recordings beyond --max-live: neither valid "
            "nor invalid today)" if deferred else "")
    out.append(f"\n{checked - len(bad)}/{checked} scenarios valid{more}")
    out += [f"  {v.scenario}: {'; '.join(v.problems)}" for v in bad]
    return out


def invalid(results: list[Verification]) -> list[Verification]:
    """The scenarios found invalid (a deferred one is not: it was not checked today)."""
    return [v for v in results if not v.valid and not v.deferred]


def defer_stale(scenarios: list[Scenario], recorded: Path, sampled: set[int], max_live: int,
                day: int) -> dict[int, str]:
    """Which scenarios to defer, with why: those whose recording no longer proves them
    (:func:`runner.app.verify.stale_proof`) beyond ``max_live`` of them, the ones that run
    live chosen by a window over them that moves each day (:func:`rotating_sample`), so every
    stale scenario is run live within ``len / max_live`` days. The rotating sample is not
    counted: it runs live anyway."""
    stale = {i: why for i, s in enumerate(scenarios) if i not in sampled
             and (why := stale_proof(recorded / layout.oracle_cassette_name(s.id), s)) is not None}
    if len(stale) <= max_live:
        return {}
    order = sorted(stale)
    live = {order[k] for k in rotating_sample([scenarios[i] for i in order], max_live, day)}
    return {i: why for i, why in stale.items() if i not in live}


def _days(stale: int, max_live: int) -> int:
    return max(1, -(-(stale + max_live) // max(max_live, 1)))


def rotating_sample(scenarios: list[Scenario], size: int, day: int) -> set[int]:
    """The indexes of ``size`` scenarios to run live even though their recordings still prove
    them: a window over the scenarios sorted by id, moved on by ``size`` each day, so every
    scenario is re-proven live every ``len / size`` days and a recording that no longer matches
    the machine it claims to describe cannot hide for long. The same day gives the same sample."""
    if size <= 0 or not scenarios:
        return set()
    order = sorted(range(len(scenarios)), key=lambda i: scenarios[i].id)
    start = (day * size) % len(order)
    return {order[(start + k) % len(order)] for k in range(min(size, len(order)))}


@dataclass
class VerifyRun:
    """What a verify found: a Verification per scenario, in the order given, and its report."""

    results: list[Verification]
    run_dir: Path
    report: Path | None


# A scripted run's key in the driver: (scenario index, "s" or "a", entry index).
_Key = tuple[int, str, int]


def run_verify(scenarios: list[Scenario], opts: VerifyOptions) -> VerifyRun:
    """Run every check of every scenario; the results in the order of ``scenarios``."""
    jobs = sized(opts.jobs)
    run_dir = new_run_dir(opts.runs_dir, "verify")
    if opts.record_to:
        opts.record_to.mkdir(parents=True, exist_ok=True)
    found: dict[int, Verification] = {}
    scripted: dict[_Key, ShortcutRun] = {}

    def unproven(key: _Key, error: BaseException) -> ShortcutRun:
        i, what, j = key
        s = scenarios[i]
        entry = s.shortcuts[j] if what == "s" else s.alternatives[j]
        kind = s.shortcuts[j].kind.value if what == "s" else ALTERNATIVE_KIND
        return ShortcutRun(entry.name, kind, None, "infra-error",
                           f"infrastructure: {one_line(str(error))}")

    def gathered(done: Done) -> None:
        if done.error is not None and not isinstance(done.error, WorkerLost):
            raise done.error
        if isinstance(done.key, tuple):
            key = cast(_Key, done.key)
            scripted[key] = done.value if done.error is None else unproven(key, done.error)
            return
        at = cast(int, done.key)  # the int key given with the scenario's job
        v = done.value if done.error is None else Verification(
            scenarios[at].id, problems=[f"infrastructure: {one_line(str(done.error))}"])
        log.info("%d/%d %s: noop and oracle %s (%.1fs)", len(found) + 1, len(scenarios),
                 scenarios[at].id, "ok" if all(v.checks.get(c) for c in EPISODE_CHECKS)
                 else "INVALID: " + "; ".join(v.problems), v.seconds)
        found[at] = v

    day = opts.today or date.today().toordinal()
    sampled = rotating_sample(scenarios, opts.sample, day) if opts.oracle_changed else set()
    if sampled:
        log.info("live whatever their recordings say (the rotating sample): %s",
                 ", ".join(sorted(scenarios[i].id for i in sampled)))
    deferred: dict[int, str] = {}
    if opts.oracle_changed and opts.max_live is not None:
        deferred = defer_stale(scenarios, opts.recorded, sampled, opts.max_live, day)
        for i, why in deferred.items():
            found[i] = Verification(scenarios[i].id, deferred=True, problems=[
                f"deferred: {why}; --max-live {opts.max_live} runs it live within "
                f"{_days(len(deferred), opts.max_live)} days, `make verify` now"])
        if deferred:
            log.info("deferred (stale, beyond --max-live %d): %d scenarios", opts.max_live,
                     len(deferred))
    with signals_raise(), make_local(jobs) as pool, pool.cancelling():
        work: list[Start] = []
        for i in slowest_first(scenarios, opts.recorded):
            s = scenarios[i]
            if i in deferred:
                continue
            from_recording = opts.oracle_changed and i not in sampled
            check = functools.partial(verify_repeated, accel=opts.accel,
                                      transport=opts.transport, record_to=opts.record_to,
                                      noop_from=opts.recorded if opts.noop_recorded else None,
                                      oracle_from=opts.recorded if from_recording else None)
            work.append(functools.partial(
                Job, i, check, (s, run_dir, opts.repeat),
                timeout=opts.repeat * (4 * s.budget.seconds + pool.setup_slack)))
            for what, entries, from_recording, recorded_one in (
                    ("s", s.shortcuts, opts.shortcuts_recorded, recorded_shortcut),
                    ("a", s.alternatives, opts.alternatives_recorded, recorded_alternative)):
                for j in range(len(entries)):
                    if from_recording:
                        scripted[(i, what, j)] = recorded_one(s, j, opts.recorded)
                        continue
                    one = functools.partial(verify_shortcut, accel=opts.accel,
                                            transport=opts.transport, record_to=opts.record_to,
                                            alternative=what == "a")
                    work.append(functools.partial(
                        Job, (i, what, j), one, (s, j, run_dir, opts.repeat),
                        timeout=opts.repeat * (2 * s.budget.seconds + pool.setup_slack)))
        drive(pool, work, gathered)
    results = [found[i] for i in range(len(scenarios))]
    for i, (s, v) in enumerate(zip(scenarios, results, strict=True)):
        if v.deferred:
            continue
        add_shortcuts(v, [scripted[(i, "s", j)] for j in range(len(s.shortcuts))])
        add_alternatives(v, [scripted[(i, "a", j)] for j in range(len(s.alternatives))])
        rejected = sum(r.rejected is True for r in v.shortcuts)
        passed = sum(r.rejected is False for r in v.alternatives)
        log.info("%s: %s; %d of %d shortcuts rejected, %d of %d alternatives passed", s.id,
                 "valid" if v.valid else "INVALID", rejected, len(v.shortcuts), passed,
                 len(v.alternatives))
    # The report: every noop, oracle, shortcut and alternative cassette (recorded ones included).
    cassettes = dict.fromkeys(p.resolve() for p in [
        *sorted(run_dir.glob(f"*{layout.SUFFIX}")),
        *(Path(v.noop_cassette) for v in results if v.noop_cassette),
        *(Path(v.cassette) for v in results if v.cassette),
        *(Path(r.cassette) for v in results for r in (*v.shortcuts, *v.alternatives)
          if r.cassette)] if p.is_file())
    headers, rows = table_rows(results)  # the report leads with verify's own table
    checks = html_report.ChecksTable(headers, rows, [v.valid for v in results])
    report = html_report.refresh(run_dir, log, cassettes=list(cassettes), checks=checks)
    if report is not None:
        log.info("report: %s", report)
    return VerifyRun(results, run_dir, report)
