"""A KVM that never gives a shell is judged unusable, so the sandbox falls back to TCG.

Measured on this project's hosts on 2026-12-07: a nested, paravirtual KVM can leave a stock
kernel running with no console output at all, instead of stopping it with an internal error.
The console here is a real listening socket that accepts and never speaks, as such a guest's.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from runner.backends import snapshot
from runner.backends.qemu import KvmUnusable
from runner.core.errors import VMError


class _SilentVM:
    """What wait_for_shell reads of a Qemu: its accelerator, console socket and status."""

    def __init__(self, console: Path, accel: str) -> None:
        self.accel, self.console_path = accel, console
        self.forwards: dict[int, int] = {}

    def status(self) -> str:
        return "running"

    def log_tail(self) -> str:
        return ""


@pytest.fixture
def silent_console(tmp_path: Path):  # type: ignore[no-untyped-def]  # a generator fixture
    path = tmp_path / "console.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield path
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    server.close()


def test_a_silent_kvm_boot_is_kvm_unusable_after_its_own_limit(
        silent_console: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot, "KVM_BOOT_TIMEOUT", 1.0)
    with pytest.raises(KvmUnusable, match="no root shell under KVM within 1 s"):
        snapshot.wait_for_shell(_SilentVM(silent_console, "kvm"), 240)  # type: ignore[arg-type]


def test_a_silent_tcg_boot_is_only_a_vm_error(silent_console: Path) -> None:
    with pytest.raises(VMError) as caught:
        snapshot.wait_for_shell(_SilentVM(silent_console, "tcg"), 1.0)  # type: ignore[arg-type]
    assert not isinstance(caught.value, KvmUnusable)
    assert "no root shell on the serial console within 1s" in str(caught.value)
