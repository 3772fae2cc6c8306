"""How a sandbox comes up, on real VMs: the full-state restore, the fallbacks from a damaged
template to a cold boot, and a golden snapshot that is never written.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import snapshot_hashes

from runner.backends import sandbox as sandbox_module
from runner.backends.images import BuiltImage
from runner.backends.sandbox import Sandbox
from runner.backends.snapshot import FILES, ensure_snapshot

# A guest's fill of its own memory and disk: 100 MiB of anonymous memory written by
# python3 (freed when it exits), 60 MiB in tmpfs, 20 MiB to disk, synced.
DIRTY = ("python3 -c \"b = bytearray(b'x') * (100 << 20); print(len(b))\" && "
         "head -c 60M /dev/zero > /dev/shm/fill && "
         "dd if=/dev/urandom of=/var/tmp/junk bs=1M count=20 2>/dev/null && sync && echo dirtied")


@pytest.fixture(scope="module")
def snapshot(image: BuiltImage) -> Path:
    """The cached golden snapshot (TCG), made by one cold boot if missing."""
    return ensure_snapshot(image, "tcg")


@pytest.fixture
def damaged_copy(snapshot: Path, tmp_path: Path) -> Iterator[Callable[[tuple[str, ...]], Path]]:
    """Makes a copy of the cached snapshot whose given files are cut short (their first half, at
    most 1 MiB: a migration stream that ends mid-section); removed after the test.

    The undamaged big files are hard links where the file system allows: the
    same read-only bytes every sandbox maps anyway, never written through. A
    damaged file is a new file, so the cache is not touched. The copy goes
    when the test ends, so no link outlives it in pytest's kept folders.
    """
    to = tmp_path / "snap"

    def make(damaged: tuple[str, ...]) -> Path:
        to.mkdir()
        for name in FILES:
            src, dst = snapshot / name, to / name
            if name in damaged:
                with src.open("rb") as fh:
                    dst.write_bytes(fh.read(min(src.stat().st_size // 2, 1 << 20)))
                continue
            try:
                os.link(src, dst)
            except OSError:  # the test's folder is on another file system
                shutil.copyfile(src, dst)
        return to

    yield make
    shutil.rmtree(to, ignore_errors=True)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "rootbench.vm" and r.levelno == logging.WARNING]


@pytest.mark.vm
def test_full_state_restore_gives_a_ready_guest(snapshot: Path, no_new_qemu: None) -> None:
    with Sandbox(accel="tcg", restore="full-state") as box:
        assert (box.info.restore, box.info.restored, box.info.fallback) == ("full-state", True, None)
        # anonymous RAM: no file behind the guest's memory
        assert "memory-backend-ram,id=mem0" in " ".join(box.qemu_argv)
        r = box.guest.exec("id -u; systemctl is-active nginx", 20)
        assert r.exit_code == 0 and r.output.split() == ["0", "active"]
        r = box.guest.exec("date +%s", 10)
        assert abs(int(r.output.strip()) - time.time()) < 30  # the clock was set on restore
        assert box.guest.host_http(80, "/", 10).status == 200


@pytest.mark.vm
def test_a_damaged_template_falls_back_to_the_full_state(
        damaged_copy: Callable[[tuple[str, ...]], Path], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch, no_new_qemu: None) -> None:
    copy = damaged_copy(("device.state",))
    monkeypatch.setattr(sandbox_module, "_told", set())  # this process has said nothing yet
    caplog.set_level(logging.DEBUG, logger="rootbench.vm")
    fallbacks = []
    for _ in range(2):
        with Sandbox(accel="tcg", snapshot_dir=copy) as box:
            assert box.info.restore == "full-state" and box.info.restored is True
            fallback = box.info.fallback or ""
            assert fallback.startswith("template restore failed (loading device.state did not complete")
            assert "\n" not in fallback
            assert box.guest.exec("echo answered", 20).output.strip() == "answered"
            fallbacks.append(fallback)
    # Said once, in one line, though two VMs hit it.
    [told] = _warnings(caplog)
    assert told == f"{fallbacks[0]}; trying the full-state restore"


@pytest.mark.vm
def test_cold_boot_when_both_restores_fail(damaged_copy: Callable[[tuple[str, ...]], Path],
                                           caplog: pytest.LogCaptureFixture,
                                           no_new_qemu: None) -> None:
    copy = damaged_copy(("device.state", "full.state"))
    caplog.set_level(logging.DEBUG, logger="rootbench.vm")
    with Sandbox(accel="tcg", snapshot_dir=copy) as box:
        assert box.info.restore == "cold" and box.info.restored is False
        fallback = box.info.fallback or ""
        assert "template restore failed (loading device.state" in fallback
        assert "; full-state restore failed (loading full.state" in fallback
        assert "\n" not in fallback
        assert box.guest.exec("systemctl is-active nginx", 20).output.strip() == "active"
    said = [r.getMessage() for r in caplog.records if "full-state restore failed" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("; cold booting instead"), said


@pytest.mark.vm
def test_the_snapshot_is_never_written(snapshot: Path, no_new_qemu: None) -> None:
    """A small soak: guests that fill their memory and disk, one SIGKILLed mid-fill, both restores."""
    before = snapshot_hashes(snapshot)
    assert all(mode == 0o444 for _, mode in before.values()), before
    for way in ("template", "full-state", "template"):
        with Sandbox(accel="tcg", restore=way) as box:
            assert box.info.restore == way
            r = box.guest.exec(DIRTY, 120)
            assert r.exit_code == 0 and r.output.split() == [str(100 << 20), "dirtied"], r.output
    with Sandbox(accel="tcg") as box:
        box.guest.exec("nohup sh -c 'while :; do head -c 60M /dev/urandom > /dev/shm/fill; done' "
                       ">/dev/null 2>&1 &", 20)
        time.sleep(3)
        box.kill()  # SIGKILL, mid-fill
        assert box.killed_externally()
    # What the guests wrote was theirs: the next one starts clean.
    with Sandbox(accel="tcg") as box:
        r = box.guest.exec("ls /var/tmp/junk /dev/shm/fill 2>/dev/null | wc -l", 20)
        assert r.output.strip() == "0"
    assert snapshot_hashes(snapshot) == before
