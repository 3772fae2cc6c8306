"""Shared fixtures. VM tests boot real QEMU from the real image (built on first use)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the image fixture imports the backend when a test first asks for it
    from runner.backends.images import BuiltImage


def qemu_pids() -> set[int]:
    """PIDs of every qemu-system process on the machine."""
    out = subprocess.run(["pgrep", "-f", "qemu-system-x86_64"], capture_output=True, text=True,
                         timeout=10)
    return {int(p) for p in out.stdout.split()} - {os.getpid()}


def qemu_children(parent: int | None = None) -> set[int]:
    """QEMU processes started by ``parent`` (default: this very process); other runs are left alone."""
    out = subprocess.run(["pgrep", "-P", str(parent or os.getpid()), "-f", "qemu-system-x86_64"],
                         capture_output=True, text=True, timeout=10)
    return {int(p) for p in out.stdout.split()}


def snapshot_hashes(snapshot: Path) -> dict[str, tuple[str, int]]:
    """sha256 and permission bits of each file of a golden snapshot: what "never written" compares."""
    from runner.backends.cachedir import file_sha256
    from runner.backends.snapshot import FILES

    return {f: (file_sha256(snapshot / f), (snapshot / f).stat().st_mode & 0o777) for f in FILES}


@pytest.fixture
def no_new_qemu() -> Iterator[None]:
    """Fail the test if it leaves a QEMU process behind (counting only QEMUs this process
    started, so another rootbench run on the same machine cannot make it fail)."""
    before = qemu_children()
    yield
    leaked = qemu_children() - before
    assert not leaked, f"QEMU processes left behind: {sorted(leaked)}"


@pytest.fixture(scope="session")
def image() -> BuiltImage:
    """The default image, built if the cache lacks it (the first run takes a few minutes)."""
    from runner.backends.images import ensure_image

    return ensure_image("debian-12-nginx")
