"""What a bench runs, in what order, and what is already done: a plain object, no VM, no model.

A bench is a matrix of :class:`Arm` (model x protocol x hint level) over
scenarios and rounds. Each (arm, scenario, round) is a *round*; a round is
one episode at its arm's hint level, or with ``--ladder`` a chain of them:
level 0, then one level higher after each plain failure, until a pass or
the last hint. :class:`BenchPlan` answers, from what the bench asks and
what is already on disk (a resume's results, ``--record-to``'s cassettes),
which level a round must run next, whether that step is replayed from a
recording or run live, and the stable order results are written in. The
driver (:mod:`runner.app.bench`) asks it and tells it what ended; nothing
here starts a machine or a model, so all of it is tested without either.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runner.app.agents import AgentChoice
from runner.app.episodes import RunOptions
from runner.app.runs import slug
from runner.core import layout
from runner.core.cassette import Cassette, RecordMode
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.outcomes import Verdict
from runner.core.spec import Scenario, ran_as_today

Key = tuple[str | None, str, int, int]  # (arm, scenario, round, hint level): one episode, one cassette


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


def _recorded_pass(path: Path, scenario: Scenario) -> bool:
    """Whether the cassette at ``path`` ended in a pass of ``scenario`` as its spec is today
    (its replay then passes too, and the ladder climbs no further). Anything less certain (a
    damaged cassette, no verdict line, another version of the spec) is not a pass: the ladder
    may climb past it, and :meth:`BenchPlan.live` then keeps a model ready."""
    try:
        cassette = Cassette.load(path)
    except (InvalidInput, OSError, ValueError):
        return False
    verdict = cassette.verdict
    return (ran_as_today(cassette.head.spec_hash, cassette.head.scenario, scenario) and isinstance(verdict, dict)
            and verdict.get("verdict") == Verdict.PASS.value)


@dataclasses.dataclass(frozen=True)
class Round:
    """One (arm, scenario, round) of the bench: a chain of hint levels under ``--ladder``."""

    arm: Arm
    scenario: Scenario
    number: int  # 0-based

    def key(self, level: int) -> Key:
        """The key of this round's episode at ``level``."""
        return (self.arm.label, self.scenario.id, self.number, level)


class BenchPlan:
    """What a bench must do, from what it asks and what is already done (on a resume).

    Built before anything runs, so everything that can refuse a bench (a
    missing recording under ``--record-mode none``) does so before any work.
    ``episodes`` is what has ended so far, by :data:`Key`; :meth:`record`
    adds to it, and every answer after that takes it into account.
    """

    def __init__(self, scenarios: list[Scenario], arms: list[Arm], opts: RunOptions,
                 done: list[Episode], record_to: Path | None = None,
                 record_mode: RecordMode = RecordMode.ALL) -> None:
        self.episodes: dict[Key, Episode] = {(e.arm, e.scenario, e.round, e.hint_level): e
                                             for e in done}
        self.arms = list(arms)
        # As asked: arm by arm, round by round, scenarios as given.
        self.rounds = [Round(a, s, r) for a in arms for r in range(opts.repeat) for s in scenarios]
        self.arm_opts = {a.label: dataclasses.replace(opts, protocol=a.protocol, hints=a.hints)
                         for a in arms}
        self.record_to, self.record_mode = record_to, record_mode
        self._position = {(rd.arm.label, rd.scenario.id, rd.number): i
                          for i, rd in enumerate(self.rounds)}

    def models(self) -> list[AgentChoice]:
        """The models the arms use, each once, in the arms' order: a model server starts once for
        all its arms."""
        seen: list[AgentChoice] = []
        for a in self.arms:
            if a.choice not in seen:
                seen.append(a.choice)
        return seen

    def recorded(self, rd: Round, level: int) -> Path | None:
        """The cassette in ``record_to`` this step would be replayed from (round 0 at level 0 may be
        ``<id>.jsonl``, as ``verify`` names its oracle cassettes); None: it runs live."""
        if self.record_to is None or self.record_mode is RecordMode.ALL:
            return None
        folder = layout.arm_folder(self.record_to, rd.arm.label)
        names = layout.recorded_names(rd.scenario.id, rd.number, level)
        return next((folder / n for n in names if (folder / n).is_file()), None)

    def _needs(self, key: Key, retry: bool) -> bool:
        return key not in self.episodes or (retry and
                                             self.episodes[key].verdict is Verdict.INFRA_ERROR)

    def next_step(self, rd: Round, retry: bool) -> int | None:
        """The level this round must run next, walking its ladder over what is done; None: done.

        ``retry`` (a ``--retry-infra`` try or a resume) runs an infra-error again.
        """
        opts = self.arm_opts[rd.arm.label]
        for level in levels(rd.scenario, opts):
            key = rd.key(level)
            if self._needs(key, retry):
                return level
            if not climbs(self.episodes[key], opts):
                return None
        return None

    def todo(self, model: AgentChoice | None, retry: bool) -> list[Round]:
        """The rounds (of ``model``'s arms; None: all) with a step still to run."""
        return [rd for rd in self.rounds if (model is None or rd.arm.choice == model)
                and self.next_step(rd, retry) is not None]

    def live(self, model: AgentChoice | None, retry: bool) -> list[Round]:
        """The rounds with a step that may run live (a level from the next one up with no
        recording to replay it from): what needs a model server and a sandbox. Every level the
        ladder may still climb counts, not only the next: a ladder replayed at level 0 whose
        level 2 was never recorded runs level 2 live, and must find its model there. A recorded
        pass of this very spec ends the climb, so a ladder recorded up to where it passed
        starts no model server (nor builds one on a machine that has none)."""
        out = []
        for rd in self.todo(model, retry):
            first = self.next_step(rd, retry) or 0
            for level in levels(rd.scenario, self.arm_opts[rd.arm.label]):
                if level < first:
                    continue
                path = self.recorded(rd, level)
                if path is None:
                    out.append(rd)
                    break
                if _recorded_pass(path, rd.scenario):
                    break
        return out

    def record(self, key: Key, ep: Episode) -> None:
        """An episode ended: the plan's next answers count it."""
        self.episodes[key] = ep

    def ordered(self) -> list[Episode]:
        """Every episode ended, in a stable order: as asked (arm by arm, round by round, scenarios
        as given, levels up); anything else (a resume's episodes no longer asked for) after."""
        end = len(self._position)
        return sorted(self.episodes.values(),
                      key=lambda e: (self._position.get((e.arm, e.scenario, e.round), end),
                                     e.arm or "", e.scenario, e.round, e.hint_level))

    def check(self, resume: bool) -> None:
        """``--record-mode none`` needs a recording for every step still to run: refused here,
        before anything runs, naming the first few missing."""
        if self.record_mode is not RecordMode.NONE:
            return
        missing = [f"{(rd.arm.label + ' ') if rd.arm.label else ''}{rd.scenario.id} "
                   f"(round {rd.number})"
                   for rd in self.rounds
                   if (lv := self.next_step(rd, resume)) is not None
                   and self.recorded(rd, lv) is None]
        if self.record_to is None or missing:
            raise InvalidInput(f"--record-mode none needs a cassette for every run; missing: "
                               f"{', '.join(missing[:5]) or 'no --record-to'}", field="--record-mode")
