"""Where slow-to-build things are cached, per user.

``$ROOTBENCH_CACHE`` wins; else ``$XDG_CACHE_HOME/rootbench``; else
``~/.cache/rootbench``. Each kind of artefact has its own subfolder and is
keyed by a hash of its inputs, so a changed recipe never reuses a stale build.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    env = os.environ.get("ROOTBENCH_CACHE")
    if env:
        root = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = Path(xdg) / "rootbench" if xdg else Path.home() / ".cache" / "rootbench"
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_dir(kind: str) -> Path:
    """``cache_root()/kind``, created on first use."""
    path = cache_root() / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def repo_root() -> Path:
    """The checkout (specs/, images/, schema/ live here)."""
    return Path(__file__).resolve().parent.parent
