"""The per-user cache: where slow-to-build things live, locked while they are built.

``$ROOTBENCH_CACHE`` wins; else ``$XDG_CACHE_HOME/rootbench``; else
``~/.cache/rootbench``. Each kind of artefact has its own subfolder and is
keyed by a hash of its inputs, so a changed recipe never reuses a stale build.
Two rootbench processes never build the same artefact at once: each build
holds an exclusive lock on a file beside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from runner.core.errors import InvalidInput
from runner.core.waiting import wait_until

log = logging.getLogger("rootbench.lock")
LOCK_TIMEOUT = 3 * 3600.0  # seconds to wait for another process's build


def cache_root() -> Path:
    env = os.environ.get("ROOTBENCH_CACHE")
    if env:
        root, where = Path(env), "ROOTBENCH_CACHE"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = Path(xdg) / "rootbench" if xdg else Path.home() / ".cache" / "rootbench"
        where = "XDG_CACHE_HOME" if xdg else "the cache folder"
    if root.exists() and not root.is_dir():
        raise InvalidInput("cannot use it as the cache: not a folder", path=str(root), field=where)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"cannot use it as the cache: {exc.strerror}", path=str(root),
                           field=where) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise InvalidInput("cannot use it as the cache: not writable", path=str(root), field=where)
    return root


def cache_dir(kind: str) -> Path:
    """``cache_root()/kind``, created on first use."""
    path = cache_root() / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def lock_path(artefact: Path) -> Path:
    """The lock file beside a cached artefact: its whole name plus ``.lock``."""
    return artefact.with_name(artefact.name + ".lock")


@contextlib.contextmanager
def file_lock(artefact: Path, what: str, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """An exclusive flock on ``artefact``'s lock file, so two rootbench processes never build it at once."""
    path = lock_path(artefact)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        told = False

        def locked() -> bool:
            nonlocal told
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if not told:
                    log.info("waiting for another rootbench process (%s)", what)
                    told = True
                return False

        # flock has no timeout of its own: try without blocking, twice a second.
        wait_until(locked, timeout, f"the lock on {what}", interval=0.5,
                   message=lambda: f"timed out waiting for the lock on {what}")
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
