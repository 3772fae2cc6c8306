"""The bench's "3/29" progress line's estimate of the time left.

A bench of 29 scenarios on TCG takes most of an hour; "3/29" alone does not
say whether to wait or come back later. The estimate is the mean wall time
of the episodes finished so far (from submission to result, so a VM's
restore counts) times the episodes still to finish, shared among the slots
that run at once. Replayed episodes (``--record-mode once``) take no time
and are left out of the mean. Before the first episode ends there is
nothing to go on, and the line says so instead of guessing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable


def duration(seconds: float) -> str:
    """A rough human duration: ``40 s``, ``12 min``, ``1 h 05 min``."""
    if not math.isfinite(seconds) or seconds < 0:
        seconds = 0.0
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class Eta:
    """Times the episodes a bench runs and estimates what is left of it."""

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        self._started: dict[Hashable, float] = {}
        self._took: list[float] = []

    def started(self, key: Hashable) -> None:
        """An episode was submitted (its clock starts now)."""
        self._started[key] = time.monotonic()

    def finished(self, key: Hashable) -> None:
        """An episode's result arrived (a key never started, a replay, is not counted)."""
        t0 = self._started.pop(key, None)
        if t0 is not None:
            self._took.append(time.monotonic() - t0)

    def left(self, remaining: int) -> str:
        """What the progress line says for ``remaining`` episodes still to finish."""
        return left_text(self._took, remaining, self.slots)


def left_text(took: list[float], remaining: int, slots: int) -> str:
    """``about 12 min left`` from the mean of ``took``; ``time left: estimating...`` before any."""
    if not took:
        return "time left: estimating..."
    mean = sum(took) / len(took)
    return f"about {duration(mean * max(0, remaining) / max(1, slots))} left"
