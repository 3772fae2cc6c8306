"""One way to wait for something: poll a predicate against a monotonic deadline.

Every "keep trying until it works or time runs out" in rootbench goes
through :func:`wait_until`, so each such wait has a bound, says what it was
waiting for when it gives up, and never sleeps past its deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from runner.core.errors import InfraError

T = TypeVar("T")


def wait_until(predicate: Callable[[], T | None], timeout: float, what: str, *,
               interval: float = 0.05, max_interval: float | None = None,
               error: type[Exception] = InfraError,
               message: Callable[[], str] | None = None) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Gives up after ``timeout`` seconds with ``error("<what> did not happen
    within Ns")``. The pause between tries starts at ``interval`` and, with
    ``max_interval``, doubles up to it. The predicate may raise to stop the
    wait early (a process that died will never become ready). A predicate
    that itself blocks (reads a socket, runs a command) should bound each try
    by the time left; it may pass ``interval=0``, as its own wait is the pause.
    ``message``, if given, builds the give-up text at that moment, so it can
    say what was last seen (a systemd state, a log's last line).
    """
    deadline = time.monotonic() + timeout
    pause = interval
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise error(message() if message else f"{what} did not happen within {timeout:.0f}s")
        time.sleep(min(pause, left))
        if max_interval is not None:
            pause = min(pause * 2, max_interval)
