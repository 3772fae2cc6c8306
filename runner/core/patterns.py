"""Regular expressions written by scenario authors, matched against what agents and guests print.

Both sides are untrusted: a pattern like ``(a+)+$`` makes Python's
backtracking ``re`` take exponential time on a 33-character agent command,
freezing the harness past every budget. These patterns are therefore
compiled with RE2 (``google-re2``), whose matching time is linear in the
text, and bounded in size. A pattern RE2 refuses (backreferences,
lookaround, a repetition over 1000) is refused when the spec is validated.
"""

from __future__ import annotations

import functools

import re2

MAX_PATTERN_CHARS = 1000
_MAX_MEM = 8 << 20  # bytes RE2 may use for one compiled pattern


class PatternError(ValueError):
    """The pattern cannot be used; ``str()`` says why in one line."""


@functools.lru_cache(maxsize=512)
def compile_pattern(pattern: str, *, multiline: bool = False) -> re2._Regexp:
    """``pattern`` compiled with RE2 (``multiline``: ``^``/``$`` match at line ends).

    Raises :class:`PatternError` for a pattern that is too long or that RE2
    cannot compile.
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"longer than {MAX_PATTERN_CHARS} characters")
    options = re2.Options()
    options.log_errors = False  # RE2 would print its own copy of the error to stderr
    options.max_mem = _MAX_MEM
    try:
        return re2.compile(("(?m)" if multiline else "") + pattern, options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else "invalid"
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise PatternError(f"not a pattern RE2 accepts: {why}") from None
    except (TypeError, ValueError, UnicodeError) as exc:
        raise PatternError(f"not a valid pattern: {exc}") from None


def search(pattern: str, text: str, *, multiline: bool = False) -> bool:
    """Whether ``pattern`` matches anywhere in ``text`` (linear time)."""
    return compile_pattern(pattern, multiline=multiline).search(text) is not None
