"""The guest is hostile: it reaches nothing on the host except through the forwarded ports."""

from __future__ import annotations

import os
import stat

import pytest

from runner.backends.sandbox import Sandbox

pytestmark = pytest.mark.vm


def test_guest_cannot_reach_the_host_loopback(host_server: tuple[int, list[bytes]]) -> None:
    port, seen = host_server
    with Sandbox("debian-12-nginx", accel="auto", transport="ssh") as box:
        # the forwarded SSH port works: the guest itself is this session
        assert box.guest.exec("echo over ssh", 20).output == "over ssh\n"
        r = box.guest.exec(f"curl -sS -m 5 http://10.0.2.2:{port}/; echo rc=$?", 30)
        assert "host secret" not in r.output and "rc=0" not in r.output
        r = box.guest.exec(f"nc -z -w 3 10.0.2.2 {port}; echo rc=$?", 30)
        assert "rc=0" not in r.output
        r = box.guest.exec("nc -z -w 3 10.0.2.2 22; echo rc=$?", 30)
        assert "rc=0" not in r.output
    assert seen == []


def test_private_files_are_private() -> None:
    with Sandbox("debian-12-nginx", accel="auto", transport="ssh") as box:
        assert box.workdir is not None and box.socket_dir is not None
        assert stat.S_IMODE(os.stat(box.workdir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(box.socket_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(box.workdir / "id_ed25519").st_mode) == 0o600
        assert "restrict=on" in " ".join(box.qemu_argv)
        [forwards] = [a for a in box.qemu_argv if "hostfwd" in a]
        assert forwards.count("hostfwd=tcp:127.0.0.1:") == 2
