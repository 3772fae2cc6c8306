"""What the per-user cache holds, and which of it this install still uses.

Every artefact is keyed by its inputs, so a changed recipe, QEMU, snapshot
format or pinned model leaves the old build behind rather than reusing it.
Those leftovers are a few hundred MB each; ``rootbench cache --prune``
removes them. It removes only what the current inputs no longer name, and
never what may be in use: an unfinished build younger than a day or whose
artefact's lock another process holds (another run may be making it), nor
anything with a mount point inside (an image build mounts /proc, /sys and
/dev in the root it builds: those mounts belong to someone, and deleting
through them would delete outside the cache).

The cache is walked without following symlinks and without entering another
filesystem: a build's mounted /proc is neither counted nor walked, and an
entry that vanishes while it is looked at (a build that finished and renamed
its ``.partial``, a process in a /proc) is passed over, not a crash.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from runner.app.report import render_rows
from runner.backends.cachedir import cache_root, lock_path
from runner.backends.images import find_image, image_dir, load_recipe
from runner.backends.llama import MODELS, build_dir, model_path
from runner.backends.snapshot import snapshot_dir
from runner.core.paths import recipe_names

KINDS = ("images", "snapshots", "llama-server", "models")  # apt-archives and hostinfo are always kept
UNFINISHED_GRACE_S = 24 * 3600
PARTIAL = ".partial"  # an image, snapshot, llama-server or model being made: <final name>.partial
BUILDING = ".build-"  # the temporary folder llama-server compiles in, beside its build


@dataclass(frozen=True)
class Entry:
    kind: str
    path: Path
    size: int
    in_use: bool  # named by today's inputs, or possibly being built or used right now

    @property
    def state(self) -> str:
        if not self.in_use:
            return "stale"
        return "unfinished" if _unfinished(self.path) else "in use"


def _mount_points() -> set[str]:
    """Every mount point this process sees (``/proc/self/mountinfo``, octal escapes undone)."""
    points = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:  # a space in a path is \040 there, and so on
                points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def _has_mount(path: Path, mounts: set[str]) -> bool:
    """Whether ``path`` is a mount point or holds one (bind mounts of the same filesystem
    included, which a change of device number would miss)."""
    real = os.path.realpath(path)
    return any(m == real or m.startswith(real.rstrip("/") + "/") for m in mounts)


def _size(path: Path, mounts: set[str]) -> int:
    """Bytes in ``path``'s regular files: no symlink followed, no other filesystem or mount
    point entered, anything that vanishes or cannot be read passed over."""
    try:
        top = path.lstat()
    except OSError:
        return 0
    if not stat.S_ISDIR(top.st_mode):
        return top.st_size if stat.S_ISREG(top.st_mode) else 0
    total = 0
    folders = [os.path.realpath(path)]
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        total += st.st_size
                    elif (stat.S_ISDIR(st.st_mode) and st.st_dev == top.st_dev
                          and entry.path not in mounts):
                        folders.append(entry.path)
        except OSError:
            continue
    return total


def _current() -> set[Path]:
    """The cache paths today's inputs name (built or not)."""
    keep = {model_path(name) for name in MODELS}
    for llama in (build_dir(), build_dir(native=True)):  # the native one: for this CPU's flags
        keep.update((llama, llama.with_name(llama.name + ".build.log")))
    have_qemu = shutil.which("qemu-system-x86_64") is not None  # snapshot keys name its version
    for name in recipe_names():
        keep.add(image_dir(load_recipe(name)))
        built = find_image(name)
        if built is not None and have_qemu:
            # Both variants: a machine of a multi-machine scenario restores the one with a LAN NIC.
            keep.update(snapshot_dir(built, accel, lan) for accel in ("kvm", "tcg")
                        for lan in (False, True))
    snapshots = cache_root() / "snapshots"
    if not have_qemu and snapshots.is_dir():
        keep.update(snapshots.iterdir())  # which are current is unknown: keep them all
    return keep


def _unfinished(path: Path) -> bool:
    return PARTIAL in path.name or path.name.startswith(BUILDING)


def _locked(lock: Path) -> bool:
    """Whether another process holds ``lock`` (a build under way); a missing lock is free.
    Opened read-only, so looking creates nothing."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases the lock if it was taken
    return False


def _building(path: Path) -> bool:
    """Whether a build may be making ``path`` right now: an unfinished entry younger than a
    day, or one whose folder holds a lock another process has (its artefact's build)."""
    try:
        if time.time() - path.lstat().st_mtime < UNFINISHED_GRACE_S:
            return True
    except OSError:
        return False
    return any(_locked(lock) for lock in path.parent.glob("*.lock"))


def entries() -> list[Entry]:
    """Everything under the cache's artefact folders; lock files are left out (they are empty).
    An entry gone by the time it is looked at is left out too."""
    keep = _current()
    mounts = _mount_points()
    root = cache_root()
    out = []
    for kind in KINDS:
        folder = root / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.name.endswith(".lock") or not os.path.lexists(path):
                continue
            in_use = (path in keep or _has_mount(path, mounts)
                      or _locked(lock_path(path))
                      or (_unfinished(path) and _building(path)))
            out.append(Entry(kind, path, _size(path, mounts), in_use))
    return out


def prune(listed: list[Entry]) -> list[Entry]:
    """Remove every entry of ``listed`` not in use; returns what was removed.

    Looked at again just before: one that came into use since it was listed (a build took
    its lock, mounted something in it) is kept, and one already gone is not removed again.
    """
    removed = []
    mounts = _mount_points()
    for e in listed:
        if e.in_use or not os.path.lexists(e.path):
            continue
        if _has_mount(e.path, mounts) or _locked(lock_path(e.path)):
            continue
        try:
            if e.path.is_dir() and not e.path.is_symlink():
                shutil.rmtree(e.path)
            else:
                e.path.unlink()
        except FileNotFoundError:  # removed meanwhile by another prune
            continue
        lock_path(e.path).unlink(missing_ok=True)
        removed.append(e)
    return removed


def listing(remove: bool, fmt: str) -> list[str]:
    """``rootbench cache``: each entry (kind, name, size, state; ``--prune``'s removals last,
    ``removed``), each item one print; in a table's format also where the cache is and what
    pruning freed, or would free. JSON holds a size as a number, a table with one decimal."""
    listed = entries()
    removed = prune(listed) if remove else []
    kept = [e for e in listed if e not in removed]
    size = (lambda e: round(e.size / 1e6, 1)) if fmt == "json" else (
        lambda e: f"{e.size / 1e6:.1f}")
    rows = [[e.kind, e.path.name, size(e), e.state] for e in kept]
    rows += [[e.kind, e.path.name, size(e), "removed"] for e in removed]
    out = [render_rows(["kind", "entry", "MB", "state"], rows, fmt)]
    if fmt != "json":
        stale = sum(e.size for e in kept if not e.in_use)
        out.append(f"\ncache: {cache_root()}")
        if removed:
            out.append(f"removed {len(removed)} stale entr{'y' if len(removed) == 1 else 'ies'}, "
                       f"{sum(e.size for e in removed) / 1e6:.0f} MB freed")
        elif stale:
            out.append(f"{stale / 1e6:.0f} MB stale: `rootbench cache --prune` removes it")
    return out
