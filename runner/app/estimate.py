"""The line a bench says before it starts: "19 episodes, about 49 min on a 2-core machine".

A user who types ``make bench`` should know at once whether to wait or come back tomorrow,
before the first episode ends (the progress line's own estimate, :mod:`runner.app.progress`,
needs finished episodes). The figure is the sum of the committed recordings' times for the
episodes that will run live (:mod:`runner.core.measured`): the oracle's for ``--agent oracle``,
the noop agent's for ``noop``, a bundled model's own first tries (or whole hint ladders under
``--ladder``), and for any other agent the default model's, said as a stand-in. Those were
recorded on a 2-core machine with TCG, so that is the machine the line names; rootbench keeps
no measure of this machine's own speed to scale them by. Episodes replayed from a recording
take no time and are not counted. With several episodes at once the sum is shared among the
slots, as the progress line does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runner.app.agents import AgentChoice
from runner.app.plan import Round
from runner.app.progress import duration
from runner.backends.llama import DEFAULT_MODEL
from runner.core.measured import NOOP, ORACLE, UNKNOWN, Measured
from runner.core.outcomes import AgentKind

MACHINE = "on a 2-core machine"  # where the committed recordings were made


def whose(choice: AgentChoice) -> tuple[str, str]:
    """Whose recorded times stand for ``choice``'s episodes, and how the line says so."""
    if choice.kind is AgentKind.ORACLE:
        return ORACLE, "the oracle"
    if choice.kind is AgentKind.NOOP:
        return NOOP, "the noop agent"
    if choice.kind is AgentKind.MODEL and not choice.endpoint and not choice.model_file:
        return choice.model, choice.model
    return DEFAULT_MODEL, f"{DEFAULT_MODEL}, standing in for {choice.label()}"


@dataclass(frozen=True)
class Estimate:
    """What the line says: episodes (rounds, under a ladder) to run live, their seconds, how
    many had no recorded time (counted at the mean of those that had), and whose times."""

    episodes: int
    seconds: float
    untimed: int
    whose: tuple[str, ...]
    ladder: bool
    slots: int = 1

    def text(self) -> str:
        """The line; "nothing runs live" when every episode is replayed from a recording."""
        if not self.episodes:
            return "nothing to run live (every episode is replayed from its recording)"
        what = (f"{self.episodes} hint ladder{'s' if self.episodes != 1 else ''}" if self.ladder
                else f"{self.episodes} episode{'s' if self.episodes != 1 else ''}")
        if self.untimed == self.episodes:
            return f"{what}; none has a recorded time (the progress lines estimate as they go)"
        notes = [f"the recorded times of {' and '.join(self.whose)}"]
        if self.untimed:
            notes.append(f"{self.untimed} without one, counted at the mean")
        if self.slots > 1:
            notes.append(f"{self.slots} at once")
        return f"{what}, about {duration(self.seconds / self.slots)} {MACHINE} ({'; '.join(notes)})"


def estimate(rounds: Sequence[Round], ladder: bool, facts: Mapping[str, Measured],
             slots: int = 1) -> Estimate:
    """The estimate for ``rounds`` (those that run live), from ``facts``."""
    known: list[float] = []
    untimed = 0
    names: dict[str, None] = {}
    for rd in rounds:
        key, said = whose(rd.arm.choice)
        names.setdefault(said, None)
        m = facts.get(rd.scenario.id, UNKNOWN)
        secs = (m.ladder_seconds.get(key) if ladder else None) or m.seconds.get(key)
        if secs is None:
            untimed += 1
        else:
            known.append(secs)
    mean = sum(known) / len(known) if known else 0.0
    return Estimate(len(rounds), sum(known) + untimed * mean, untimed, tuple(names), ladder,
                    max(1, slots))
