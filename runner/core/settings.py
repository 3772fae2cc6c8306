"""Settings read from the environment (``ROOTBENCH_*``), each checked the one same way.

A mistyped setting is bad input, not a crash and not a silent default: one line naming
the variable, exit 2, before any work starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from runner.core.errors import InvalidInput


def whole_number(name: str, default: int, low: int, high: int,
                 env: Mapping[str, str] | None = None, low_means: str = "") -> int:
    """``$name`` as a whole number from ``low`` to ``high``, or ``default`` when unset or blank.
    ``low_means`` says what the lowest value does (``"off"``), in the message for a bad value."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        lowest = f"{low} ({low_means})" if low_means else str(low)
        raise InvalidInput(f"must be a whole number from {lowest} to {high}, not {raw!r}", field=name)
    return value
