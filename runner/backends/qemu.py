"""One QEMU process: launched tied to rootbench, driven over QMP, ended for sure.

Every VM is the same virtual machine (``qemu_args``), whatever holds its RAM:
a file (the golden boot, a template restore) or anonymous memory (a cold
boot, a full-state restore). A saved state loads only into that machine, so
its shape is hashed into the snapshot's cache key (``machine_digest``).

Also the accelerator choice. KVM is used when it works; a KVM that opens
but cannot run the guest (the nested ``kvm_pvm`` hosts this was built on
stop with ``KVM internal error``) is remembered per kernel and QEMU
version, and TCG is used instead, said once in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qemu.qmp.legacy import QEMUMonitorProtocol

from runner.backends.cachedir import cache_dir
from runner.backends.images import BuiltImage
from runner.backends.lan import LanPort
from runner.backends.process import end_process, free_ports, guest_nice, lowered, socket_dir
from runner.core.errors import VMError
from runner.core.machines import SNAPSHOT_LAN_MAC
from runner.core.waiting import wait_until

log = logging.getLogger("rootbench.vm")
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


def choose_accel(pref: str) -> str:
    """``kvm`` or ``tcg`` for a preference of ``auto``, ``kvm`` or ``tcg``."""
    if pref in ("kvm", "tcg"):
        return pref
    usable, why = kvm_status()
    if not usable:
        if not _told["kvm"]:
            _told["kvm"] = True
            log.info("KVM unusable (%s); using TCG (slower, works everywhere)", why[:120])
        return "tcg"
    return "kvm"


RamFile = tuple[Path, bool]  # the guest RAM's file and whether QEMU writes it (share=on)


def qemu_args(image: BuiltImage, disk: Path, accel: str, ram: RamFile | None, console: Path,
              qmp: Path, forwards: dict[int, int], lan: LanPort | None = None,
              disks: Sequence[Path] = ()) -> list[str]:
    """QEMU's arguments for ``image``, the binary not included (nor ``-incoming``, ``-S``).

    The RAM is always the memory backend ``mem0``, a file or anonymous: a saved
    migration stream names its RAM block, so a full state saved from the
    file-backed template loads into anonymous RAM only under the same name.
    ``lan``: a second NIC on a private network (a multi-machine scenario's,
    :mod:`runner.backends.lan`); a machine with one is another virtual machine,
    restored from a snapshot of its own (:func:`machine_digest` differs).
    ``disks``: this VM's overlay of each of the image's extra disks, in the image's order,
    attached right after the root disk (the first is the guest's ``/dev/vdb``). A saved
    state holds these drives, so every VM of an image with extra disks must be given all
    of them; an image without them gets exactly the command line it always had.
    """
    if len(disks) != len(image.disks):
        raise VMError(f"image {image.name} has {len(image.disks)} extra disk(s); "
                      f"{len(disks)} overlay(s) given")
    mem = image.memory_mib
    fwd = ",".join(f"hostfwd=tcp:127.0.0.1:{h}-:{g}" for g, h in forwards.items())
    if ram:
        path, shared = ram
        backend = f"memory-backend-file,id=mem0,size={mem}M,mem-path={path},share={'on' if shared else 'off'}"
    else:
        backend = f"memory-backend-ram,id=mem0,size={mem}M"
    return ["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-machine", "q35,memory-backend=mem0", "-m", f"{mem}M", "-smp", "1",
            "-accel", "kvm" if accel == "kvm" else "tcg",
            "-cpu", "host" if accel == "kvm" else "max",
            "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", image.cmdline,
            "-drive", f"file={disk},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
            *(arg for extra in disks
              for arg in ("-drive", f"file={extra},if=virtio,format=qcow2,cache=unsafe,discard=unmap")),
            "-netdev", f"user,id=n0,restrict=on,{fwd}",
            "-device", "virtio-net-pci,netdev=n0",
            *(["-netdev", lan.netdev(), "-device", f"virtio-net-pci,netdev=lan,mac={lan.mac}"]
              if lan else []),
            "-chardev", f"socket,id=ser0,path={console},server=on,wait=off",
            "-serial", "chardev:ser0",
            "-qmp", f"unix:{qmp},server=on,wait=off",
            "-object", backend]


def machine_digest(image: BuiltImage, accel: str, lan: bool = False) -> str:
    """A short hash of the golden boot's command line with the per-VM parts (paths, ports) fixed.

    A saved VM state loads only into the same virtual machine: a changed machine
    type, CPU model, device or memory size must key a new snapshot, not fail
    every restore. The kernel and initrd are the image's (its sha covers them).
    """
    fixed = dataclasses.replace(image, kernel=Path("vmlinuz"), initrd=Path("initrd.img"))
    # The LAN's sockets and MAC differ per machine; its backend is not part of a saved state.
    port = LanPort(Path("lan"), Path("hub"), SNAPSHOT_LAN_MAC) if lan else None
    args = qemu_args(fixed, Path("disk"), accel, (Path("ram"), True), Path("console"), Path("qmp"),
                     dict.fromkeys(FORWARDED_PORTS, 0), port,
                     tuple(Path(f"disk-{d.name}") for d in image.disks))
    return hashlib.sha256("\0".join(args).encode()).hexdigest()[:8]


class Qemu:
    """One QEMU process with a QMP socket and a serial socket in a private 0700 directory."""

    def __init__(self, image: BuiltImage, disk: Path, accel: str, workdir: Path,
                 ram: RamFile | None, incoming: bool, *, paused: bool = False,
                 lan: LanPort | None = None, disks: Sequence[Path] = (),
                 nice: int | None = None) -> None:
        """``ram``: the guest RAM in a file, shared (the golden boot) or copy-on-write (a
        template restore); None for ordinary anonymous RAM. ``incoming``: wait for
        ``migrate-incoming``. ``paused``: do not run the guest (``-S``), not even once an
        incoming migration has loaded it, so its state can be migrated on unchanged.
        ``lan``: the machine's port on its sandbox's private network (None: no second NIC).
        ``disks``: this VM's overlay of each of the image's extra disks, in order.
        ``nice``: how many levels below rootbench QEMU runs (None: :func:`~runner.backends.
        process.guest_nice`, the model first)."""
        self.workdir = workdir
        self.nice = guest_nice() if nice is None else nice
        self.lan = lan
        self.disks = tuple(disks)
        self.accel = accel
        # Unix socket paths are capped at 108 bytes, so sockets live in a short private dir.
        self.sock_dir = socket_dir("rb-")
        try:
            self._launch(image, disk, accel, workdir, ram, incoming, paused)
        except BaseException:
            # Interrupted (Ctrl-C) before QEMU ran: the socket directory must not be left behind.
            shutil.rmtree(self.sock_dir, ignore_errors=True)
            raise
        try:
            self.qmp = self._connect_qmp(10.0)
        except BaseException:
            # QEMU died at start (a KVM that cannot run) or never answered: nothing may leak.
            end_process(self.proc, grace=1)
            self._log.close()
            shutil.rmtree(self.sock_dir, ignore_errors=True)
            raise

    def _launch(self, image: BuiltImage, disk: Path, accel: str, workdir: Path,
                ram: RamFile | None, incoming: bool, paused: bool) -> None:
        """Start QEMU with its sockets in ``self.sock_dir``."""
        os.chmod(self.sock_dir, 0o700)
        self.qmp_path = self.sock_dir / "qmp.sock"
        self.console_path = self.sock_dir / "console.sock"
        self.forwards = dict(zip(FORWARDED_PORTS, free_ports(len(FORWARDED_PORTS)), strict=True))
        self.log_path = workdir / "qemu.log"
        cmd = [qemu_binary(), *qemu_args(image, disk, accel, ram, self.console_path, self.qmp_path,
                                         self.forwards, self.lan, self.disks)]
        if incoming:
            cmd += ["-incoming", "defer"]
        if paused:
            cmd += ["-S"]
        self.argv = cmd
        self.started = time.monotonic()
        self._log = self.log_path.open("wb")
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT,
                                         preexec_fn=lowered(self.nice))
        except BaseException:
            self._log.close()
            raise
        # Popen returns once QEMU was exec'd, so the preexec's nice is in place. What is
        # recorded is the gap to rootbench as it came out: a rootbench already run at nice 19
        # cannot put QEMU lower by nice (then 0, and the model is not first).
        with contextlib.suppress(OSError):
            self.nice = (os.getpriority(os.PRIO_PROCESS, self.proc.pid)
                         - os.getpriority(os.PRIO_PROCESS, 0))

    def _connect_qmp(self, timeout: float) -> QEMUMonitorProtocol:
        """QMP, connected and negotiated, once QEMU has made its socket (it may die first)."""
        deadline = time.monotonic() + timeout

        def connected() -> QEMUMonitorProtocol | None:
            if self.proc.poll() is not None:
                why = f"QEMU exited at start (code {self.proc.returncode}): {self.log_tail()}"
                if self.accel == "kvm":
                    raise KvmUnusable(why)
                raise VMError(why)
            if not self.qmp_path.exists():
                return None
            qmp = QEMUMonitorProtocol(str(self.qmp_path))
            try:
                # The legacy wrapper's connect() has no timeout, and a QEMU stuck before its
                # main loop accepts the connection but never greets: bound the handshake
                # with the wrapper's own runner, the one connect() uses.
                qmp._sync(qmp._qmp.connect(str(self.qmp_path)),
                          max(0.1, deadline - time.monotonic()))
                qmp.settimeout(30)
                return qmp
            except Exception:  # noqa: BLE001 - the library raises its own types, timeouts included
                with contextlib.suppress(Exception):
                    qmp.close()
                return None

        return wait_until(connected, timeout, "QEMU's QMP socket", interval=0.01, error=VMError,
                          message=lambda: f"QEMU's QMP socket did not answer within {timeout:.0f}s")

    def migration_event(self, wait: float) -> str | None:
        """The status in the next QMP event if it is MIGRATION; None if another or none in ``wait`` s.

        QEMU announces each migration state change (either direction) when the
        ``events`` capability is on, so a wait for "completed" needs no polling.
        A QEMU that exited sends nothing more: that raises instead.
        """
        if self.proc.poll() is not None:
            raise VMError(f"QEMU exited (code {self.proc.returncode}): {self.log_tail()}")
        try:
            event = self.qmp.pull_event(wait=float(max(wait, 0.001)))  # an int would wait forever
        except asyncio.TimeoutError:
            return None
        if event and event.get("event") == "MIGRATION":
            return str((event.get("data") or {}).get("status"))
        return None

    def wait_migration(self, timeout: float, what: str) -> None:
        """Wait for the migration under way, either direction, to complete; VMError saying why not.

        Needs the ``events`` capability (set before the migration starts): each
        state change is then an event, read as it comes instead of polled. A
        failed incoming migration ends QEMU, so its reason is in QEMU's log.
        """
        deadline = time.monotonic() + timeout

        def why(status: str) -> str:
            desc = ""
            if self.proc.poll() is None:  # a QEMU that exited answers no query
                with contextlib.suppress(VMError):
                    desc = str((self.cmd("query-migrate") or {}).get("error-desc") or "")
            return f"{what} did not complete ({status}): {desc or self.log_tail()}"

        def completed() -> bool:
            try:
                status = self.migration_event(min(0.5, max(0.01, deadline - time.monotonic())))
            except VMError:
                raise VMError(why("QEMU exited")) from None
            if status in ("failed", "cancelled"):
                raise VMError(why(f"migration {status}"))
            return status == "completed"

        wait_until(completed, timeout, what, interval=0, error=VMError,
                   message=lambda: why(f"status {self.status()} after {timeout:.0f}s"))

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

    # What a guest may do to the machine (framing.Power): reboot it for a judge's re-check.
    def allow_reboot(self, on: bool) -> None:
        """A guest reboot resets the VM (``on``), or ends QEMU as ``-no-reboot`` says (off).

        Every QEMU runs with ``-no-reboot`` (an agent's ``reboot`` ends the run
        as a server that went down, and the golden snapshot's command line
        keys it), so a reboot the judge asks for is allowed for its duration
        only, through QMP ``set-action``. Events pending before it are dropped:
        the reset to wait for comes after.
        """
        self.cmd("set-action", reboot="reset" if on else "shutdown")
        if on:
            self.qmp.clear_events()

    def wait_reset(self, timeout: float) -> bool:
        """Whether the guest reset itself (QMP ``RESET``) within ``timeout`` seconds; False if
        QEMU exited instead."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self.proc.poll() is not None:
                return False
            try:
                event = self.qmp.pull_event(wait=float(max(min(left, 1.0), 0.001)))
            except asyncio.TimeoutError:
                continue
            if event and event.get("event") == "RESET":
                return True
        return False

    def reset(self) -> None:
        """Reset the VM at once, as the power button's hard twin: nothing is shut down first."""
        self.cmd("system_reset")

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


def make_overlay(backing: Path, path: Path) -> None:
    r = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing), "-F", "qcow2",
                        str(path)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise VMError(f"qemu-img create failed: {r.stderr.strip()[:200]}")
