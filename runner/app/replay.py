"""Replaying a cassette: the recorded model (and, offline, the recorded guest) through the real loop.

Each cassette ends in one :class:`~runner.core.outcomes.ReplayResult`, most
telling first: ``unreadable`` (not a valid cassette), ``spec-changed`` (the
spec it was recorded from is no longer the same, so the recording is stale
however it replays), ``mismatch`` (the run asked for something the cassette
does not hold, or stopped short of it), ``different`` (it replayed to its
end, to another verdict or other flags) and ``same``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.app.episodes import machinery
from runner.backends.process import die_with_parent
from runner.core.cassette import Cassette, find_cassettes
from runner.core.clock import Clock
from runner.core.episode import GRADED_FIELDS, Episode, run_episode
from runner.core.errors import InvalidInput, ReplayMismatch
from runner.core.model import Model
from runner.core.outcomes import AgentKind, ReplayResult
from runner.core.protocol import Protocol, get_protocol
from runner.core.replay import (
    ReplayClock,
    ReplayGuest,
    ReplayModel,
    ReplyCheck,
    ShadowedReplayModel,
    spec_change,
)
from runner.core.rules import Rules
from runner.core.spec import Scenario, scenario_from_dict
from runner.core.text import one_line


@dataclass
class ReplayOutcome:
    """One cassette replayed: the recorded and replayed verdicts (with flags) side by side.

    ``replayed`` is the replayed verdict when the run reached one, else the
    result's name (``mismatch``, ``spec-changed``, ``unreadable``), so a
    caller that only prints ``recorded -> replayed`` still says what happened.
    """

    cassette: str
    scenario: str
    recorded: str
    replayed: str
    result: ReplayResult
    note: str
    seconds: float
    turns: int
    episode: Episode | None = None  # the replayed episode, when the replay reached a verdict
    # With a live model (replay_loaded's ``live``): each recorded turn asked of it again.
    reply_checks: tuple[ReplyCheck, ...] = ()

    @property
    def same(self) -> bool:
        """The replay reproduced the recording: the only outcome a CI run may pass on."""
        return self.result is ReplayResult.SAME


@dataclass(frozen=True)
class Replayable:
    """A cassette checked to be replayable: complete, with a scenario and protocol this code knows."""

    cassette: Cassette
    scenario: Scenario
    protocol: Protocol
    hint_level: int = 0  # the header's (cassette.head: absent in format 1 means 0)
    track_fix: bool = False  # the header's (absent in format 1: off)
    rules: Rules = Rules.V1  # the header's judging rules (absent in format 1: the first ones)


def load_replayable(path: Path) -> Replayable:
    """Read ``path`` for replay; anything that makes it unreplayable is InvalidInput naming it."""
    cas = Cassette.load(path)
    if cas.verdict is None:
        raise InvalidInput("the cassette is incomplete (no verdict): it was cut short",
                           path=str(path))
    head = cas.head
    try:
        scenario = scenario_from_dict(dict(head.scenario))
        protocol = get_protocol(head.protocol.name)
    except InvalidInput as exc:  # raised without the file: name it, and the header's field
        raise InvalidInput(exc.detail, path=str(path), line=1,
                           field=f"header.{'scenario' if exc.field != '--protocol' else 'protocol'}"
                           ) from None
    level = head.hint_level
    if level > len(scenario.hints):
        raise InvalidInput(f"hint level {level!r} is not one the recorded scenario has "
                           f"({len(scenario.hints)} hint(s))", path=str(path), line=1,
                           field="header.hint_level")
    _same_episode(cas, path)
    _clock_in_order(cas, path)
    return Replayable(cas, scenario, protocol, hint_level=level, track_fix=head.track_fix,
                      rules=head.rules)


CLOCK_SLACK = 0.05  # seconds: readings are written rounded to the microsecond, times to the ms


def _clock_in_order(cas: Cassette, path: Path) -> None:
    """Clock readings come from a monotonic clock started with the episode: never negative,
    never going back, none after the episode's end (the verdict's ``seconds``).

    An edited reading otherwise surfaces turns later as a mismatch of some
    request (its budget line) or guest exchange whose timing it changed, or
    not at all; here the reading itself is named. Of two readings out of
    order, the one whose removal puts the others in order is blamed (a spike
    up, or a dip down); when either would, the durations recorded between
    the readings break the tie. They are not used to reject a cassette: guests
    in tests report durations that never elapsed.
    """
    clocks: list[dict[str, Any]] = []
    took: list[float] = []  # took[i]: the durations recorded between readings i-1 and i
    spent = 0.0
    for event in cas.events:
        if event["type"] == "clock":
            clocks.append(event)
            took.append(spent)
            spent = 0.0
            continue
        spent += _took(event)
    ts = [float(e["t"]) for e in clocks]

    seconds = (cas.verdict or {}).get("seconds")
    end = float(seconds) if isinstance(seconds, int | float) and not isinstance(seconds, bool) \
        else None

    def slack(i: int) -> float:
        """How much longer than what ran in it the gap before reading i is (tie-break only)."""
        if i == len(ts) and ts and end is not None:
            return end - ts[-1]
        return ts[i] - ts[i - 1] - took[i] if 0 < i < len(ts) else 0.0

    def blame(i: int, why: str) -> InvalidInput:
        return InvalidInput(f"clock reading t={ts[i]!r} {why}: the clock only goes forward, so "
                            "this line was edited", path=str(path), line=cas.line_of(clocks[i]),
                            field="clock.t")

    for i, t in enumerate(ts):
        if not math.isfinite(t) or t < 0:
            raise blame(i, "is not a time since the start")
        if i and t < ts[i - 1] - CLOCK_SLACK:
            # Dropping which one leaves the rest in order: ts[i-1] (a spike) or ts[i] (a dip)?
            spike = i < 2 or ts[i - 2] <= t
            dip = i + 1 >= len(ts) or ts[i - 1] <= ts[i + 1]
            if spike and dip:  # either: the one whose other gap is longer than what ran in it
                spike = slack(i - 1) > slack(i + 1)
            if spike:
                raise blame(i - 1, f"is later than the next reading (t={t!r})")
            raise blame(i, f"is earlier than the one before (t={ts[i - 1]!r})")
    if ts and end is not None and ts[-1] > end + CLOCK_SLACK:
        raise blame(len(ts) - 1, f"is later than the episode's end ({seconds!r} s, line "
                                 f"{cas.line_of(cas.verdict or {})})")


def _took(event: dict[str, Any]) -> float:
    """How long a recorded guest exchange or model call says it took (0 when it says nothing
    usable): what must fit between the clock readings around it."""
    holder = event.get("result") if event["type"] == "guest" else event.get("reply")
    duration = holder.get("duration") if isinstance(holder, dict) else None
    if isinstance(duration, int | float) and not isinstance(duration, bool) \
            and math.isfinite(duration) and duration > 0:
        return float(duration)
    return 0.0


def clock_suspect(cas: Cassette) -> str | None:
    """The clock reading that leaves too little time for what ran before it, or None.

    The clock starts at 0 with the episode, and every guest exchange and model
    call between two readings ran between them. A reading edited within the
    order :func:`_clock_in_order` checks still breaks that; a replay that
    diverged names it first, ahead of the request or exchange it threw off.
    (Not a reason to refuse a cassette: test guests report durations that
    never elapsed.)
    """
    prev_t, prev_line, spent = 0.0, None, 0.0
    for event, line in zip(cas.events, cas.lines, strict=False):
        if event["type"] == "clock":
            t = float(event["t"])
            if t - prev_t < spent - CLOCK_SLACK:
                # A spike at the earlier reading or a dip at this one: both are named.
                if prev_line is None:
                    return (f"line {line}: clock reading t={t!r} was edited: it is {t:.3f} s "
                            f"after the start, but what ran before it took {spent:.3f} s")
                return (f"line {line}: clock reading t={t!r} or the reading t={prev_t!r} (line "
                        f"{prev_line}) was edited: they are {t - prev_t:.3f} s apart, but what "
                        f"ran between them took {spent:.3f} s")
            prev_t, prev_line, spent = t, line, 0.0
            continue
        spent += _took(event)
    return None


def _same_episode(cas: Cassette, path: Path) -> None:
    """The verdict line must be about the episode the header recorded.

    A replay compares verdicts and graded figures, not who the verdict names:
    a verdict line edited to another scenario, agent, model, protocol or round
    would otherwise replay "same" while saying something the run never did.
    """
    head, verdict = cas.head, cas.verdict or {}

    def agent(value: object) -> object:
        try:
            return AgentKind(value)
        except ValueError:
            return value

    expected = {
        "scenario": (head.scenario.get("id"), lambda v: v),
        "agent": (head.model_kind, agent),
        "model": (head.model_name, lambda v: v),
        "protocol": (head.protocol.name, lambda v: v),
        "round": (head.round, lambda v: v),
    }
    for key, (want, norm) in expected.items():
        if key in verdict and want is not None and norm(verdict[key]) != want:
            raise InvalidInput(f"the verdict names {verdict[key]!r}, the header {str(want)!r}: "
                               "the verdict is not the recorded episode's", path=str(path),
                               field=f"verdict.{key}")


def unreadable(path: Path, exc: InvalidInput) -> ReplayOutcome:
    """The outcome of a cassette that could not be read: its one-line reason is the note."""
    return ReplayOutcome(str(path), "?", "?", ReplayResult.UNREADABLE.value,
                         ReplayResult.UNREADABLE, _note(str(exc)), 0.0, 0)


def _note(text: str) -> str:
    """A note is one table cell: one line, terminal controls stripped."""
    return one_line(text, 500)


def _verdict_text(verdict: str, flags: list[str]) -> str:
    return verdict + (f" [{','.join(flags)}]" if flags else "")


# What a replay must reproduce of a verdict, when the recording has it (older ones do not): the
# graded figures (:data:`GRADED_FIELDS`) and the hint level the header asked for. Timings
# (seconds, phases, started/ended) are not compared: they differ on every run.
_COMPARED = ("hint_level", *GRADED_FIELDS)


def _graded_difference(recorded: dict[str, Any], ep: Episode, *, offline: bool) -> str | None:
    """The first graded figure the replay got differently from the recording, or None.

    Equal verdicts are not enough for "same": a replay must also reproduce the
    score, the milestones reached, the hint level and fix tracking. The time of
    the fix is compared offline only (a live replay runs on its own clock).
    """
    for key in _COMPARED:
        if key not in recorded:
            continue
        was, now = recorded[key], getattr(ep, key)
        if key == "fixed_at":
            keys = ("turn", "seconds") if offline else ("turn",)
            was, now = (None if fix is None else {k: fix.get(k) for k in keys}
                        for fix in (was, now))
        if was != now:
            return f"{key}: recorded {recorded[key]!r}, replayed {getattr(ep, key)!r}"
    return None


def replay_one(path: Path, *, offline: bool, lenient: bool = False,
               allow_spec_changes: bool = False, accel: str = "auto",
               transport: str = "serial", specs: list[Path] | None = None) -> ReplayOutcome:
    """Run a recorded episode again, the model (and with ``offline`` the guest) from the cassette.

    An unreadable cassette raises InvalidInput, as any bad input does (the
    replay command tables it as ``unreadable`` with :func:`unreadable`).
    """
    return replay_loaded(load_replayable(path), offline=offline, lenient=lenient,
                         allow_spec_changes=allow_spec_changes, accel=accel,
                         transport=transport, specs=specs)


def replay_loaded(rep: Replayable, *, offline: bool, lenient: bool = False,
                  allow_spec_changes: bool = False, accel: str = "auto",
                  transport: str = "serial", specs: list[Path] | None = None,
                  live: Model | None = None) -> ReplayOutcome:
    """Replay a cassette :func:`load_replayable` accepted; see the module docstring for outcomes.

    ``lenient`` serves the recorded reply to a request that differs (and
    lets the run stop short of the recorded turns), which replaying against
    a real VM needs. ``allow_spec_changes`` replays a cassette whose spec has
    changed anyway, from the scenario the header recorded, saying so in the
    note. ``specs`` are the folders today's specs are looked up in by id
    (default: ``$ROOTBENCH_SPECS``, else the bundled scenarios). With ``live``
    (offline, not lenient) each recorded request is also asked of that model and the outcome's
    ``reply_checks`` say whether it gave the recorded reply
    (:class:`~runner.core.replay.ShadowedReplayModel`).
    """
    if live is not None and (lenient or not offline):
        raise ValueError("a live model's replies are checked on a strict, offline replay only")
    cas, scenario = rep.cassette, rep.scenario
    path = str(cas.path)
    rec = cas.verdict or {}
    recorded = _verdict_text(str(rec.get("verdict", "?")), [str(f) for f in rec.get("flags") or []])
    notes: list[str] = []
    changed = spec_change(cas, specs)
    if changed is not None:
        if not allow_spec_changes:
            return ReplayOutcome(path, scenario.id, recorded, ReplayResult.SPEC_CHANGED.value,
                                 ReplayResult.SPEC_CHANGED,
                                 _note(f"{changed}; re-record it, or pass "
                                            "--allow-spec-changes"), 0.0, 0)
        notes.append(f"spec changed, replayed the recorded one: {changed}")
    model = ReplayModel(cas, lenient=lenient) if live is None else ShadowedReplayModel(cas, live)
    checks = model.checks if isinstance(model, ShadowedReplayModel) else []
    guest = ReplayGuest(cas) if offline else None
    clock = ReplayClock(cas) if offline else None
    try:
        ep = _run(rep, model, guest, clock, offline=offline, accel=accel, transport=transport)
        # A run that used fewer recorded events than the recording did is a divergence too.
        short = [s for s in (guest.unserved() if guest else None,
                             clock.unserved() if clock else None) if s]
        if (left := model.unserved()) is not None:
            if lenient:
                notes.append(left)
            else:
                short.insert(0, left)
        if short:
            raise ReplayMismatch(short[0])
    except ReplayMismatch as exc:
        notes.insert(0, str(exc))
        if offline and (suspect := clock_suspect(cas)) is not None:
            notes.insert(0, suspect)  # the cause, ahead of the exchange it threw off
        return ReplayOutcome(path, scenario.id, recorded, ReplayResult.MISMATCH.value,
                             ReplayResult.MISMATCH, _note("; ".join(notes)), 0.0, model.turn,
                             reply_checks=tuple(checks))
    replayed = _verdict_text(ep.verdict.value, [f.value for f in ep.flags])
    result = ReplayResult.SAME if recorded == replayed else ReplayResult.DIFFERENT
    if result is ReplayResult.DIFFERENT:
        notes.insert(0, ep.reason)
    elif (graded := _graded_difference(rec, ep, offline=offline)) is not None:
        result = ReplayResult.DIFFERENT
        notes.insert(0, graded)
    if result is ReplayResult.DIFFERENT and offline and (suspect := clock_suspect(cas)):
        notes.insert(0, suspect)
    notes.extend(model.mismatches)
    return ReplayOutcome(path, scenario.id, recorded, replayed, result,
                         _note("; ".join(n for n in notes if n)), ep.seconds, ep.turns, ep,
                         tuple(checks))


def _run(rep: Replayable, model: ReplayModel, guest: ReplayGuest | None,
         clock: ReplayClock | None, *, offline: bool, accel: str, transport: str) -> Episode:
    """The episode itself: offline from the cassette's guest and clock, else on a fresh VM.

    The hint level and fix tracking come from the header (absent: 0 and off,
    as every cassette recorded before them ran): the same task text and the
    same probe runs through the guest as the recording. The replay's phases
    are its own timings (offline: no ``restore``, and host time, not the
    recorded clock); they are never compared with the recording's.
    """
    cas, scenario = rep.cassette, rep.scenario
    round_ = cas.head.round
    if offline:
        assert guest is not None and clock is not None
        return run_episode(scenario, guest.for_scenario(scenario), model, rep.protocol, clock,
                           None, round_=round_,
                           hint_level=rep.hint_level, track_fix=rep.track_fix, rules=rep.rules)
    with machinery(scenario, accel, transport) as box:
        return run_episode(scenario, box.guest, model, rep.protocol, Clock(), None,
                           vm_killed=box.killed_externally, round_=round_,
                           hint_level=rep.hint_level, track_fix=rep.track_fix,
                           restore_seconds=box.ready_s, rules=rep.rules)


# --- many cassettes: both cores, each outcome handed back in order as soon as it is decided --

# Offline replay is pure CPU (the guest, the model and the clock are the cassette's): one
# process per core. Two, because the development machine and CI have two and are shared; a
# replay against VMs stays one at a time (each boots a VM).
REPLAY_JOBS = 2
MIN_POOLED = 16  # fewer cassettes than this replay in the caller: a pool would cost more than it saves
CHUNK = 4  # cassettes a worker takes at a time: ~10 ms each, so the order streams and stays balanced


@dataclass(frozen=True)
class Decided:
    """One cassette's outcome, as :func:`replay_all` hands it back.

    ``error`` is the one-line reason of an ``unreadable`` cassette, as the
    command prints it on stderr (the outcome's note is the same, cut for a table).
    """

    outcome: ReplayOutcome
    error: str | None = None


@dataclass(frozen=True)
class _Options:
    """What every cassette of one :func:`replay_all` is replayed with (sent to each worker)."""

    offline: bool
    lenient: bool
    allow_spec_changes: bool
    accel: str
    transport: str
    specs: tuple[Path, ...] | None
    keep_episode: bool
    rules: Rules | None = None  # judge under these rules, not the recording's own (rejudge)


def _decide(path: Path, options: _Options) -> Decided:
    """Replay one cassette; an unreadable one is its outcome, never an exception."""
    try:
        rep = load_replayable(path)
    except InvalidInput as exc:
        return Decided(unreadable(path, exc), str(exc))
    if options.rules is not None:
        rep = dataclasses.replace(rep, rules=options.rules)
    outcome = replay_loaded(rep, offline=options.offline, lenient=options.lenient,
                            allow_spec_changes=options.allow_spec_changes, accel=options.accel,
                            transport=options.transport,
                            specs=list(options.specs) if options.specs is not None else None)
    if not options.keep_episode:
        outcome.episode = None  # what a worker sends back is the table's, not the whole run
    return Decided(outcome)


def _worker_start() -> None:
    """A pool worker: Ctrl-C is the parent's to handle (it ends the pool), SIGTERM (the pool's
    terminate) ends it at once, and it dies with the parent, so none outlives the command."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()


def replay_jobs(count: int, *, offline: bool) -> int:
    """How many processes replay ``count`` cassettes: :data:`REPLAY_JOBS` offline (at most the
    cores this process may use), one for a few cassettes, against VMs, or where fork is not."""
    if not offline or count < MIN_POOLED or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(REPLAY_JOBS, len(os.sched_getaffinity(0))))


def replay_all(paths: Sequence[Path], *, offline: bool, lenient: bool = False,
               allow_spec_changes: bool = False, accel: str = "auto",
               transport: str = "serial", specs: list[Path] | None = None,
               jobs: int | None = None,
               rules: Rules | None = None) -> Generator[Decided, None, None]:
    """Each cassette's outcome, in the order of ``paths``, each as soon as it and every one
    before it are decided (the order never depends on which worker was faster).

    ``jobs`` processes replay them (default :func:`replay_jobs`). Workers are
    forked from this process, so they start in milliseconds with what it has
    already imported; a pooled outcome carries no ``episode`` (the run is the
    worker's: only the table's fields come back). Closing the iterator (the
    reader went away, Ctrl-C) ends the workers at once, mid-cassette.
    """
    if rules is not None and offline:
        raise ValueError("other judging rules need a live guest: a recording holds only what its own rules read")
    options = _Options(offline, lenient, allow_spec_changes, accel, transport,
                       tuple(specs) if specs is not None else None,
                       keep_episode=False, rules=rules)
    jobs = replay_jobs(len(paths), offline=offline) if jobs is None else jobs
    if jobs <= 1 or len(paths) < 2:
        for path in paths:
            yield _decide(path, dataclasses.replace(options, keep_episode=True))
        return
    # The first here, before the fork: what every cassette needs once (the compiled cassette
    # schema, ~0.1 s) is then the workers' from the start, and the first row comes at once.
    yield _decide(paths[0], options)
    with multiprocessing.get_context("fork").Pool(jobs, initializer=_worker_start) as pool:
        # Pool.__exit__ is terminate(): a reader that stops reading stops the workers too.
        yield from pool.imap(functools.partial(_decide, options=options), paths[1:], CHUNK)


# --- the replay command's table, a row at a time ----------------------------------------------

COLUMNS = ("cassette", "scenario", "recorded", "replayed", "same", "outcome", "note")
NOTE_WIDTH = 120  # a table cuts a note here; JSON keeps it whole


class OutcomeTable:
    """The replay command's table, printed a row at a time as each cassette is decided.

    A table (``github``, ``plain``) cannot wait for every row to size its columns, so
    the widths are fixed before the first: the cassettes' own names are known, the
    scenario column is as wide as the longest name a cassette file suggests, and the
    others are as wide as their usual values (a longer value widens its own row only).
    ``json`` is the one JSON document stdout promises, an array written an element at
    a time.
    """

    def __init__(self, fmt: str, cassettes: Sequence[str]) -> None:
        self.fmt = fmt
        self._rows = 0
        names = [Path(c).name.split(".")[0] for c in cassettes]
        self.widths = [max([len(COLUMNS[0]), *map(len, cassettes)]),
                       max([len(COLUMNS[1]), *map(len, names)]), 24, 24, 4, 12, 0]

    @staticmethod
    def cells(o: ReplayOutcome, note_width: int | None = NOTE_WIDTH) -> list[str]:
        """One outcome as the table's cells."""
        return [o.cassette, o.scenario, o.recorded, o.replayed, "yes" if o.same else "NO",
                o.result.value, o.note if note_width is None else o.note[:note_width]]

    def _line(self, cells: Sequence[str]) -> str:
        if self.fmt == "plain":
            return "  ".join(c.ljust(w) for c, w in zip(cells, self.widths, strict=True)).rstrip()
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, self.widths, strict=True)) + " |"

    def head(self) -> str:
        """What comes before the first row."""
        if self.fmt == "json":
            return "["
        if self.fmt == "plain":
            return self._line(COLUMNS)
        rule = "|" + "|".join("-" * (w + 2) for w in self.widths) + "|"
        return self._line(COLUMNS) + "\n" + rule

    def row(self, o: ReplayOutcome) -> str:
        """One outcome's row (an element of the JSON array)."""
        self._rows += 1
        if self.fmt == "json":
            element = json.dumps(dict(zip(COLUMNS, self.cells(o, None), strict=True)))
            return ("  " if self._rows == 1 else ", ") + element
        return self._line(self.cells(o))

    def end(self) -> str | None:
        """What comes after the last row (None: nothing)."""
        return "]" if self.fmt == "json" else None


def replay_table(words: Sequence[str], *, fmt: str, offline: bool, lenient: bool,
                 allow_spec_changes: bool, accel: str, transport: str,
                 specs: list[Path] | None, one_process: bool,
                 out: Callable[[str], None], err: Callable[[str], None]) -> int:
    """``rootbench replay``: each cassette of ``words`` replayed and tabled; 0 only if every one
    is ``same``.

    Each row goes to ``out`` as soon as its cassette and every one before it
    are decided. One bad cassette does not stop the others: it is tabled
    ``unreadable`` with its one-line reason (also to ``err``) and makes the
    exit 2, as bad input does; any ``different``, ``mismatch`` or
    ``spec-changed`` makes it 1. A named path that does not exist is bad input
    at once; a subfolder that cannot be listed is a row of its own.
    ``one_process`` keeps each cassette's progress lines together (``-v``).
    """
    folders: list[tuple[Path, str]] = []  # folders that could not be listed: each is a row
    named: list[str | Path] = list(words)
    paths = find_cassettes(named, unreadable=folders)
    outcomes: list[ReplayOutcome] = []
    table = OutcomeTable(fmt, [str(f) for f, _why in folders] + [str(p) for p in paths])
    out(table.head())
    for folder, why in folders:
        exc = InvalidInput(why, path=str(folder))
        err(f"rootbench: {exc}")
        outcomes.append(unreadable(folder, exc))
        out(table.row(outcomes[-1]))
    t0 = time.monotonic()
    with contextlib.closing(replay_all(paths, offline=offline, lenient=lenient,
                                       allow_spec_changes=allow_spec_changes, accel=accel,
                                       transport=transport, specs=specs,
                                       jobs=1 if one_process else None)) as decided:
        for done in decided:
            if done.error is not None:
                err(f"rootbench: {done.error}")
            outcomes.append(done.outcome)
            out(table.row(done.outcome))
    if (end := table.end()) is not None:
        out(end)
    counts = {r: sum(o.result is r for o in outcomes) for r in ReplayResult}
    if fmt != "json":
        others = ", ".join(f"{n} {r.value}" for r, n in counts.items()
                           if n and r is not ReplayResult.SAME)
        out(f"\n{counts[ReplayResult.SAME]}/{len(outcomes)} replayed verdicts equal the recorded "
            f"ones{f' ({others})' if others else ''} ({time.monotonic() - t0:.1f}s)")
    if counts[ReplayResult.UNREADABLE]:
        return 2
    return 0 if counts[ReplayResult.SAME] == len(outcomes) else 1
