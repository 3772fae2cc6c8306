"""The sandbox: one disposable VM with a ready guest, torn down whatever happens.

A :class:`Sandbox` is a context manager. Entering it gives a ready guest
(restored from the image's golden snapshot, else cold-booted); leaving it
ends QEMU by its own pid and removes the overlay and sockets. The base image
is only ever a read-only backing file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner.backends.images import BuiltImage, ensure_image
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
    wait_for_shell,
    wait_until_settled,
)
from runner.backends.ssh import SshGuest
from runner.core.errors import InfraError, InvalidInput, VMError
from runner.core.guest import Guest
from runner.core.waiting import wait_until

log = logging.getLogger("rootbench.vm")


@dataclass(frozen=True)
class SandboxInfo:
    """How a sandbox came up; written into every cassette header."""

    accel: str  # kvm | tcg
    restored: bool  # from the golden snapshot (else cold boot)
    ready_s: float  # entering the sandbox to a ready guest, overlay and clock included
    shell_s: float  # QEMU launch to the first command answered
    qemu_version: str
    image: str
    image_sha256: str
    transport: str  # serial | ssh

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sandbox:
    """One disposable VM with a ready guest. Use as a context manager."""

    def __init__(self, image: str = "debian-12-nginx", *, accel: str = "auto",
                 transport: str = "serial", workdir: Path | str | None = None,
                 snapshot: bool = True) -> None:
        if transport not in ("serial", "ssh"):
            raise InvalidInput(f"unknown transport {transport!r} (serial or ssh)", field="--transport")
        if accel not in ("auto", "kvm", "tcg"):
            raise InvalidInput(f"unknown accelerator {accel!r} (auto, kvm or tcg)", field="--accel")
        self.image_name = image
        self.accel_pref = accel
        self.transport = transport
        self.parent = Path(workdir) if workdir else None
        self.use_snapshot = snapshot
        self.info: SandboxInfo
        self.guest: Guest
        self._q: Qemu | None = None
        self._serial: SerialGuest | None = None
        self._dir: Path | None = None
        self.shell_s = 0.0  # QEMU launch to the first command answered

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
        restored = False
        try:
            restored = self._boot(image, accel)
        except KvmUnusable as exc:
            if self.accel_pref != "auto":
                raise
            record_kvm_unusable(str(exc))
            log.info("KVM unusable (%s); falling back to TCG", exc)
            self._stop_qemu()
            accel = "tcg"
            restored = self._boot(image, accel)
        assert self._q is not None and self._serial is not None
        if self.transport == "ssh":
            key = self._dir / "id_ed25519"
            shutil.copyfile(image.ssh_key, key)
            os.chmod(key, 0o600)
            self.guest = SshGuest(self._q.forwards[22], str(key), str(self._dir), self._q.forwards)
        else:
            self.guest = self._serial
        self.info = SandboxInfo(accel=accel, restored=restored,
                                ready_s=round(time.monotonic() - t0, 3),
                                shell_s=round(self.shell_s, 3), qemu_version=qemu_version(),
                                image=image.name, image_sha256=image.sha256,
                                transport=self.transport)

    def _boot(self, image: BuiltImage, accel: str) -> bool:
        assert self._dir is not None
        if self.use_snapshot:
            try:
                snap = ensure_snapshot(image, accel)
                self._restore(image, accel, snap)
                return True
            except KvmUnusable:
                raise
            except InfraError as exc:
                log.info("snapshot restore failed (%s); cold booting instead", exc)
                self._stop_qemu()
        self._cold(image, accel)
        return False

    def _restore(self, image: BuiltImage, accel: str, snap: Path) -> None:
        assert self._dir is not None
        overlay = self._dir / "overlay.qcow2"
        make_overlay(snap / "frozen.qcow2", overlay)
        self._q = q = Qemu(image, overlay, accel, self._dir, (snap / "template.ram", False), True)
        # ``events``: QEMU announces the incoming migration's end (MIGRATION, status
        # completed, sent after the run state is set), so the wait reads one event
        # instead of polling query-status and query-migrate over QMP.
        q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True},
                                                        {"capability": "events", "state": True}])
        q.qmp.clear_events()
        q.cmd("migrate-incoming", uri=f"exec:cat {snap / 'device.state'}")
        deadline = time.monotonic() + 30

        def restored() -> bool:
            try:
                status = q.migration_event(min(0.5, max(0.01, deadline - time.monotonic())))
            except VMError:  # QEMU exited
                raise VMError(f"restore did not complete (status exited): {q.log_tail()}") from None
            if status in ("failed", "cancelled"):
                raise VMError(f"restore did not complete (migration {status}): {q.log_tail()}")
            return status == "completed"

        wait_until(restored, 30, "the snapshot restore", interval=0, error=VMError,
                   message=lambda: f"restore did not complete (status {q.status()}): {q.log_tail()}")
        if q.status() != "running":
            q.cmd("cont")
        self._serial = SerialGuest(str(q.console_path), q.forwards)
        self._serial.sync(20, idle=True, set_clock=True)
        self.shell_s = time.monotonic() - q.started
        if q.status() == "internal-error":
            raise KvmUnusable("the restored guest stopped with KVM internal error")

    def _cold(self, image: BuiltImage, accel: str) -> None:
        assert self._dir is not None
        overlay = self._dir / "overlay.qcow2"
        with contextlib.suppress(FileNotFoundError):
            overlay.unlink()
        make_overlay(image.base, overlay)
        self._q = q = Qemu(image, overlay, accel, self._dir, None, False)
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
