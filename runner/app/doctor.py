"""``rootbench doctor``: can this machine run rootbench? What it has, and each problem in a line.

Nothing is started and nothing is built: the tools are looked up on
``PATH`` (and ``/usr/sbin``, where Debian keeps ``mkfs.ext4`` out of a
user's ``PATH``), the accelerator is asked whether it is usable, the
default image and its snapshot are looked up in the cache, llama-server's
set-up is described, and the cache's disk is measured.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from runner.backends.cachedir import cache_root
from runner.backends.images import find_image
from runner.backends.llama import describe_setup
from runner.backends.qemu import choose_accel, kvm_status, qemu_version
from runner.backends.snapshot import snapshot_dir
from runner.core.errors import RootbenchError

DEFAULT_IMAGE = "debian-12-nginx"  # the image `make image` builds, and `image build` by default
TOOLS = ("qemu-img", "mmdebstrap", "mkfs.ext4", "ssh", "ssh-keygen")
MIN_FREE_GB = 3  # below this under the cache, one image build and its snapshot may not fit


@dataclass
class Findings:
    """What the machine has (``lines``) and what stops it running rootbench (``problems``)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def examine() -> Findings:
    """Look the machine over; every finding, in the order doctor prints them."""
    found = Findings()
    qemu = shutil.which("qemu-system-x86_64")
    if qemu:
        found.lines.append(f"qemu: {qemu} ({qemu_version()})")
        usable, why = kvm_status()
        found.lines.append(f"accelerator: {'kvm' if usable else 'tcg'} ({why})")
    else:
        found.problems.append("qemu-system-x86_64 is not installed (run `make setup`)")
    for tool in TOOLS:
        if not (shutil.which(tool) or Path(f"/usr/sbin/{tool}").exists()):
            found.problems.append(f"{tool} is not installed (run `make setup`)")
    try:
        img = find_image(DEFAULT_IMAGE)
        found.lines.append(f"image {DEFAULT_IMAGE}: "
                           f"{img.base if img else 'not built (make image)'}")
        if img and qemu:
            snap = snapshot_dir(img, choose_accel("auto"))
            found.lines.append("snapshot: "
                               f"{'present' if snap.is_dir() else 'not made yet (first run makes it)'}")
    except RootbenchError as exc:
        found.problems.append(str(exc))
    try:
        found.lines.extend(describe_setup())
    except RootbenchError as exc:
        found.problems.append(str(exc))
    root = cache_root()
    free_gb = shutil.disk_usage(root).free / 1e9
    found.lines.append(f"cache: {root} ({free_gb:.1f} GB free)")
    if free_gb < MIN_FREE_GB:
        found.problems.append(f"less than {MIN_FREE_GB} GB free under {root}")
    return found
