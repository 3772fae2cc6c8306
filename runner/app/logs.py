"""Progress through the standard ``logging`` module: a logger per layer, one handler in the CLI.

Library code logs to ``rootbench.<part>`` loggers (``rootbench.vm``,
``rootbench.image``, ``rootbench.bench``, ...) and never prints. The CLI
installs :class:`ProgressHandler`, which writes each record to stderr as
``[part] message``, cleaned of control sequences. ``-q`` shows warnings
only, ``-v`` adds debug detail.
"""

from __future__ import annotations

import logging
import sys

from runner.core.text import printable

ROOT = "rootbench"


class ProgressHandler(logging.Handler):
    """``[part] message`` lines on stderr, flushed at once, never a control sequence."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            part = record.name.rsplit(".", 1)[-1] if record.name != ROOT else ROOT
            message = printable(record.getMessage())
            print(f"[{part}] {message}", file=sys.stderr, flush=True)
        except BrokenPipeError:
            raise
        except Exception:  # noqa: BLE001 - a log line must never break a run
            self.handleError(record)


def setup(verbosity: int = 0) -> None:
    """Route rootbench's loggers to stderr: ``-1`` quiet (warnings), ``0`` progress, ``1`` debug."""
    logger = logging.getLogger(ROOT)
    for handler in list(logger.handlers):
        if isinstance(handler, ProgressHandler):
            logger.removeHandler(handler)
    logger.addHandler(ProgressHandler())
    logger.setLevel(logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO)
    logger.propagate = False
