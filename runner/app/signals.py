"""Ctrl-C and SIGTERM as an exception, so every ``with`` block tears its VM or server down."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; ``code`` is the exit status to use (130 or 143).

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that no ``except
    Exception`` on its way up can take it for an error and go on: the QMP
    connect loop did (it retries on any Exception), so a SIGTERM that arrived
    while a VM was starting was swallowed and the bench ran to its end.
    """

    def __init__(self, code: int) -> None:
        super().__init__(f"interrupted (exit {code})")
        self.code = code


@contextlib.contextmanager
def signals_raise(*, once: bool = False) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Interrupted`.

    With ``once``, only the first one does and later ones are ignored: an
    episode worker of ``--jobs N`` gets Ctrl-C from the terminal and then
    SIGTERM from the pool, and the second must not cut its VM's teardown short.
    """
    def handler(signum: int, _frame: FrameType | None) -> None:
        if once:
            for s in (signal.SIGTERM, signal.SIGINT):
                signal.signal(s, signal.SIG_IGN)
        raise Interrupted(143 if signum == signal.SIGTERM else 130)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
