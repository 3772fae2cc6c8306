"""Scenarios that prove themselves: five checks per scenario, all on real VMs.

A benchmark task is only worth something if (1) the clean machine satisfies
its invariants, (2) its fault really lands (a success probe fails after
setup and none errors), (3) doing nothing fails it without tripping an
invariant, (4) its reference solution passes it without collateral damage
and (5) none of its ``shortcuts`` (commands that look like a fix and are
not) passes it. Peers have shipped tasks that failed each of these;
``rootbench verify`` runs them all.

Two episodes per scenario cover the first four checks: the noop agent's
(baseline, precheck, final verdict) and the oracle's (recorded as a
cassette, so ``make test`` can replay it offline). The fifth is one
episode per shortcut, its agent the ``scripted`` one replaying exactly the
shortcut's commands, each recorded beside the oracle's cassette at
:func:`shortcut_cassette` (``<record-to>/shortcuts/<scenario-id>/<slug>.jsonl``)
so it replays offline too. Each shortcut is a job of its own, so
``verify --jobs N`` runs them side by side with the scenarios' checks.

``make test`` re-runs the oracle live but proves the noop and the shortcuts
from these recordings (``--noop recorded --shortcuts recorded``): the
oracle's own episode checks the baseline and that the fault lands before it
acts, and a recording proves something only if it is of this very spec and
replays offline, through today's judging, to ``fail`` (:func:`recorded_noop`,
:func:`recorded_shortcut`). With ``--record-to`` the noop run is recorded at
``noop/<scenario-id>.jsonl`` under it.

A shortcut proves the scenario only by ending ``fail``: one that passes
makes the scenario invalid and is named; one that ends ``infra-error`` or
``invalid-scenario`` proves nothing, and the check is then not reached. A
scenario that lists no shortcuts has nothing proving that it cannot be
passed without the fix: its fifth check is not proven, and so it is not
valid (``valid`` means every check passed).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.app.replay import load_replayable, replay_loaded
from runner.app.runs import slug
from runner.backends.framing import helper_digest
from runner.backends.images import load_recipe
from runner.core import layout
from runner.core.cassette import Cassette
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.model import commands_digest
from runner.core.outcomes import Flag, ProbeOutcome, ReplayResult, StopReason, Verdict
from runner.core.rules import CURRENT_RULES
from runner.core.spec import PROSE_KEYS, Scenario, scenario_to_dict, scenario_view
from runner.core.text import one_line

log = logging.getLogger("rootbench.verify")

# The checks the noop and oracle episodes of one job answer, then the shortcuts' (one job each).
EPISODE_CHECKS = ("baseline", "fault lands", "noop fails", "oracle passes")
SHORTCUTS = "shortcuts rejected"
ALTERNATIVES = "alternatives pass"
CHECKS = (*EPISODE_CHECKS, SHORTCUTS, ALTERNATIVES)
WHY = "verify: scripted agents speak native tool calls"


@dataclass
class ShortcutRun:
    """What one shortcut's episode(s) proved: ``rejected`` True (it failed every try), False
    (it passed: the scenario is invalid) or None (infra-error or invalid-scenario: nothing)."""

    name: str
    kind: str
    rejected: bool | None
    verdict: str  # the deciding try's verdict
    reason: str  # that try's reason: why the shortcut failed, or how it passed
    cassette: str | None = None
    seconds: float = 0.0
    tries: int = 1

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "rejected": self.rejected,
                "verdict": self.verdict, "reason": self.reason, "cassette": self.cassette,
                "seconds": self.seconds, "tries": self.tries}


@dataclass
class Verification:
    scenario: str
    checks: dict[str, bool | None] = field(default_factory=dict)  # None: not reached
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cassette: str | None = None
    tries: int = 1  # how many times the checks ran (verify --repeat)
    flaky: bool = False  # the tries disagreed on some check
    shortcuts: list[ShortcutRun] = field(default_factory=list)  # in the spec's order
    # The spec's valid alternative fixes, each as a ShortcutRun whose ``rejected`` is True when
    # the alternative *failed* (a probe refused a correct fix), False when it passed.
    alternatives: list[ShortcutRun] = field(default_factory=list)
    noop_cassette: str | None = None  # the noop run's (recorded, or the one it was proven from)
    # Not checked in this run (verify --max-live): its recording is stale and it was not among
    # those run live today. Neither valid nor invalid; reported apart.
    deferred: bool = False

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
                          seconds=round(sum(t.seconds for t in tries), 1),
                          noop_cassette=tries[-1].noop_cassette)
    for check in EPISODE_CHECKS:  # a shortcut's tries are judged by judge_shortcut
        seen = [t.checks.get(check) for t in tries]
        merged.checks[check] = None if any(x is None for x in seen) else all(seen)
        if len({x for x in seen if x is not None}) > 1:
            merged.flaky = True
            passed = sum(1 for x in seen if x is True)
            merged.problems.append(f"flaky: {check!r} held in {passed} of {len(seen)} tries")
    for i, t in enumerate(tries, 1):
        merged.problems += [f"{p} (try {i})" if len(tries) > 1 else p for p in t.problems]
    return merged


def broken_invariants(invariants: list[dict[str, Any]]) -> list[str]:
    """The names of the invariants that did not pass, from an episode's results or a recorded
    verdict line's (both list each as a dict with ``name`` and ``outcome``)."""
    return [p["name"] for p in invariants if p["outcome"] != ProbeOutcome.PASS]


def ended_by_infrastructure(ep: Episode, v: Verification, t0: float) -> Verification:
    """``v`` ended by an infra-error: the machine's fault, not the scenario's."""
    v.problems.append(f"infrastructure: {ep.reason}")
    v.seconds = round(time.monotonic() - t0, 1)
    return v


def baseline_check(ep: Episode, v: Verification) -> None:
    bad = [p for p in ep.baseline if p["outcome"] != ProbeOutcome.PASS]
    v.checks["baseline"] = not bad and ep.stop is not StopReason.INFRA_ERROR
    if bad:
        v.problems.append(f"baseline: invariant {bad[0]['name']!r} does not hold on a clean VM "
                          f"({bad[0]['detail']})")


def fault_check(ep: Episode, v: Verification) -> None:
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


def noop_check(verdict: Verdict | str, reason: str, tripped: list[str], v: Verification) -> None:
    """The third check from the noop run's verdict and the invariants it broke."""
    v.checks["noop fails"] = verdict == Verdict.FAIL and not tripped
    if verdict != Verdict.FAIL:
        v.problems.append(f"noop fails: the noop agent's run ended {verdict} ({reason})")
    elif tripped:
        # An invariant that the fault itself breaks would blame every agent for collateral damage.
        v.problems.append(f"noop fails: doing nothing broke invariant {tripped[0]!r}; "
                          "it depends on the fault, not on what the agent does")


def recorded_noop(scenario: Scenario, recorded: Path, v: Verification) -> None:
    """"noop fails" from the noop run recorded under ``recorded`` (see :func:`replayed_verdict`)."""
    path = layout.noop_cassette_path(recorded, scenario.id)
    v.noop_cassette = str(path)
    verdict, why = replayed_verdict(path, scenario)
    if verdict is None:
        v.checks["noop fails"] = None
        v.problems.append(f"noop fails: not proven: {why}")
        return
    noop_check(str(verdict.get("verdict")), one_line(str(verdict.get("reason", "")), 300),
                broken_invariants(verdict.get("invariants") or []), v)


def replayed_verdict(path: Path, scenario: Scenario,
                     commands: Sequence[str] | None = None) -> tuple[dict[str, Any] | None, str]:
    """The verdict line of the recording at ``path`` if it proves something, else None and why.

    A recording stands in for a live run only if it is of this very spec (its
    sha256, which covers the setup, probes and the commands run) and replays
    offline, through today's judging, to the verdict it recorded. Anything
    less is "not proven", never a pass or a fail.
    """
    if not path.is_file():
        return None, f"no recording at {path}: record it with `rootbench verify`"
    try:
        rep = load_replayable(path)
    except InvalidInput as exc:
        return None, f"its recording is unreadable: {one_line(str(exc), 200)}"
    same_judging = _same_judging(rep.cassette, scenario, commands)
    if not same_judging:
        return None, (f"{path} was recorded against another version of the spec: record it "
                      "again with `rootbench verify`")
    # A spec whose prose alone changed is judged as recorded: replay the recorded scenario.
    outcome = replay_loaded(rep, offline=True, specs=[Path(scenario.path).parent],
                            allow_spec_changes=rep.cassette.head.spec_hash != scenario.spec_hash)
    if outcome.result is not ReplayResult.SAME:
        return None, f"its recording replays {outcome.result}: {one_line(outcome.note, 200)}"
    return dict(rep.cassette.verdict or {}), ""


def _recorded_builds(image: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """(image name, recipe key, helper digest) of every machine a header's sandbox describes."""
    out = set()
    for m in (image, *(m for m in image.get("machines") or () if isinstance(m, Mapping))):
        out.add((str(m.get("image", "")), str(m.get("recipe_key", "")), str(m.get("helper", ""))))
    return out


def _same_judging(cassette: Cassette, scenario: Scenario,
                  commands: Sequence[str] | None = None) -> bool:
    """Whether a recording was judged by what ``scenario`` says today.

    The same spec file is; so is a spec changed only in what judges no
    scripted run (:data:`runner.core.spec.PROSE_KEYS`: a task told as a
    symptom, a hint reworded; another shortcut or alternative added): the
    scenario the header recorded and today's, less that prose, must be equal
    key for key, and a shortcut's or an alternative's run must be of its very
    ``commands`` (their hash in the scripted agent's fingerprint, or, in a
    recording from before the fingerprint had one, the commands its replies
    ran).
    """
    head = cassette.head
    if head.spec_hash == scenario.spec_hash:
        return True
    if scenario_view(head.scenario, PROSE_KEYS) != scenario_view(scenario_to_dict(scenario), PROSE_KEYS):
        return False
    if commands is None:
        return True
    recorded = head.model.get("commands_sha256")
    if isinstance(recorded, str):
        return recorded == commands_digest(commands)
    return _commands_run(cassette) == list(commands)


def _commands_run(cassette: Cassette) -> list[str]:
    """The commands a scripted agent's recorded replies ran, in order (run_command calls)."""
    out: list[str] = []
    for event in cassette.stream("model"):
        message = (event.get("reply") or {}).get("message") or {}
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or function.get("name") != "run_command":
                continue
            try:
                command = json.loads(function.get("arguments") or "{}").get("command")
            except (ValueError, AttributeError):
                command = None
            if isinstance(command, str):
                out.append(command)
    return out


def stale_proof(path: Path, scenario: Scenario) -> str | None:
    """Why the recording at ``path`` cannot stand for a live oracle run today, or None.

    A recording of the oracle proves the scenario today only if nothing it
    depended on has changed since: the spec (its sha256), the judging rules,
    the image recipe each machine was built from (its cache key) and the
    guest helper that ran the probes (its digest). ``make test`` runs live
    only the scenarios this names, and a small rotating sample of the rest
    (``verify --oracle changed``); ``make verify`` runs them all.
    """
    try:
        cassette = Cassette.load(path)
    except (OSError, InvalidInput) as exc:
        return f"no usable recording: {one_line(str(exc), 160)}"
    head = cassette.head
    if not _same_judging(cassette, scenario):
        return "the spec changed since it was recorded"
    if head.rules != CURRENT_RULES:
        return f"recorded under judging rules {int(head.rules)}, today's are {int(CURRENT_RULES)}"
    images = {m.image for m in scenario.machines} or {scenario.image}
    today = {(name, load_recipe(name).key, helper_digest()) for name in images}
    recorded = _recorded_builds(head.image)
    if recorded != today:
        return "recorded on another image recipe or guest helper"
    return None


def recorded_oracle(scenario: Scenario, recorded: Path, v: Verification) -> bool:
    """The first four checks from the committed oracle recording, if it still proves them
    (:func:`stale_proof`, then :func:`replayed_verdict`): True when it did, False when the
    oracle must run live (the reason is logged)."""
    path = recorded / layout.oracle_cassette_name(scenario.id)
    why = stale_proof(path, scenario)
    verdict = None
    if why is None:
        verdict, why = replayed_verdict(path, scenario)
    if verdict is None:
        log.info("%s: the oracle runs live: %s", scenario.id, why)
        return False
    ep = Episode.from_dict(verdict)
    v.cassette = str(path)
    baseline_check(ep, v)
    fault_check(ep, v)
    oracle_check(ep, v)
    return True


def oracle_check(ep: Episode, v: Verification) -> None:
    ok = ep.verdict is Verdict.PASS and Flag.COLLATERAL not in ep.flags
    v.checks["oracle passes"] = ok
    if not ok:
        broken = broken_invariants(ep.invariants)
        detail = f"invariant {broken[0]!r} broke" if broken and ep.verdict is Verdict.PASS else ep.reason
        v.problems.append(f"oracle passes: the solution's run ended {ep.verdict} ({detail})")


def shortcut_slugs(scenario: Scenario, alternatives: bool = False) -> list[str]:
    """Each shortcut's (or alternative's) file name stem, in the spec's order: its name made a
    lower-case slug, ``-2``, ``-3`` ... after a stem an earlier one already took (names differ
    in case or punctuation only)."""
    out: list[str] = []
    for s in (scenario.alternatives if alternatives else scenario.shortcuts):
        base = slug(s.name).lower()
        stem, n = base, 1
        while stem in out:
            n += 1
            stem = f"{base}-{n}"
        out.append(stem)
    return out


def shortcut_cassette(record_dir: Path, scenario: Scenario, index: int,
                      alternative: bool = False) -> Path:
    """Where shortcut (or alternative) ``index`` of ``scenario`` is recorded: beside the
    oracle's cassettes."""
    stem = shortcut_slugs(scenario, alternative)[index]
    where = layout.alternative_cassette_path if alternative else layout.shortcut_cassette_path
    return where(record_dir, scenario.id, stem)


ALTERNATIVE_KIND = "alternative"


def judge_alternative(name: str, kind: str, episodes: list[Episode]) -> ShortcutRun:
    """One valid alternative's tries as one finding: it must pass every try (a correct fix
    that passes only sometimes meets a flaky probe); a fail in any try is a probe too narrow
    (``rejected`` True); an infra-error or invalid-scenario proves nothing (None)."""
    deciding = next((e for e in episodes if e.verdict is Verdict.FAIL), None)
    rejected: bool | None = True
    if deciding is None:
        deciding = next((e for e in episodes if e.verdict is not Verdict.PASS), None)
        rejected = None if deciding is not None else False
        deciding = deciding or episodes[-1]
    return ShortcutRun(name=name, kind=kind, rejected=rejected, verdict=deciding.verdict.value,
                       reason=one_line(deciding.reason, 300), tries=len(episodes))


def slowest_first(scenarios: list[Scenario], recorded: Path) -> list[int]:
    """The scenarios' indexes in the order verify should start them: the slowest first.

    A verify's wall time is its jobs' makespan: a cron scenario that waits
    out its minute, started last, keeps one slot busy while the others sit
    idle. Starting the longest first (the classic longest-processing-time
    rule) packs the slots. How long each takes is read from its committed
    oracle cassette's verdict line (``seconds``); a scenario without one is
    taken as the slowest, since nothing says it is quick. Results are still
    reported in the order given.
    """
    def took(scenario: Scenario) -> float:
        try:
            verdict = Cassette.load(recorded / layout.oracle_cassette_name(scenario.id)).verdict
        except (OSError, InvalidInput):
            return math.inf
        seconds = (verdict or {}).get("seconds")
        return float(seconds) if isinstance(seconds, (int, float)) else math.inf

    times = [took(s) for s in scenarios]
    return sorted(range(len(scenarios)), key=lambda i: -times[i])


def recorded_alternative(scenario: Scenario, index: int, recorded: Path) -> ShortcutRun:
    """Valid alternative ``index`` proven from its recording: it must end ``pass``."""
    alt = scenario.alternatives[index]
    path = shortcut_cassette(recorded, scenario, index, alternative=True)
    t0 = time.monotonic()
    verdict, why = replayed_verdict(path, scenario, alt.commands)
    if verdict is None:
        return ShortcutRun(alt.name, ALTERNATIVE_KIND, None, "-", why, cassette=str(path))
    recorded_verdict = verdict.get("verdict")
    rejected = False if recorded_verdict == Verdict.PASS.value else (
        True if recorded_verdict == Verdict.FAIL.value else None)
    return ShortcutRun(alt.name, ALTERNATIVE_KIND, rejected, str(recorded_verdict),
                       one_line(str(verdict.get("reason", "")), 300), cassette=str(path),
                       seconds=round(time.monotonic() - t0, 1))


def recorded_shortcut(scenario: Scenario, index: int, recorded: Path) -> ShortcutRun:
    """Shortcut ``index`` proven from its recording instead of a new VM run.

    Running every shortcut live takes most of a verify (cron scenarios wait
    out their probes' ``within``, lasting fixes reboot), so ``make test``
    proves them from the cassettes ``make verify`` committed, each through
    :func:`replayed_verdict`: it must end ``fail``.
    """
    shortcut = scenario.shortcuts[index]
    path = shortcut_cassette(recorded, scenario, index)
    t0 = time.monotonic()
    verdict, why = replayed_verdict(path, scenario, shortcut.commands)
    if verdict is None:
        if not path.is_file():
            why += " (shortcuts run live)"
        return ShortcutRun(shortcut.name, shortcut.kind.value, None, "-", why, cassette=str(path))
    recorded_verdict = verdict.get("verdict")
    reason = one_line(str(verdict.get("reason", "")), 300)
    rejected = True if recorded_verdict == Verdict.FAIL.value else (
        False if recorded_verdict == Verdict.PASS.value else None)
    return ShortcutRun(shortcut.name, shortcut.kind.value, rejected, str(recorded_verdict), reason,
                       cassette=str(path), seconds=round(time.monotonic() - t0, 1))


def judge_shortcut(name: str, kind: str, episodes: list[Episode]) -> ShortcutRun:
    """One shortcut's tries as one finding: a pass in any try passes it (a shortcut that
    passes sometimes still passes), a fail in every try rejects it, anything else proves
    nothing (an infra-error is the machine's, not the scenario's)."""
    deciding = next((e for e in episodes if e.verdict is Verdict.PASS), None)
    rejected: bool | None = False
    if deciding is None:
        deciding = next((e for e in episodes if e.verdict is not Verdict.FAIL), None)
        rejected = None if deciding is not None else True
        deciding = deciding or episodes[-1]
    return ShortcutRun(name=name, kind=kind, rejected=rejected, verdict=deciding.verdict.value,
                       reason=one_line(deciding.reason, 300), tries=len(episodes))


def add_shortcuts(v: Verification, runs: list[ShortcutRun]) -> None:
    """The fifth check from the shortcuts' runs, with a problem naming each one that passed."""
    v.shortcuts = runs
    v.seconds = round(v.seconds + sum(r.seconds for r in runs), 1)
    if not runs:
        v.checks[SHORTCUTS] = None
        v.problems.append(f"{SHORTCUTS}: not proven: the spec lists no shortcuts, so nothing "
                          "shows it cannot be passed without the fix")
        return
    passed = [r for r in runs if r.rejected is False]
    unproven = [r for r in runs if r.rejected is None]
    v.checks[SHORTCUTS] = False if passed else (None if unproven else True)
    for r in passed:
        v.problems.append(f"shortcut {r.name!r} passed: {r.reason}")
    for r in unproven:
        v.problems.append(f"{SHORTCUTS}: not proven: shortcut {r.name!r} ended {r.verdict} "
                          f"({r.reason})")


def add_alternatives(v: Verification, runs: list[ShortcutRun]) -> None:
    """The sixth check: every valid alternative fix the spec lists passes. A spec that lists
    none has nothing to prove here (the check holds); one that a probe refuses is named."""
    v.alternatives = runs
    v.seconds = round(v.seconds + sum(r.seconds for r in runs), 1)
    refused = [r for r in runs if r.rejected is True]
    unproven = [r for r in runs if r.rejected is None]
    v.checks[ALTERNATIVES] = False if refused else (None if unproven else True)
    for r in refused:
        v.problems.append(f"alternative {r.name!r} was refused: {r.reason}")
    for r in unproven:
        v.problems.append(f"{ALTERNATIVES}: not proven: alternative {r.name!r} ended {r.verdict} "
                          f"({r.reason})")


def _mark(v: Verification, check: str) -> str:
    x = v.checks.get(check)
    if check == ALTERNATIVES:
        if not v.alternatives:
            return "none"
        passed = sum(r.rejected is False for r in v.alternatives)
        word = "ok" if x is True else ("FAIL" if x is False else "-")
        return f"{word}:{passed}/{len(v.alternatives)}"
    if check == SHORTCUTS:
        if not v.shortcuts:
            return "none"
        rejected = sum(r.rejected is True for r in v.shortcuts)
        word = "ok" if x is True else ("FAIL" if x is False else "-")
        return f"{word}:{rejected}/{len(v.shortcuts)}"  # how many of them were rejected
    return "ok" if x is True else ("FAIL" if x is False else "-")


def table_rows(results: list[Verification]) -> tuple[list[str], list[list[str]]]:
    """The table: one row per scenario, a column per check (``shortcuts rejected`` reads
    ``ok:2/2``, ``FAIL:1/2`` with how many were rejected, or ``none``), its first problem."""
    repeated = any(v.tries > 1 for v in results)
    headers = ["scenario", *CHECKS, *(["tries", "flaky"] if repeated else []), "seconds", "problem"]
    rows = [[v.scenario, *(_mark(v, c) for c in CHECKS),
             *([str(v.tries), "FLAKY" if v.flaky else "no"] if repeated else []),
             f"{v.seconds:.1f}", v.problems[0][:90] if v.problems else ""] for v in results]
    return headers, rows


def json_rows(results: list[Verification]) -> list[dict[str, object]]:
    """``verify --format json``: each table row's fields, and beside them ``valid``, every
    problem and each shortcut's finding (name, kind, rejected, verdict, reason, cassette)."""
    headers, rows = table_rows(results)
    return [{**dict(zip(headers, row, strict=True)), "valid": v.valid, "problems": v.problems,
             "shortcuts": [r.to_dict() for r in v.shortcuts],
             "alternatives": [r.to_dict() for r in v.alternatives]}
            for v, row in zip(results, rows, strict=True)]
