"""The restore chain on real QEMU: template, then full state, then cold boot; the snapshot never written.

The faults are real: a copy of the cached snapshot with a file cut short, in
the test's own folder. The cached snapshot is shared by every rootbench run
on the machine and is only ever read, here as everywhere.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from runner.backends.images import BuiltImage
from runner.backends.qemu import machine_digest
from runner.backends.sandbox import RESTORE_ENV, Sandbox
from runner.backends.snapshot import snapshot_dir
from runner.core.errors import InvalidInput


def test_restore_must_be_a_known_way(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidInput, match="unknown restore 'warm'") as err:
        Sandbox(restore="warm")
    assert err.value.field == "restore"
    monkeypatch.setenv(RESTORE_ENV, "full-state")
    assert Sandbox().restore == "full-state"
    assert Sandbox(restore="template").restore == "template"  # the argument wins
    assert Sandbox(snapshot=False).restore == "cold"
    monkeypatch.setenv(RESTORE_ENV, "hot")
    with pytest.raises(InvalidInput) as err:
        Sandbox()
    assert err.value.field == RESTORE_ENV


def test_the_snapshot_key_covers_the_machine(tmp_path: Path) -> None:
    """A state saved from one virtual machine loads into no other: what shapes it is in the key."""
    image = BuiltImage(name="img", dir=tmp_path, base=tmp_path / "base.qcow2", kernel=tmp_path / "k",
                       initrd=tmp_path / "i", ssh_key=tmp_path / "key", sha256="0" * 64,
                       memory_mib=256, cmdline="console=ttyS0", built_at="")
    if shutil.which("qemu-system-x86_64"):  # the key names QEMU's version
        key = snapshot_dir(image, "tcg").name
        assert f"-c{machine_digest(image, 'tcg')}" in key and "-v4-" in key
    assert machine_digest(image, "tcg") != machine_digest(image, "kvm")  # -cpu max / host
    assert machine_digest(image, "tcg") != machine_digest(dataclasses.replace(image, memory_mib=512), "tcg")
    # ... but not where the cache is: a moved cache keeps its snapshots.
    moved = dataclasses.replace(image, kernel=tmp_path / "vmlinuz", initrd=tmp_path / "initrd.img")
    assert machine_digest(moved, "tcg") == machine_digest(image, "tcg")
