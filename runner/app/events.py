"""What a bench tells whoever listens, as it happens: an episode started, an episode ended, the end.

Running episodes and reading results are two wings of the application. The
bench (:mod:`runner.app.bench`) only runs; the results files, the progress
lines, the copies into ``--record-to`` and the HTML report are listeners it
is handed, each told the same events in the driver, in order. So the bench
never imports a reader (``import-linter`` forbids it), and a new way of
watching a bench (a live dashboard, a notifier) is one more listener.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.core.episode import Episode


@dataclass(frozen=True)
class Step:
    """One episode of a bench: which (arm, scenario, round, hint level), and where the bench is."""

    arm: str | None
    scenario: str
    round: int  # 0-based
    level: int  # the hint level
    tag: str  # how progress lines name it: "arm: scenario (round 1) (hint level 1)", rounds 0-based
    index: int  # 1-based position of its round among the rounds this pass runs
    total: int  # rounds this pass runs
    remaining: int  # episodes still to finish, this one included (for the estimate of the time left)
    replayed: bool  # replayed from its recording (``--record-mode once``), not run live

    @property
    def key(self) -> tuple[str | None, str, int, int]:
        """(arm, scenario, round, hint level): what names one episode and its cassette."""
        return (self.arm, self.scenario, self.round, self.level)


class BenchListener:
    """Told a bench's events in the driver, in order; each does nothing unless overridden."""

    def episode_started(self, step: Step) -> None:
        """``step`` is about to be replayed or submitted."""

    def episode_finished(self, step: Step, episode: Episode) -> None:
        """``step`` ended as ``episode``; the bench's plan already counts it."""

    def bench_ended(self, episodes: list[Episode], *, interrupted: bool) -> None:
        """The bench is over (``interrupted``: by an exception, Ctrl-C above all, which is raised
        on after every listener was told); ``episodes`` is every one ended, in the stable order."""
