"""What the per-user cache holds, and which of it this install still uses.

Every artefact is keyed by its inputs, so a changed recipe, QEMU, snapshot
format or pinned model leaves the old build behind rather than reusing it.
Those leftovers are a few hundred MB each; ``rootbench cache --prune``
removes them. It removes only what the current inputs no longer name, and
never an unfinished build younger than a day (another run may be making it).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from runner.backends.cachedir import cache_root, lock_path
from runner.backends.images import find_image, image_dir, load_recipe
from runner.backends.llama import MODELS, build_dir, model_path
from runner.backends.snapshot import snapshot_dir
from runner.core.paths import recipe_names

KINDS = ("images", "snapshots", "llama-server", "models")  # apt-archives and hostinfo are always kept
UNFINISHED_GRACE_S = 24 * 3600


@dataclass(frozen=True)
class Entry:
    kind: str
    path: Path
    size: int
    in_use: bool  # named by today's inputs, or an unfinished build that may still be going

    @property
    def state(self) -> str:
        if not self.in_use:
            return "stale"
        return "unfinished" if _unfinished(self.path) else "in use"


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            pass
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
            keep.update(snapshot_dir(built, accel) for accel in ("kvm", "tcg"))
    snapshots = cache_root() / "snapshots"
    if not have_qemu and snapshots.is_dir():
        keep.update(snapshots.iterdir())  # which are current is unknown: keep them all
    return keep


def _unfinished(path: Path) -> bool:
    return ".partial" in path.name


def entries() -> list[Entry]:
    """Everything under the cache's artefact folders; lock files are left out (they are empty)."""
    keep = _current()
    root = cache_root()
    out = []
    for kind in KINDS:
        folder = root / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.name.endswith(".lock"):
                continue
            in_use = path in keep
            if _unfinished(path):
                in_use = time.time() - path.stat().st_mtime < UNFINISHED_GRACE_S
            out.append(Entry(kind, path, _size(path), in_use))
    return out


def prune(listed: list[Entry]) -> list[Entry]:
    """Remove every entry of ``listed`` not in use; returns what was removed."""
    removed = []
    for e in listed:
        if e.in_use:
            continue
        if e.path.is_dir() and not e.path.is_symlink():
            shutil.rmtree(e.path)
        else:
            e.path.unlink()
        lock_path(e.path).unlink(missing_ok=True)
        removed.append(e)
    return removed
