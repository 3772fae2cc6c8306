"""The sandbox on real QEMU: fast restore, unconditional teardown, a base never written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import assert_base_never_written, qemu_pids

from runner.backends.cachedir import cache_dir
from runner.backends.images import BuiltImage
from runner.backends.sandbox import Sandbox
from runner.core.errors import GuestDown
from runner.core.paths import repo_root

pytestmark = pytest.mark.vm


def test_restore_gives_a_ready_root_shell(image: BuiltImage, no_new_qemu: None) -> None:
    with Sandbox(image.name, accel="auto") as box:
        assert box.info.restored is True
        assert box.info.accel in ("kvm", "tcg")
        r = box.guest.exec("id -u; systemctl is-active nginx", 20)
        assert r.exit_code == 0 and r.output.split() == ["0", "active"]
        # the guest clock was set on restore
        r = box.guest.exec("date +%s", 10)
        assert abs(int(r.output.strip()) - time.time()) < 30
        assert box.guest.host_http(80, "/", 10).status == 200
        # the snapshot was taken after the boot finished: nothing is still starting (a daily
        # timer, such as dpkg-db-backup's, may fire at the clock set on restore: that is not boot)
        r = box.guest.exec("systemctl is-system-running; for u in $(systemctl list-jobs "
                           "--no-legend | awk '{print $2}'); do systemctl show -p TriggeredBy "
                           "--value \"$u\" | grep -q '[.]timer' || echo \"$u\"; done | wc -l", 20)
        assert r.output.split() == ["running", "0"], r.output


# Runs inside a private mount namespace where /dev/kvm is /dev/null: it opens (so rootbench
# believes KVM usable until a start proves otherwise) but QEMU's KVM_GET_API_VERSION ioctl fails
# and QEMU exits at start, on any host. The verdict cache is a bind mount of the test's own
# directory, so the real verdict is neither read nor overwritten by the test.
_FALLBACK_CHILD = textwrap.dedent("""
    import json, logging, sys
    from runner.backends.qemu import kvm_status
    from runner.backends.sandbox import Sandbox

    said = []
    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())
    vm = logging.getLogger("rootbench.vm")
    vm.setLevel(logging.INFO)
    vm.addHandler(Keep())
    before = kvm_status()
    with Sandbox(sys.argv[1], accel="auto") as box:
        r = box.guest.exec("echo answered; id -u", 20)
        out = {"info": box.info.to_dict(), "pid": box.pid, "output": r.output,
               "exit_code": r.exit_code}
    out.update(before=before, after=kvm_status(), said=said)
    print(json.dumps(out), flush=True)
""")


def test_auto_accel_falls_back_when_kvm_is_unusable(image: BuiltImage, tmp_path: Path) -> None:
    if not Path("/dev/kvm").exists():
        pytest.skip("this host has no /dev/kvm to make unusable (auto picks TCG without trying)")
    verdicts = tmp_path / "hostinfo"
    verdicts.mkdir()
    unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--map-root-user", "--mount"]
    probe = subprocess.run([*unshare, "mount", "--bind", "/dev/null", "/dev/kvm"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private mount namespace here: {probe.stderr.strip()[:200]}")
    shell = 'mount --bind /dev/null /dev/kvm && mount --bind "$1" "$2" && shift 2 && exec "$@"'
    scratch = tmp_path / "t"  # the child's sockets and overlays, short enough for a socket path
    scratch.mkdir()
    child = subprocess.run(
        [*unshare, "sh", "-c", shell, "sh", str(verdicts), str(cache_dir("hostinfo")),
         sys.executable, "-c", _FALLBACK_CHILD, image.name],
        capture_output=True, text=True, timeout=900, cwd=repo_root(),
        env={**os.environ, "TMPDIR": str(scratch)})
    assert child.returncode == 0, child.stdout + child.stderr
    out = json.loads(child.stdout.splitlines()[-1])
    # Before the start, KVM looked usable: the fallback below was forced by QEMU, not by the cache.
    assert out["before"] == [True, "/dev/kvm opens (not yet proven by a boot)"]
    assert out["info"]["accel"] == "tcg" and out["info"]["restored"] is True
    assert out["exit_code"] == 0 and out["output"].split() == ["answered", "0"]
    # Said once, in one line, with QEMU's own reason.
    told = [m for m in out["said"] if "KVM" in m]
    assert len(told) == 1, out["said"]
    assert told[0].startswith("KVM unusable (QEMU exited at start") and \
        told[0].endswith("; falling back to TCG"), told[0]
    # The verdict was recorded, under this kernel, and is what rootbench now believes.
    [verdict] = list(verdicts.iterdir())
    assert verdict.name.startswith(f"kvm-{os.uname().release}-") and verdict.suffix == ".json"
    recorded = json.loads(verdict.read_text())
    assert recorded["usable"] is False and recorded["why"].startswith("QEMU exited at start")
    assert out["after"] == [False, recorded["why"]]
    # Nothing left behind: the TCG QEMU is gone and the failed KVM attempt kept no half snapshot.
    assert out["pid"] not in qemu_pids()
    assert not list(cache_dir("snapshots").glob(f"{image.name}-*-kvm-*.partial"))
    # ... and the QEMU that died at start left no socket folder (it used to leak one per try).
    assert not list(scratch.glob("rb-*")), list(scratch.iterdir())


def test_each_run_starts_clean(image: BuiltImage, no_new_qemu: None) -> None:
    with Sandbox(image.name, accel="tcg") as box:
        box.guest.exec("echo dirty > /root/marker; systemctl stop nginx", 30)
    with Sandbox(image.name, accel="tcg") as box:
        r = box.guest.exec("test -e /root/marker; echo $?; systemctl is-active nginx", 20)
        assert r.output.split() == ["1", "active"]


def test_base_image_is_never_written(image: BuiltImage, no_new_qemu: None) -> None:
    assert_base_never_written(image)


def test_cold_boot_works_without_a_snapshot(image: BuiltImage, no_new_qemu: None) -> None:
    with Sandbox(image.name, accel="tcg", snapshot=False) as box:
        assert box.info.restored is False
        assert box.guest.exec("systemctl is-active ssh", 20).output.strip() == "active"


def test_teardown_on_exception_removes_everything(image: BuiltImage, no_new_qemu: None) -> None:
    with pytest.raises(RuntimeError), Sandbox(image.name, accel="tcg") as box:
        pid, workdir, socks = box.pid, box.workdir, box.socket_dir
        assert pid in qemu_pids() and workdir is not None and socks is not None
        assert (workdir / "overlay.qcow2").is_file() and (socks / "qmp.sock").exists()
        raise RuntimeError("boom")
    assert pid not in qemu_pids()
    assert workdir is not None and socks is not None  # as asserted inside the block
    assert not workdir.exists() and not socks.exists()
    assert box.workdir is None and box.socket_dir is None and box.qemu_argv == ()


def test_qemu_killed_from_outside_is_told_apart(image: BuiltImage, no_new_qemu: None) -> None:
    with Sandbox(image.name, accel="tcg") as box:
        box.kill()
        assert not box.vm_alive() and box.killed_externally()
        with pytest.raises(GuestDown):
            box.guest.exec("true", 5)


def test_guest_poweroff_is_not_an_outside_kill(image: BuiltImage, no_new_qemu: None) -> None:
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


def test_no_orphan_qemu_when_rootbench_is_killed(image: BuiltImage, tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import sys, time
        from runner.backends.sandbox import Sandbox
        with Sandbox("debian-12-nginx", accel="tcg") as box:
            print(box.pid, flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    assert pid in qemu_pids()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while pid in qemu_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid not in qemu_pids()  # the one QEMU it started (others on the machine are not ours)
