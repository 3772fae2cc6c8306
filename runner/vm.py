"""QEMU sandboxes: a fresh overlay per run, restored from a golden snapshot when possible.

A :class:`Sandbox` is a context manager. Entering it gives a ready guest;
leaving it, whatever happened, ends QEMU by its own pid and removes the
overlay and sockets. The base image is only ever a read-only backing file.

Fast reset is VM templating (DESIGN.md): the golden boot runs with its RAM
in a shared file, its device state is migrated to a small file, and its disk
overlay is frozen. Each run maps the RAM file copy-on-write, makes a new
overlay on the frozen disk and resumes from the device state, so a shell
answers in a fraction of a second instead of a 25 s TCG boot.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qemu.qmp.legacy import QEMUMonitorProtocol

from runner.errors import GuestDown, InfraError, VMError
from runner.guest import Guest, SerialGuest, SshGuest
from runner.images import BuiltImage, ensure_image, file_lock
from runner.paths import cache_dir
from runner.process import die_with_parent, end_process, free_port

Progress = Callable[[str], None]
BOOT_TIMEOUT = 240.0  # seconds from launch to a root shell, TCG on a busy 2-core host
READY_TIMEOUT = 180.0  # seconds for systemd to finish starting units in the golden boot
SNAPSHOT_VERSION = 3  # 3: taken only once systemd has no jobs left (2 could catch a unit still starting)
FORWARDED_PORTS = (22, 80)


class KvmUnusable(VMError):
    """KVM opened but the guest hit ``KVM internal error`` (e.g. nested kvm_pvm)."""


def qemu_binary() -> str:
    path = shutil.which("qemu-system-x86_64")
    if not path:
        raise VMError("qemu-system-x86_64 is not installed (run `make setup`)")
    return path


@functools.cache
def qemu_version() -> str:
    """The installed QEMU's version (asked once per process: every VM start keys caches by it)."""
    out = subprocess.run([qemu_binary(), "--version"], capture_output=True, text=True, timeout=10)
    first = out.stdout.splitlines()[0] if out.stdout else "unknown"
    return first.replace("QEMU emulator version ", "").split(" ")[0]


def _kvm_verdict_file() -> Path:
    return cache_dir("hostinfo") / f"kvm-{os.uname().release}-{qemu_version()}.json"


def kvm_status() -> tuple[bool, str]:
    """Whether KVM is usable here, and why (cached after a real boot found out)."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
    except OSError as exc:
        return False, f"/dev/kvm is not usable ({exc.strerror})"
    verdict = _kvm_verdict_file()
    if verdict.is_file():
        try:
            data = json.loads(verdict.read_text())
            return bool(data["usable"]), str(data["why"])
        except (ValueError, KeyError, OSError):
            pass
    return True, "/dev/kvm opens (not yet proven by a boot)"


def record_kvm_unusable(why: str) -> None:
    _kvm_verdict_file().write_text(json.dumps({"usable": False, "why": why}) + "\n")


_told = {"kvm": False}  # say the fallback once per process, not once per VM


def choose_accel(pref: str, progress: Progress | None = None) -> str:
    if pref in ("kvm", "tcg"):
        return pref
    usable, why = kvm_status()
    if not usable:
        if progress and not _told["kvm"]:
            _told["kvm"] = True
            progress(f"[vm] KVM unusable ({why[:120]}); using TCG (slower, works everywhere)")
        return "tcg"
    return "kvm"


class _Qemu:
    """One QEMU process with a QMP socket and a serial socket in a private 0700 directory."""

    def __init__(self, image: BuiltImage, disk: Path, accel: str, workdir: Path,
                 ram: tuple[Path, bool] | None, incoming: bool) -> None:
        self.workdir = workdir
        self.accel = accel
        # Unix socket paths are capped at 108 bytes, so sockets live in a short private dir.
        self.sock_dir = Path(tempfile.mkdtemp(prefix="rb-"))
        os.chmod(self.sock_dir, 0o700)
        self.qmp_path = self.sock_dir / "qmp.sock"
        self.console_path = self.sock_dir / "console.sock"
        self.forwards = {guest: free_port() for guest in FORWARDED_PORTS}
        self.log_path = workdir / "qemu.log"
        mem = image.memory_mib
        fwd = ",".join(f"hostfwd=tcp:127.0.0.1:{h}-:{g}" for g, h in self.forwards.items())
        machine = "q35,memory-backend=mem0" if ram else "q35"
        cmd = [qemu_binary(), "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
               "-machine", machine, "-m", f"{mem}M", "-smp", "1",
               "-accel", "kvm" if accel == "kvm" else "tcg",
               "-cpu", "host" if accel == "kvm" else "max",
               "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", image.cmdline,
               "-drive", f"file={disk},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
               "-netdev", f"user,id=n0,restrict=on,{fwd}",
               "-device", "virtio-net-pci,netdev=n0",
               "-chardev", f"socket,id=ser0,path={self.console_path},server=on,wait=off",
               "-serial", "chardev:ser0",
               "-qmp", f"unix:{self.qmp_path},server=on,wait=off"]
        if ram:
            path, shared = ram
            cmd += ["-object", f"memory-backend-file,id=mem0,size={mem}M,mem-path={path},"
                               f"share={'on' if shared else 'off'}"]
        if incoming:
            cmd += ["-incoming", "defer"]
        self.argv = cmd
        self.started = time.monotonic()
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        self.killed_by_us = False
        self.qmp = self._connect_qmp(10.0)

    def _connect_qmp(self, timeout: float) -> QEMUMonitorProtocol:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                why = f"QEMU exited at start (code {self.proc.returncode}): {self.log_tail()}"
                if self.accel == "kvm":
                    raise KvmUnusable(why)
                raise VMError(why)
            if self.qmp_path.exists():
                qmp = QEMUMonitorProtocol(str(self.qmp_path))
                try:
                    qmp.connect()
                    qmp.settimeout(30)
                    return qmp
                except (OSError, Exception):  # noqa: BLE001 - the library raises its own types
                    with contextlib.suppress(Exception):
                        qmp.close()
            if time.monotonic() > deadline:
                raise VMError("QEMU's QMP socket did not answer within 10s")
            time.sleep(0.01)

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-3:])[:300]

    def cmd(self, name: str, **args: Any) -> Any:
        try:
            reply = self.qmp.cmd_raw(name, args or None)
        except Exception as exc:  # noqa: BLE001 - QMP transport errors of any kind
            raise VMError(f"QMP {name} failed: {exc}") from None
        if "error" in reply:
            raise VMError(f"QMP {name}: {reply['error'].get('desc', reply['error'])}")
        return reply.get("return")

    def status(self) -> str:
        if self.proc.poll() is not None:
            return "exited"
        try:
            return str(self.cmd("query-status").get("status"))
        except VMError:
            return "unknown"

    def alive(self) -> bool:
        return self.proc.poll() is None and self.status() not in ("internal-error", "shutdown")

    def stop(self) -> None:
        """Graceful quit through QMP, then SIGTERM, then SIGKILL; always reaped."""
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.qmp.settimeout(2)
                self.qmp.cmd_raw("quit")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=3)
            end_process(self.proc, grace=3)
        with contextlib.suppress(Exception):
            self.qmp.close()
        self._log.close()
        shutil.rmtree(self.sock_dir, ignore_errors=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _overlay(backing: Path, path: Path) -> None:
    r = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing), "-F", "qcow2",
                        str(path)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise VMError(f"qemu-img create failed: {r.stderr.strip()[:200]}")


def _wait_for_shell(q: _Qemu, timeout: float) -> SerialGuest:
    """Cold boot: wait for the autologin prompt, watching for KVM's internal error."""
    guest = SerialGuest(str(q.console_path), q.forwards)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            guest.close()
            raise VMError(f"no root shell on the serial console within {timeout:.0f}s")
        try:
            guest.wait_for_login(min(left, 3.0))
            return guest
        except GuestDown:
            status = q.status()
            if status == "internal-error":
                guest.close()
                raise KvmUnusable("the guest stopped with KVM internal error") from None
            if status == "exited":
                guest.close()
                raise VMError(f"QEMU exited during boot: {q.log_tail()}") from None


def _wait_until_settled(guest: Guest, timeout: float) -> str:
    """Wait until systemd has finished booting: state running (or degraded) and no jobs queued.

    ``systemctl is-system-running --wait`` alone is not enough: on a busy host
    it was seen to return ``starting`` at once. A snapshot taken then carries
    the unfinished boot (e2scrub_reap running at idle priority) into every
    restore, which then spends seconds of CPU on it. Returns the final state.
    """
    deadline = time.monotonic() + timeout
    state = "?"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise VMError(f"the guest did not finish booting within {timeout:.0f}s "
                          f"(systemd state {state})")
        r = guest.probe("systemctl is-system-running --wait; systemctl list-jobs --no-legend | wc -l",
                        min(left, 60.0))
        words = r.output.split()
        state = words[0] if words else "?"
        if state in ("running", "degraded") and words[-1:] == ["0"]:
            return state
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


# --- golden snapshots ----------------------------------------------------------------------

def snapshot_dir(image: BuiltImage, accel: str) -> Path:
    key = f"{image.sha256[:16]}-qemu{qemu_version()}-{accel}-{image.memory_mib}m-v{SNAPSHOT_VERSION}"
    return cache_dir("snapshots") / f"{image.name}-{key}"


def _snapshot_ready(d: Path) -> bool:
    return all((d / f).is_file() for f in ("frozen.qcow2", "template.ram", "device.state", "snapshot.json"))


def _boot_and_save(image: BuiltImage, accel: str, work: Path, progress: Progress, t0: float) -> None:
    """One cold boot, waited on until settled, then saved into ``work`` (RAM file, device state)."""
    _overlay(image.base, work / "frozen.qcow2")
    q = _Qemu(image, work / "frozen.qcow2", accel, work, (work / "template.ram", True), False)
    try:
        guest = _wait_for_shell(q, BOOT_TIMEOUT)
        state = _wait_until_settled(guest, READY_TIMEOUT)
        progress(f"[vm] golden boot ready in {time.monotonic() - t0:.1f}s (system {state})")
        guest.probe("sync; systemctl is-active nginx ssh", 30)
        guest.close()
        q.cmd("migrate-set-capabilities",
              capabilities=[{"capability": "x-ignore-shared", "state": True}])
        q.cmd("stop")
        q.cmd("migrate", uri=f"exec:cat > {work / 'device.state'}")
        deadline = time.monotonic() + 60
        while True:
            info = q.cmd("query-migrate") or {}
            if info.get("status") == "completed":
                break
            if info.get("status") in ("failed", "cancelled") or time.monotonic() > deadline:
                raise VMError(f"saving the snapshot failed: {info.get('error-desc', info)}")
            time.sleep(0.02)
    finally:
        q.stop()


def ensure_snapshot(image: BuiltImage, accel: str, progress: Progress) -> Path:
    """The golden snapshot's directory; made by one cold boot if the cache lacks it."""
    d = snapshot_dir(image, accel)
    if _snapshot_ready(d):
        return d
    with file_lock(d, f"snapshot {image.name}", progress):
        if _snapshot_ready(d):
            return d
        progress(f"[vm] making the golden snapshot of {image.name} ({accel}): one cold boot")
        t0 = time.monotonic()
        work = d.with_name(d.name + ".partial")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, mode=0o700)
        try:
            _boot_and_save(image, accel, work, progress, t0)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)  # a failed attempt leaves no 260 MB behind
            raise
        for name in ("frozen.qcow2", "template.ram", "device.state"):
            os.chmod(work / name, 0o444)
        (work / "snapshot.json").write_text(json.dumps({
            "image": image.name, "image_sha256": image.sha256, "accel": accel,
            "qemu": qemu_version(), "seconds": round(time.monotonic() - t0, 1)}) + "\n")
        shutil.rmtree(d, ignore_errors=True)
        work.rename(d)
        progress(f"[vm] golden snapshot saved in {time.monotonic() - t0:.1f}s")
        return d


# --- the sandbox -------------------------------------------------------------------------------

class Sandbox:
    """One disposable VM with a ready guest. Use as a context manager."""

    def __init__(self, image: str = "debian-12-nginx", *, accel: str = "auto",
                 transport: str = "serial", workdir: Path | str | None = None,
                 progress: Progress | None = None, snapshot: bool = True) -> None:
        if transport not in ("serial", "ssh"):
            from runner.errors import InvalidInput

            raise InvalidInput(f"unknown transport {transport!r} (serial or ssh)", field="--transport")
        if accel not in ("auto", "kvm", "tcg"):
            from runner.errors import InvalidInput

            raise InvalidInput(f"unknown accelerator {accel!r} (auto, kvm or tcg)", field="--accel")
        self.image_name = image
        self.accel_pref = accel
        self.transport = transport
        self.parent = Path(workdir) if workdir else None
        self.progress = progress or (lambda _m: None)
        self.use_snapshot = snapshot
        self.info: dict[str, Any] = {}
        self.guest: Guest
        self._q: _Qemu | None = None
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
        image = ensure_image(self.image_name, self.progress)
        accel = choose_accel(self.accel_pref, self.progress)
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
            self.progress(f"[vm] KVM unusable ({exc}); falling back to TCG")
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
        self.info = {"accel": accel, "restored": restored, "ready_s": round(time.monotonic() - t0, 3),
                     "shell_s": round(self.shell_s, 3),
                     "qemu_version": qemu_version(), "image": image.name,
                     "image_sha256": image.sha256, "transport": self.transport}

    def _boot(self, image: BuiltImage, accel: str) -> bool:
        assert self._dir is not None
        if self.use_snapshot:
            try:
                snap = ensure_snapshot(image, accel, self.progress)
                self._restore(image, accel, snap)
                return True
            except KvmUnusable:
                raise
            except InfraError as exc:
                self.progress(f"[vm] snapshot restore failed ({exc}); cold booting instead")
                self._stop_qemu()
        self._cold(image, accel)
        return False

    def _restore(self, image: BuiltImage, accel: str, snap: Path) -> None:
        assert self._dir is not None
        overlay = self._dir / "overlay.qcow2"
        _overlay(snap / "frozen.qcow2", overlay)
        self._q = q = _Qemu(image, overlay, accel, self._dir, (snap / "template.ram", False), True)
        q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
        q.cmd("migrate-incoming", uri=f"exec:cat {snap / 'device.state'}")
        deadline = time.monotonic() + 30
        while True:
            status = q.status()
            if status in ("running", "paused", "postmigrate"):
                info = q.cmd("query-migrate") or {}
                if status == "running" or info.get("status") == "completed":
                    break
            if status in ("internal-error", "exited", "shutdown") or time.monotonic() > deadline:
                raise VMError(f"restore did not complete (status {status}): {q.log_tail()}")
            time.sleep(0.005)
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
        _overlay(image.base, overlay)
        self._q = q = _Qemu(image, overlay, accel, self._dir, None, False)
        self._serial = _wait_for_shell(q, BOOT_TIMEOUT)
        self.shell_s = time.monotonic() - q.started
        _wait_until_settled(self._serial, READY_TIMEOUT)

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
