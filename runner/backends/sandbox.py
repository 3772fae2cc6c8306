"""The sandbox: one disposable VM with a ready guest, torn down whatever happens.

A :class:`Sandbox` is a context manager. Entering it gives a ready guest;
leaving it ends QEMU by its own pid and removes the overlay and sockets. The
base image and the golden snapshot are only ever read.

A guest comes up the first way that works, in this order: the template
restore (the snapshot's RAM file mapped copy-on-write, ~0.5 s), the
full-state restore (the snapshot's whole migration stream loaded into
anonymous RAM, ~1.5 s), a cold boot (~30-60 s under TCG). A way that fails
is said in one warning line, once per process per reason (a broken template
would otherwise say so for every VM of a bench); each sandbox records the
way it took and why in :class:`SandboxInfo`. ``restore=`` (default
``$ROOTBENCH_RESTORE``, else ``template``) picks where the chain starts,
which is how tests and users force a way without a fault.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner.backends.framing import helper_digest
from runner.backends.images import BuiltImage, ensure_image
from runner.backends.lan import LanPort
from runner.backends.process import guest_nice
from runner.backends.qemu import (
    KvmUnusable,
    Qemu,
    choose_accel,
    make_overlay,
    qemu_version,
    record_kvm_unusable,
)
from runner.backends.serial import SerialGuest
from runner.backends.snapshot import (
    BOOT_TIMEOUT,
    READY_TIMEOUT,
    ensure_snapshot,
    frozen_disk,
    snapshot_files,
    wait_for_shell,
    wait_until_settled,
)
from runner.backends.ssh import SshGuest
from runner.core.errors import InfraError, InvalidInput, VMError
from runner.core.guest import Guest
from runner.core.text import one_line

log = logging.getLogger("rootbench.vm")
RESTORES = ("template", "full-state", "cold")  # the fallback chain, in order
RESTORE_ENV = "ROOTBENCH_RESTORE"  # where the chain starts when Sandbox(restore=) is not given
_told: set[str] = set()  # fallbacks already said in this process: once per reason, not per VM
_PER_VM = re.compile(r"rootbench-vm-\w+|rb-\w+|\d+")  # what differs between two VMs' same fault


@dataclass(frozen=True)
class SandboxInfo:
    """How a sandbox came up; written into every cassette header."""

    accel: str  # kvm | tcg
    restored: bool  # from the golden snapshot, either way (restore != "cold"); older readers use it
    restore: str  # template | full-state | cold: the way this guest came up
    fallback: str | None  # why the ways tried before it failed, one line; None if the first worked
    ready_s: float  # entering the sandbox to a ready guest, overlay and clock included
    shell_s: float  # QEMU launch to the first command answered
    qemu_version: str
    image: str
    image_sha256: str
    transport: str  # serial | ssh
    # How many nice levels QEMU ran below rootbench and so below the model server it starts
    # (process.GUEST_NICE, as far as rootbench's own nice value left room); 0: none.
    # Absent from cassettes recorded before it existed.
    guest_nice: int = 0
    # What a recorded proof depends on beside the spec and the rules (``verify --oracle
    # changed``): the image recipe's cache key and the guest helper's digest; "" in cassettes
    # recorded before they were written.
    recipe_key: str = ""
    helper: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _say_fallback(what: str, then: str) -> str:
    """Warn that a way failed and what comes next, once per process per reason; ``what`` in one line."""
    reason = one_line(what, 300)
    key = _PER_VM.sub("#", reason)
    if key in _told:
        log.debug("%s; %s", reason, then)
    else:
        _told.add(key)
        log.warning("%s; %s", reason, then)
    return reason


class Sandbox:
    """One disposable VM with a ready guest. Use as a context manager.

    What it raises, and nothing else: the constructor, :class:`~runner.core.errors.
    InvalidInput` for a bad transport, accelerator, restore or nice value (before any
    VM starts); entering, :class:`~runner.core.errors.VMError` (an
    :class:`~runner.core.errors.InfraError`) when QEMU cannot start or the guest never
    answers, after every way to come up was tried (KVM that cannot run this kernel falls
    back to TCG, a snapshot that will not restore to a cold boot) and the half-made VM is
    torn down. Leaving never raises for the VM's sake: teardown is best effort, bounded,
    and kills QEMU. The guest it holds raises what :class:`~runner.core.guest.Guest` says.
    """

    def __init__(self, image: str = "debian-12-nginx", *, accel: str = "auto",
                 transport: str = "serial", workdir: Path | str | None = None,
                 snapshot: bool = True, restore: str | None = None,
                 snapshot_dir: Path | str | None = None, lan: LanPort | None = None,
                 nice: int | None = None) -> None:
        """``restore``: the first way to try (template, full-state, cold); ``snapshot=False``
        means cold. ``snapshot_dir``: restore from this golden snapshot instead of the
        cache's (tests point it at a damaged copy: the cached one is shared and read-only).
        ``lan``: this VM's port on a private network (one machine of a :class:`~runner.
        backends.fleet.Fleet`): a second NIC, restored from the snapshot variant with one.
        ``nice``: QEMU's nice levels below rootbench (None: ``$ROOTBENCH_GUEST_NICE`` or
        :data:`~runner.backends.process.GUEST_NICE`; read here, so a bad value is refused
        before any VM starts)."""
        if transport not in ("serial", "ssh"):
            raise InvalidInput(f"unknown transport {transport!r} (serial or ssh)", field="--transport")
        if accel not in ("auto", "kvm", "tcg"):
            raise InvalidInput(f"unknown accelerator {accel!r} (auto, kvm or tcg)", field="--accel")
        where = "restore" if restore is not None else RESTORE_ENV
        restore = restore if restore is not None else os.environ.get(RESTORE_ENV) or "template"
        if restore not in RESTORES:
            raise InvalidInput(f"unknown restore {restore!r} (template, full-state or cold)",
                               field=where)
        self.image_name = image
        self.accel_pref = accel
        self.transport = transport
        self.parent = Path(workdir) if workdir else None
        self.restore = restore if snapshot else "cold"
        self.snapshot_dir = Path(snapshot_dir) if snapshot_dir else None
        self.lan = lan
        self.nice = guest_nice() if nice is None else nice
        self.info: SandboxInfo
        self.guest: Guest
        self._q: Qemu | None = None
        self._serial: SerialGuest | None = None
        self._dir: Path | None = None
        self.shell_s = 0.0  # QEMU launch to the first command answered
        # Of shell_s, the part after the restored guest was set running: the guest's own
        # wake to its first answer (0.0 for a cold boot). What is left is QEMU's side.
        self.wake_s = 0.0

    # lifecycle
    def __enter__(self) -> Sandbox:
        try:
            self._start()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._teardown()

    def _start(self) -> None:
        t0 = time.monotonic()
        image = ensure_image(self.image_name)
        accel = choose_accel(self.accel_pref)
        if self.parent:
            self.parent.mkdir(parents=True, exist_ok=True)
        self._dir = Path(tempfile.mkdtemp(prefix="rootbench-vm-", dir=self.parent))
        os.chmod(self._dir, 0o700)
        try:
            way, fallback = self._boot(image, accel)
        except KvmUnusable as exc:
            if self.accel_pref != "auto":
                raise
            record_kvm_unusable(str(exc))
            log.info("KVM unusable (%s); falling back to TCG", exc)
            self._stop_qemu()
            accel = "tcg"
            way, fallback = self._boot(image, accel)
        assert self._q is not None and self._serial is not None
        if self.transport == "ssh":
            key = self._dir / "id_ed25519"
            shutil.copyfile(image.ssh_key, key)
            os.chmod(key, 0o600)
            ssh = SshGuest(self._q.forwards[22], str(key), str(self._dir), self._q.forwards)
            ssh.power = self._q  # the judge's reboot re-check
            self.guest = ssh
        else:
            self._serial.power = self._q
            self.guest = self._serial
        self.info = SandboxInfo(accel=accel, restored=way != "cold", restore=way, fallback=fallback,
                                ready_s=round(time.monotonic() - t0, 3),
                                shell_s=round(self.shell_s, 3), qemu_version=qemu_version(),
                                image=image.name, image_sha256=image.sha256,
                                transport=self.transport, guest_nice=self._q.nice,
                                recipe_key=image.recipe_key, helper=helper_digest())

    def _boot(self, image: BuiltImage, accel: str) -> tuple[str, str | None]:
        """Down the chain from ``self.restore``: the way that worked, and why those before failed."""
        reasons: list[str] = []
        ways = [w for w in RESTORES[RESTORES.index(self.restore):] if w != "cold"]
        snap = Path()
        if ways:
            try:
                snap = self._snapshot(image, accel)
            except KvmUnusable:
                raise
            except InfraError as exc:  # no snapshot, no restore: straight to the cold boot
                reasons.append(_say_fallback(f"no golden snapshot ({exc})", "cold booting instead"))
                ways = []
        for i, way in enumerate(ways):
            try:
                if way == "template":
                    self._restore_template(image, accel, snap)
                else:
                    self._restore_full(image, accel, snap)
                return way, "; ".join(reasons) or None
            except KvmUnusable:
                raise
            except InfraError as exc:
                self._stop_qemu()
                then = f"trying the {ways[i + 1]} restore" if i + 1 < len(ways) else "cold booting instead"
                reasons.append(_say_fallback(f"{way} restore failed ({exc})", then))
        self._cold(image, accel)
        return "cold", "; ".join(reasons) or None

    def _snapshot(self, image: BuiltImage, accel: str) -> Path:
        """The golden snapshot to restore from: the one given, else the cache's (made if missing)."""
        if self.snapshot_dir is None:
            return ensure_snapshot(image, accel, lan=self.lan is not None)
        missing = [f for f in snapshot_files(image) if not (self.snapshot_dir / f).is_file()]
        if missing:
            raise VMError(f"{self.snapshot_dir} lacks {', '.join(missing)}")
        return self.snapshot_dir

    def _restore_template(self, image: BuiltImage, accel: str, snap: Path) -> None:
        """RAM: the template file, copy-on-write; only the small device state is read."""
        assert self._dir is not None
        overlay = self._fresh_overlay(snap / "frozen.qcow2")
        disks = self._disk_overlays(image, snap)
        self._q = q = Qemu(image, overlay, accel, self._dir, (snap / "template.ram", False), True,
                           lan=self.lan, disks=disks, nice=self.nice)
        # ``events``: QEMU announces the incoming migration's end (MIGRATION, status
        # completed, sent after the run state is set), so the wait reads one event
        # instead of polling query-status and query-migrate over QMP.
        q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True},
                                                        {"capability": "events", "state": True}])
        q.qmp.clear_events()
        q.cmd("migrate-incoming", uri=f"exec:cat {shlex.quote(str(snap / 'device.state'))}")
        q.wait_migration(30, "loading device.state")
        self._resume(q)

    def _restore_full(self, image: BuiltImage, accel: str, snap: Path) -> None:
        """RAM: anonymous, filled from the whole saved VM; needs nothing of the template's RAM file."""
        assert self._dir is not None
        overlay = self._fresh_overlay(snap / "frozen.qcow2")
        disks = self._disk_overlays(image, snap)
        self._q = q = Qemu(image, overlay, accel, self._dir, None, True, lan=self.lan, disks=disks,
                           nice=self.nice)
        q.cmd("migrate-set-capabilities", capabilities=[{"capability": "events", "state": True}])
        q.qmp.clear_events()
        q.cmd("migrate-incoming", uri=f"exec:cat {shlex.quote(str(snap / 'full.state'))}")
        q.wait_migration(60, "loading full.state")
        self._resume(q)

    def _resume(self, q: Qemu) -> None:
        """Run the restored guest (it was saved paused) and wait for its shell, clock set."""
        if q.status() != "running":
            q.cmd("cont")
        woken = time.monotonic()
        self._serial = SerialGuest(str(q.console_path), q.forwards)
        self._serial.sync(20, idle=True, set_clock=True)
        self.shell_s = time.monotonic() - q.started
        self.wake_s = time.monotonic() - woken
        if q.status() == "internal-error":
            raise KvmUnusable("the restored guest stopped with KVM internal error")

    def _fresh_overlay(self, backing: Path, name: str = "overlay.qcow2") -> Path:
        """A new disk overlay on ``backing`` (a failed way before may have left one)."""
        assert self._dir is not None
        overlay = self._dir / name
        with contextlib.suppress(FileNotFoundError):
            overlay.unlink()
        make_overlay(backing, overlay)
        return overlay

    def _disk_overlays(self, image: BuiltImage, snap: Path | None) -> list[Path]:
        """A new overlay on each of the image's extra disks, in order: on the snapshot's frozen
        one (a restore), or on the built base (``snap`` None: a cold boot)."""
        return [self._fresh_overlay(snap / frozen_disk(d) if snap else d.base, f"overlay-{d.name}.qcow2")
                for d in image.disks]

    def _cold(self, image: BuiltImage, accel: str) -> None:
        overlay = self._fresh_overlay(image.base)
        disks = self._disk_overlays(image, None)
        assert self._dir is not None
        self._q = q = Qemu(image, overlay, accel, self._dir, None, False, lan=self.lan, disks=disks,
                           nice=self.nice)
        self._serial = wait_for_shell(q, BOOT_TIMEOUT)
        self.shell_s = time.monotonic() - q.started
        wait_until_settled(self._serial, READY_TIMEOUT)

    def _stop_qemu(self) -> None:
        if self._serial is not None:
            self._serial.close()
            self._serial = None
        if self._q is not None:
            self._q.stop()
            self._q = None

    def _teardown(self) -> None:
        guest = getattr(self, "guest", None)
        if guest is not None and guest is not self._serial:
            with contextlib.suppress(Exception):
                guest.close()
        self._stop_qemu()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # observation
    def vm_alive(self) -> bool:
        return self._q is not None and self._q.alive()

    def killed_externally(self) -> bool:
        """QEMU died from a signal we did not send (a guest poweroff exits QEMU with 0)."""
        if self._q is None:
            return False
        rc = self._q.proc.poll()
        return rc is not None and rc < 0

    def kill(self) -> None:
        """SIGKILL QEMU now (the fault-matrix tests use this)."""
        if self._q is not None:
            self._q.kill()

    @property
    def pid(self) -> int | None:
        return self._q.proc.pid if self._q else None

    @property
    def forwards(self) -> dict[int, int]:
        return dict(self._q.forwards) if self._q else {}

    @property
    def workdir(self) -> Path | None:
        """This sandbox's private 0700 directory (disk overlay, QEMU log, SSH key); None once torn down."""
        return self._dir

    @property
    def socket_dir(self) -> Path | None:
        """The private 0700 directory of QEMU's QMP and serial sockets; None while no QEMU runs."""
        return self._q.sock_dir if self._q else None

    @property
    def qemu_argv(self) -> tuple[str, ...]:
        """The command line the running QEMU was started with; empty while no QEMU runs."""
        return tuple(self._q.argv) if self._q else ()
