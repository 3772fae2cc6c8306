"""Where a bench's wall time goes, and how fast its model ran, read from recorded episodes.

Issue #30: on a 2-core machine the harness is cheap and a bench's time is the
model's, so the figures that say whether a bench runs near the machine's
limit are (1) episodes per hour, (2) the split of an episode's wall time into
the model (every model call's duration), the guest (every guest exchange's
duration, host-side) and the harness (the rest: restoring, the agent loop,
the judge's waits between retries of a probe with ``within``), and (3) the
model's in-bench prompt and generation speed, which llama-server reports
with every reply (``timings``) and the cassette keeps in the reply's raw
body. All of it is read from cassette events, so committed recordings answer
it without running anything; ``rootbench perf`` prints it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def _seconds(value: object) -> float:
    """A recorded duration as seconds: 0.0 for anything that is not a finite number >= 0."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
            and value >= 0:
        return float(value)
    return 0.0


@dataclass(frozen=True)
class WallSplit:
    """One episode's (or a bench's, summed) wall time, in seconds, in three parts."""

    wall: float
    model: float
    guest: float

    @property
    def harness(self) -> float:
        """What is neither the model nor the guest (never negative: durations overlap the wall
        by rounding only)."""
        return max(0.0, self.wall - self.model - self.guest)

    def shares(self) -> dict[str, float]:
        """Each part as a fraction of the wall time (all 0.0 for an empty wall)."""
        if self.wall <= 0:
            return {"model": 0.0, "guest": 0.0, "harness": 0.0}
        return {"model": round(self.model / self.wall, 3), "guest": round(self.guest / self.wall, 3),
                "harness": round(self.harness / self.wall, 3)}

    def __add__(self, other: WallSplit) -> WallSplit:
        return WallSplit(self.wall + other.wall, self.model + other.model, self.guest + other.guest)


def episode_wall(events: Sequence[Mapping[str, Any]]) -> float:
    """An episode's wall time: the sum of its verdict's phases (restore to probes), or its
    ``seconds`` when it has no phases; 0.0 without a verdict."""
    verdict = next((e for e in reversed(events) if e.get("type") == "verdict"), None)
    if verdict is None:
        return 0.0
    phases = verdict.get("phases")
    if isinstance(phases, Mapping) and phases:
        return sum(_seconds(v) for v in phases.values())
    return _seconds(verdict.get("seconds"))


def split_wall_time(events: Sequence[Mapping[str, Any]]) -> WallSplit:
    """One cassette's events as wall time spent in the model, in the guest and in the harness.

    The model's part is every ``model`` event's ``reply.duration`` (the HTTP
    call, retries included); the guest's is every ``guest`` event's
    ``result.duration`` (measured on the host, so it holds the channel's round
    trip, a few ms). An HTTP probe records no duration: its time is the harness's.
    """
    model = guest = 0.0
    for e in events:
        if e.get("type") == "model" and isinstance(e.get("reply"), Mapping):
            model += _seconds(e["reply"].get("duration"))
        elif e.get("type") == "guest" and isinstance(e.get("result"), Mapping):
            guest += _seconds(e["result"].get("duration"))
    return WallSplit(episode_wall(events), model, guest)


def episodes_per_hour(walls: Iterable[float], jobs: int = 1) -> float | None:
    """Episodes per hour of episodes run ``jobs`` at once, each as long as recorded (None if
    there are none or they took no time)."""
    walls = list(walls)
    total = sum(walls)
    if not walls or total <= 0:
        return None
    return round(len(walls) * 3600 * jobs / total, 1)


@dataclass(frozen=True)
class TokenRates:
    """Tokens per second: prompt processing and generation, and how many replies said so."""

    prompt_tps: float | None
    gen_tps: float | None
    replies: int


def timing_rates(timings: Iterable[Mapping[str, Any]]) -> TokenRates:
    """Prompt and generation tokens/s over llama-server ``timings`` (``prompt_n``,
    ``prompt_ms``, ``predicted_n``, ``predicted_ms``): tokens over milliseconds, summed, so a
    long reply counts for more than a short one, as it does in an episode's time."""
    prompt_n = prompt_ms = gen_n = gen_ms = 0.0
    replies = 0
    for t in timings:
        replies += 1
        prompt_n += _seconds(t.get("prompt_n"))
        prompt_ms += _seconds(t.get("prompt_ms"))
        gen_n += _seconds(t.get("predicted_n"))
        gen_ms += _seconds(t.get("predicted_ms"))
    return TokenRates(round(prompt_n * 1000 / prompt_ms, 1) if prompt_ms else None,
                      round(gen_n * 1000 / gen_ms, 1) if gen_ms else None, replies)


def recorded_rates(events: Iterable[Mapping[str, Any]]) -> TokenRates:
    """:func:`timing_rates` over every recorded model reply that carries llama-server's
    ``timings`` (in the reply's raw body)."""
    def timings() -> Iterable[Mapping[str, Any]]:
        for e in events:
            if e.get("type") != "model":
                continue
            raw = (e.get("reply") or {}).get("raw")
            found = raw.get("timings") if isinstance(raw, Mapping) else None
            if isinstance(found, Mapping):
                yield found

    return timing_rates(timings())


def ratio(part: float | None, whole: float | None, digits: int = 2) -> float | None:
    """``part / whole`` rounded, or None when either is missing or ``whole`` is not positive."""
    if part is None or whole is None or not whole > 0:
        return None
    return round(part / whole, digits)


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the values that are there (None if none is)."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None
