"""The sandbox on real QEMU: fast restore, unconditional teardown, a base never written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import qemu_pids

from runner.backends.images import base_sha256
from runner.backends.qemu import choose_accel, kvm_status
from runner.backends.sandbox import Sandbox
from runner.core.errors import GuestDown

pytestmark = pytest.mark.vm


def test_restore_gives_a_ready_root_shell(image, no_new_qemu) -> None:  # type: ignore[no-untyped-def]
    with Sandbox(image.name, accel="auto") as box:
        assert box.info.restored is True
        assert box.info.accel in ("kvm", "tcg")
        r = box.guest.exec("id -u; systemctl is-active nginx", 20)
        assert r.exit_code == 0 and r.output.split() == ["0", "active"]
        # the guest clock was set on restore
        r = box.guest.exec("date +%s", 10)
        assert abs(int(r.output.strip()) - time.time()) < 30
        assert box.guest.host_http(80, "/", 10).status == 200
        # the snapshot was taken after the boot finished: nothing is still starting
        r = box.guest.exec("systemctl is-system-running; systemctl list-jobs --no-legend | wc -l", 20)
        assert r.output.split() == ["running", "0"], r.output


def test_auto_accel_falls_back_when_kvm_is_unusable() -> None:
    usable, why = kvm_status()
    chosen = choose_accel("auto")
    assert chosen == ("kvm" if usable else "tcg"), why
    assert choose_accel("tcg") == "tcg"


def test_each_run_starts_clean(image, no_new_qemu) -> None:  # type: ignore[no-untyped-def]
    with Sandbox(image.name, accel="tcg") as box:
        box.guest.exec("echo dirty > /root/marker; systemctl stop nginx", 30)
    with Sandbox(image.name, accel="tcg") as box:
        r = box.guest.exec("test -e /root/marker; echo $?; systemctl is-active nginx", 20)
        assert r.output.split() == ["1", "active"]


def test_base_image_is_never_written(image, no_new_qemu) -> None:  # type: ignore[no-untyped-def]
    before = base_sha256(image)
    assert before == image.sha256
    with Sandbox(image.name, accel="tcg") as box:
        box.guest.exec("dd if=/dev/urandom of=/var/tmp/junk bs=1M count=20 && sync", 60)
    with Sandbox(image.name, accel="tcg", snapshot=False) as box:
        box.guest.exec("rm -rf /usr/share/doc && sync", 60)
    assert base_sha256(image) == before
    assert not os.access(image.base, os.W_OK) or os.stat(image.base).st_mode & 0o222 == 0


def test_cold_boot_works_without_a_snapshot(image, no_new_qemu) -> None:  # type: ignore[no-untyped-def]
    with Sandbox(image.name, accel="tcg", snapshot=False) as box:
        assert box.info.restored is False
        assert box.guest.exec("systemctl is-active ssh", 20).output.strip() == "active"


def test_teardown_on_exception_removes_everything(image, no_new_qemu) -> None:  # type: ignore[no-untyped-def]
    seen: dict[str, object] = {}
    with pytest.raises(RuntimeError), Sandbox(image.name, accel="tcg") as box:
        seen["pid"] = box.pid
        seen["dir"] = box._dir
        seen["socks"] = box._q.sock_dir if box._q else None
        raise RuntimeError("boom")
    assert seen["pid"] not in qemu_pids()
    assert not Path(str(seen["dir"])).exists() and not Path(str(seen["socks"])).exists()


def test_qemu_killed_from_outside_is_told_apart(image, no_new_qemu) -> None:  # type: ignore[no-untyped-def]
    with Sandbox(image.name, accel="tcg") as box:
        box.kill()
        assert not box.vm_alive() and box.killed_externally()
        with pytest.raises(GuestDown):
            box.guest.exec("true", 5)


def test_guest_poweroff_is_not_an_outside_kill(image, no_new_qemu) -> None:  # type: ignore[no-untyped-def]
    with Sandbox(image.name, accel="tcg") as box:
        try:
            box.guest.exec("systemctl poweroff --force --force", 10)
        except GuestDown:
            pass
        deadline = time.monotonic() + 30
        while box.vm_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not box.vm_alive()
        assert not box.killed_externally()
        assert not box.guest.alive()


def test_no_orphan_qemu_when_rootbench_is_killed(image, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = textwrap.dedent("""
        import sys, time
        from runner.backends.sandbox import Sandbox
        with Sandbox("debian-12-nginx", accel="tcg") as box:
            print(box.pid, flush=True)
            time.sleep(600)
    """)
    before = qemu_pids()
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    assert pid in qemu_pids()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while pid in qemu_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid not in qemu_pids()
    assert qemu_pids() <= before
