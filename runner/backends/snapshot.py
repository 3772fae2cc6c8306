"""Golden snapshots: one cold boot per image, saved as a VM template every sandbox restores from.

Fast reset is VM templating: the golden boot runs with its RAM in a shared
file (``template.ram``), its device state is migrated to a small file
(``device.state``; ``x-ignore-shared`` keeps RAM out of it), and its disk
overlay is frozen (``frozen.qcow2``). Each sandbox maps the RAM file
copy-on-write, makes a new overlay on the frozen disk and resumes from the
device state, so a shell answers in a fraction of a second instead of a 25 s
TCG boot.

The snapshot also keeps the whole VM in one ordinary migration stream, RAM
included (``full.state``, ~200 MB): the second way in when a template
restore fails, loaded into anonymous RAM (about a second), before a cold boot.
QEMU refuses a second ``migrate`` from a source a first one has completed, so
it is saved by a second QEMU: the template restored, kept paused (``-S``),
migrated on. That also proves the template restores before it is published.

An image's extra disks (``disks:`` in its recipe) are frozen with the root
disk: the golden boot writes an overlay of each (``frozen-<name>.qcow2``), and
every restore attaches a new overlay on each, in the same order, since the
saved device state holds those drives.

Nothing writes a snapshot after it is made: its files are read-only, and the
directory's name keys everything a saved state depends on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.backends.cachedir import cache_dir, file_lock
from runner.backends.framing import helper_digest
from runner.backends.images import BuiltImage, ExtraDisk
from runner.backends.lan import LanPort
from runner.backends.process import socket_dir
from runner.backends.qemu import KvmUnusable, Qemu, machine_digest, make_overlay, qemu_version
from runner.backends.serial import SerialGuest
from runner.core.errors import GuestDown, VMError
from runner.core.guest import Guest
from runner.core.machines import SNAPSHOT_LAN_MAC
from runner.core.waiting import wait_until

log = logging.getLogger("rootbench.vm")
BOOT_TIMEOUT = 240.0  # seconds from launch to a root shell, TCG on a busy 2-core host
READY_TIMEOUT = 180.0  # seconds for systemd to finish starting units in the golden boot
# 3: taken only once systemd has no jobs left (2 could catch a unit still starting).
# 4: adds full.state (the whole VM, for the fallback restore); the key hashes QEMU's command line.
SNAPSHOT_VERSION = 4
FILES = ("frozen.qcow2", "template.ram", "device.state", "full.state")  # all read-only once saved


def frozen_disk(disk: ExtraDisk) -> str:
    """The file name of an extra disk's frozen overlay in a snapshot."""
    return f"frozen-{disk.name}.qcow2"


def snapshot_files(image: BuiltImage) -> tuple[str, ...]:
    """Every file of ``image``'s snapshot: :data:`FILES` and a frozen overlay per extra disk."""
    return (*FILES, *(frozen_disk(d) for d in image.disks))


def disks_digest(image: BuiltImage) -> str:
    """A short hash of the extra disks' names and contents, in order ("" for none)."""
    if not image.disks:
        return ""
    text = "\n".join(f"{d.name} {d.sha256}" for d in image.disks)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


# Seconds a cold boot under KVM may take to give a root shell before KVM is judged unusable
# here. KVM boots this image in about 6 s; a host whose nested, paravirtual KVM cannot run a
# stock kernel either stops the guest with an internal error (caught below) or, as measured on
# 2026-12-07, leaves it running with no console output at all, which only a limit can tell.
# Ten times the boot, and a tenth of the TCG boot's 240 s, so a fresh cache on such a host
# loses a minute once (the verdict is remembered) instead of four per VM.
KVM_BOOT_TIMEOUT = 60.0


def wait_for_shell(q: Qemu, timeout: float) -> SerialGuest:
    """Cold boot: wait for the autologin prompt, watching for KVM's internal error; under KVM a
    boot with no shell by :data:`KVM_BOOT_TIMEOUT` is :class:`KvmUnusable` (TCG is tried)."""
    guest = SerialGuest(str(q.console_path), q.forwards)
    kvm = q.accel == "kvm"
    if kvm:
        timeout = min(timeout, KVM_BOOT_TIMEOUT)
    deadline = time.monotonic() + timeout

    def logged_in() -> bool:
        try:
            guest.wait_for_login(max(0.1, min(deadline - time.monotonic(), 3.0)))
            return True
        except GuestDown:
            status = q.status()
            if status == "internal-error":
                raise KvmUnusable("the guest stopped with KVM internal error") from None
            if status == "exited":
                raise VMError(f"QEMU exited during boot: {q.log_tail()}") from None
            return False

    try:
        # wait_for_login is itself the pause (up to 3 s); a console at EOF answers at once.
        wait_until(logged_in, timeout, "a root shell on the serial console", interval=0.05,
                   error=VMError,
                   message=lambda: f"no root shell on the serial console within {timeout:.0f}s")
    except VMError as exc:
        guest.close()
        if kvm and not isinstance(exc, KvmUnusable) and q.status() != "exited":
            raise KvmUnusable(f"no root shell under KVM within {timeout:.0f} s (a nested KVM "
                              "that cannot run this kernel?)") from None
        raise
    except BaseException:
        guest.close()
        raise
    return guest


def wait_until_settled(guest: Guest, timeout: float) -> str:
    """Wait until systemd has finished booting: state running (or degraded) and no jobs queued.

    ``systemctl is-system-running --wait`` alone is not enough: on a busy host
    it was seen to return ``starting`` at once. A snapshot taken then carries
    the unfinished boot (e2scrub_reap running at idle priority) into every
    restore, which then spends seconds of CPU on it. Returns the final state.
    """
    deadline = time.monotonic() + timeout
    state = "?"

    def settled() -> str | None:
        nonlocal state
        r = guest.run_clean("systemctl is-system-running --wait; systemctl list-jobs --no-legend | wc -l",
                            max(1.0, min(deadline - time.monotonic(), 60.0)))
        words = r.output.split()
        state = words[0] if words else "?"
        return state if state in ("running", "degraded") and words[-1:] == ["0"] else None

    return wait_until(settled, timeout, "systemd finishing the boot", interval=0.5, error=VMError,
                      message=lambda: f"the guest did not finish booting within {timeout:.0f}s "
                                      f"(systemd state {state})")


def snapshot_dir(image: BuiltImage, accel: str, lan: bool = False) -> Path:
    """Where the golden snapshot of ``image`` under ``accel`` lives; its name is its cache key.

    ``lan``: the variant with a second NIC, which a machine of a multi-machine
    scenario is (another virtual machine, so another saved state); a
    single-machine sandbox never uses it, so its restores are what they were.
    """
    # The guest helper runs inside the template, so its version is part of the key; so is the
    # rest of QEMU's command line (machine type, CPU model, devices): a state loads into no other.
    # The extra disks' contents are frozen into it too (their drives are in the command line's
    # hash); an image without any keys what it always did.
    disks = f"-d{disks_digest(image)}" if image.disks else ""
    key = (f"{image.sha256[:16]}-qemu{qemu_version()}-{accel}-{image.memory_mib}m-v{SNAPSHOT_VERSION}"
           f"-h{helper_digest()}-c{machine_digest(image, accel, lan)}{disks}")
    return cache_dir("snapshots") / f"{image.name}-{key}{'-lan' if lan else ''}"


@contextmanager
def dead_end_lan(lan: bool) -> Iterator[LanPort | None]:
    """The golden boot's LAN NIC (``lan``): a port to nowhere, in a short private directory.

    A NIC's backend is not part of a saved state, so the template is saved
    with one that leads nowhere and each restore plugs in its sandbox's
    network. Unix socket paths are capped at 108 bytes: not in the cache.
    """
    if not lan:
        yield None
        return
    d = socket_dir("rb-lan-")
    try:
        yield LanPort(d / "m.sock", d / "nowhere.sock", SNAPSHOT_LAN_MAC)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _snapshot_ready(d: Path, image: BuiltImage) -> bool:
    return all((d / f).is_file() for f in (*snapshot_files(image), "snapshot.json"))


def _boot_and_save(image: BuiltImage, accel: str, work: Path, t0: float,
                   lan: LanPort | None = None) -> None:
    """One cold boot, waited on until settled, then saved into ``work`` (RAM file, device state)."""
    make_overlay(image.base, work / "frozen.qcow2")
    for disk in image.disks:
        make_overlay(disk.base, work / frozen_disk(disk))
    q = Qemu(image, work / "frozen.qcow2", accel, work, (work / "template.ram", True), False,
             lan=lan, disks=[work / frozen_disk(d) for d in image.disks])
    try:
        guest = wait_for_shell(q, BOOT_TIMEOUT)
        state = wait_until_settled(guest, READY_TIMEOUT)
        log.info("golden boot ready in %.1fs (system %s)", time.monotonic() - t0, state)
        guest.run_clean("sync", 30)  # the frozen disk holds everything the boot wrote
        guest.close()
        # ``events``: QEMU announces the migration's end (MIGRATION, status completed), so
        # the wait below reads one event instead of polling query-migrate.
        q.cmd("migrate-set-capabilities",
              capabilities=[{"capability": "x-ignore-shared", "state": True},
                            {"capability": "events", "state": True}])
        q.cmd("stop")
        q.qmp.clear_events()
        q.cmd("migrate", uri=f"exec:cat > {shlex.quote(str(work / 'device.state'))}")
        q.wait_migration(60, "saving the snapshot")
    finally:
        q.stop()


def _save_full_state(image: BuiltImage, accel: str, work: Path, lan: LanPort | None = None) -> None:
    """Save ``full.state`` from the template just saved in ``work``: restored paused, migrated on.

    The golden QEMU cannot do it (QEMU refuses to migrate a VM a completed
    migration paused), and a ``cont`` in between would let the guest run and
    the two states differ. This QEMU never runs the guest (``-S``) and maps
    the RAM file copy-on-write, so the template is not written.
    """
    scratch = work / "full-state-source"
    scratch.mkdir()
    make_overlay(work / "frozen.qcow2", scratch / "overlay.qcow2")
    for disk in image.disks:
        make_overlay(work / frozen_disk(disk), scratch / f"overlay-{disk.name}.qcow2")
    q = Qemu(image, scratch / "overlay.qcow2", accel, scratch, (work / "template.ram", False), True,
             paused=True, lan=lan, disks=[scratch / f"overlay-{d.name}.qcow2" for d in image.disks])
    try:
        q.cmd("migrate-set-capabilities",
              capabilities=[{"capability": "x-ignore-shared", "state": True},
                            {"capability": "events", "state": True}])
        q.qmp.clear_events()
        q.cmd("migrate-incoming", uri=f"exec:cat {shlex.quote(str(work / 'device.state'))}")
        q.wait_migration(60, "restoring the new template")
        q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": False}])
        q.qmp.clear_events()
        q.cmd("migrate", uri=f"exec:cat > {shlex.quote(str(work / 'full.state'))}")
        q.wait_migration(120, "saving the full state")
    finally:
        q.stop()
    shutil.rmtree(scratch, ignore_errors=True)


def ensure_snapshot(image: BuiltImage, accel: str, lan: bool = False) -> Path:
    """The golden snapshot's directory; made by one cold boot if the cache lacks it.

    ``lan``: the variant with a second NIC (see :func:`snapshot_dir`)."""
    d = snapshot_dir(image, accel, lan)
    if _snapshot_ready(d, image):
        return d
    with file_lock(d, f"snapshot {image.name}"):
        if _snapshot_ready(d, image):
            return d
        log.info("making the golden snapshot of %s (%s%s): one cold boot", image.name, accel,
                 ", with a private-network NIC" if lan else "")
        t0 = time.monotonic()
        work = d.with_name(d.name + ".partial")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, mode=0o700)
        try:
            with dead_end_lan(lan) as port:
                _boot_and_save(image, accel, work, t0, port)
                _save_full_state(image, accel, work, port)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)  # a failed attempt leaves no 460 MB behind
            raise
        for name in snapshot_files(image):
            os.chmod(work / name, 0o444)
        (work / "snapshot.json").write_text(json.dumps({
            "image": image.name, "image_sha256": image.sha256, "accel": accel,
            **({"lan": True} if lan else {}),
            **({"disks": {d.name: d.sha256 for d in image.disks}} if image.disks else {}),
            "qemu": qemu_version(), "seconds": round(time.monotonic() - t0, 1)}) + "\n")
        shutil.rmtree(d, ignore_errors=True)
        work.rename(d)
        log.info("golden snapshot saved in %.1fs", time.monotonic() - t0)
        return d
