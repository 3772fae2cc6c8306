"""Fields of a file someone handed over, read as what the report needs or as nothing.

A cassette or a results.json is hostile input: any field may be missing or
of any type, and every text in it may hold terminal control sequences or
bidi overrides. Every part of the report reads fields through these, so a
crafted file shows as blanks and zeros, never as a traceback or as markup.
"""

from __future__ import annotations

import math
from typing import Any

from runner.core.text import printable


def text(value: Any) -> str:
    """Any value as text fit for the page: control sequences stripped, encodable."""
    if value is None:
        return ""
    return printable(value if isinstance(value, str) else str(value))


def num(value: Any) -> float | None:
    """A finite number (never a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def integer(value: Any) -> int:
    """A finite number as an int, else 0."""
    n = num(value)
    return int(n) if n is not None else 0


def as_dict(value: Any) -> dict[str, Any]:
    """The value if it is an object, else an empty one."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """The value if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def plural(n: int, word: str) -> str:
    """``1 turn``, ``2 turns``: a count and its noun."""
    return f"{n} {word}{'' if n == 1 else 's'}"
