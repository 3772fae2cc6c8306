"""Text from the guest or the model, made safe to show: the one place control sequences are stripped.

Guest output and model text are attacker-controlled. Everything that reaches
a terminal, a table, JUnit XML or a report passes through :func:`clean_text`
(or :func:`one_line`) first, so no escape sequence can repaint the user's
terminal or hide a line.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]|"
                      r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def clean_text(text: str) -> str:
    """``text`` without terminal control sequences (keeps newlines and tabs)."""
    return _CONTROL.sub("", text)


def one_line(text: str, limit: int = 200) -> str:
    """``text`` cleaned, on one line, at most ``limit`` characters (cut with an ellipsis)."""
    text = _ANY_CONTROL.sub(" ", clean_text(str(text))).strip()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def printable(text: str) -> str:
    """``text`` cleaned and encodable: lone surrogates (a YAML ``"\\udc80"``) become ``?``."""
    return clean_text(text).encode("utf-8", "replace").decode("utf-8")
