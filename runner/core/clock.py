"""The run's clock: seconds since it started, read by every time-based decision.

A live clock can hand each reading to an event sink (the cassette writer),
so a replay can make the very same decisions (budget exhausted, probe
deadline passed) from the recorded readings, without real time.
"""

from __future__ import annotations

import time
from typing import Any, Protocol


class EventSink(Protocol):
    """Where recorded events go (a :class:`~runner.core.cassette.CassetteWriter`)."""

    def write(self, event: dict[str, Any]) -> None: ...


class Clock:
    """Seconds since the run started. All time-based decisions read it.

    A real clock records each reading, so a replay can make the very same
    decisions (budget exhausted, probe deadline passed) without real time.
    """

    def __init__(self, writer: EventSink | None = None) -> None:
        self._start = time.monotonic()
        self._writer = writer

    def now(self) -> float:
        t = round(time.monotonic() - self._start, 6)
        if self._writer is not None:
            self._writer.write({"type": "clock", "t": t})
        return t

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
