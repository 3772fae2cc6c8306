"""Where the checkout's data lives: ``specs/``, ``images/``, ``schema/``, ``recordings/``."""

from __future__ import annotations

from pathlib import Path


def repo_root() -> Path:
    """The checkout (the folder that holds ``runner/``)."""
    return Path(__file__).resolve().parent.parent.parent
