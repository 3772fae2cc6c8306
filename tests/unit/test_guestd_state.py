"""The guest helper's ``state`` question, run here on a folder that plays the guest's root.

The helper (:mod:`runner.backends.guestd`) is started as the guests start it,
its text on stdin, with its root pointed at a temp tree: the file-based
categories (runtime units, setid and world-writable files, sudoers, PAM,
pg_hba, sshd, package files) read that tree; the kernel's categories
(mounts, listening sockets, processes) read this host's /proc. The same
question on a real VM is in ``tests/vm/test_statediff_vm.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.backends.framing import helper_command, helper_source, parse_frame, ping, request_text
from runner.core.guest import CommandResult


class Helper:
    """The guest helper started here, its root the given tree (as in test_framing's LocalHelper)."""

    def __init__(self, rb: Path, root: Path) -> None:
        bootstrap = helper_command().split("-c ", 1)[1].strip("'")
        self.proc = subprocess.Popen(["python3", "-I", "-S", "-c", bootstrap, str(rb), str(root)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.stdin.write(helper_source() + ping("ready").encode())
        self.stdin.flush()
        assert self.stdout.readline() == b"RBSYNCready\n"
        self.n = 0

    def _ask(self, text: str, mode: str | None, clean: bool = False) -> CommandResult:
        self.n += 1
        sentinel = f"s{self.n}"
        self.stdin.write(request_text(text, 30, 1 << 18, sentinel, clean, mode).encode())
        self.stdin.flush()
        r = parse_frame(self.stdout.readline(), sentinel, 0.0, 1 << 18)
        assert r is not None
        return r

    def state(self) -> dict[str, Any]:
        r = self._ask('{"ask": "state"}', "i", clean=True)
        assert r.exit_code == 0, r.output
        answer = json.loads(r.output)
        assert isinstance(answer, dict)
        return answer

    def run(self, command: str) -> str:
        return self._ask(command, None).output

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=10)


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()  # dpkg's md5sums are md5


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A guest's root with a package manifest and the configuration files the question reads."""
    root = tmp_path / "root"
    files = {"usr/bin/tool": "the tool v1", "etc/tool/defaults": "x=1\n", "usr/lib/systemd/system/tool.service":
             "[Service]\n", "usr/share/doc/tool/README": "read me\n"}
    for rel, text in files.items():
        _write(root, rel, text)
    _write(root, "var/lib/dpkg/info/tool.md5sums", "".join(f"{_md5(t)}  {r}\n" for r, t in files.items()))
    _write(root, "etc/sudoers", "# comment\nDefaults env_reset\nroot ALL=(ALL:ALL) ALL\n"
                                "#includedir /etc/sudoers.d\n@include extra\n", 0o440)
    _write(root, "etc/extra", "Cmnd_Alias WEB = /usr/bin/systemctl reload nginx, \\\n  /usr/bin/systemctl status nginx\n")
    _write(root, "etc/pam.d/common-auth", "auth [success=1 default=ignore] pam_unix.so nullok\n"
                                          "auth requisite pam_deny.so\nauth required pam_permit.so\n# pam_permit.so\n")
    _write(root, "etc/pam.d/login", "@include common-auth\nsession optional pam_motd.so\n")
    _write(root, "etc/postgresql/15/main/pg_hba.conf",
           "# TYPE DATABASE USER ADDRESS METHOD\nlocal all postgres peer\n"
           "host all all 127.0.0.1/32 scram-sha-256\nhost all all 10.0.2.0 255.255.255.0 md5  # the office\n")
    _write(root, "etc/ssh/sshd_config", "# defaults\nInclude /etc/ssh/sshd_config.d/*.conf\nUsePAM   yes\n")
    _write(root, "etc/ssh/sshd_config.d/a.conf", "PermitRootLogin prohibit-password\n")
    _write(root, "etc/ssh/sshd_config.d/notes.txt", "PermitRootLogin yes\n")  # not a .conf: sshd skips it
    _write(root, "usr/bin/passwd", "a setuid program", 0o4755)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)  # sticky: not world-writable in the question's sense (and not walked)
    (root / "srv/share").mkdir(parents=True)
    (root / "srv/share").chmod(0o1777)
    _write(root, "run/systemd/system/nginx.service.d/x.conf", "[Service]\n")
    (root / "run/systemd/transient").mkdir(parents=True)
    return root


@pytest.fixture
def helper(tree: Path, tmp_path: Path) -> Iterator[Helper]:
    h = Helper(tmp_path / "rb", tree)
    yield h
    h.close()


def test_the_file_categories_read_the_tree(helper: Helper, tree: Path) -> None:
    s = helper.state()
    assert s["runtime_units"] == ["system/nginx.service.d/x.conf"]
    assert s["setid"] == ["4755 /usr/bin/passwd"] and s["world_writable"] == []
    assert s["sudoers"] == [
        "/etc/extra: Cmnd_Alias WEB = /usr/bin/systemctl reload nginx, /usr/bin/systemctl status nginx",
        "/etc/sudoers: #includedir /etc/sudoers.d", "/etc/sudoers: @include extra",
        "/etc/sudoers: Defaults env_reset", "/etc/sudoers: root ALL=(ALL:ALL) ALL"]
    assert s["pam"] == ["/etc/pam.d/common-auth: auth [success=1 default=ignore] pam_unix.so nullok",
                        "/etc/pam.d/common-auth: auth required pam_permit.so"]
    hba = "/etc/postgresql/15/main/pg_hba.conf"
    assert s["pg_hba"] == [f"{hba}: host all all 10.0.2.0/255.255.255.0 md5",
                           f"{hba}: host all all 127.0.0.1/32 scram-sha-256", f"{hba}: local all postgres - peer"]
    assert s["sshd"] == ["/etc/ssh/sshd_config.d/a.conf: PermitRootLogin prohibit-password",
                         "/etc/ssh/sshd_config: Include /etc/ssh/sshd_config.d/*.conf",
                         "/etc/ssh/sshd_config: UsePAM yes"]
    assert s["package_files"] == []
    assert set(s["sources"]) == {k for k, v in s.items() if isinstance(v, list)}


def test_what_root_changes_in_the_tree_shows(helper: Helper, tree: Path) -> None:
    _write(tree, "run/systemd/transient/run-u9.service", "[Service]\n")
    (tree / "run/systemd/system/timers.target.wants").mkdir()
    (tree / "run/systemd/system/timers.target.wants/x.timer").symlink_to("/etc/systemd/system/x.timer")
    _write(tree, "usr/local/bin/find", "a copy of find", 0o4755)
    (tree / "etc/tool/defaults").chmod(0o666)
    (tree / "srv/share").chmod(0o777)  # the sticky bit gone: anyone may now delete anyone's files
    (tree / "usr/bin/ln-to-passwd").symlink_to("passwd")  # a link's own mode means nothing
    _write(tree, "etc/sudoers.d/bob", "bob ALL=(ALL) NOPASSWD: /usr/bin/find\n", 0o440)
    _write(tree, "etc/sudoers.d/carol.conf", "carol ALL=(ALL) ALL\n", 0o440)  # sudo skips a name with a dot
    _write(tree, "etc/pam.d/sshd", "auth sufficient pam_permit.so\n")
    _write(tree, "etc/ssh/sshd_config.d/b.conf", "PasswordAuthentication yes\n")
    s = helper.state()
    assert s["runtime_units"] == ["system/nginx.service.d/x.conf",
                                  "system/timers.target.wants/x.timer -> /etc/systemd/system/x.timer",
                                  "transient/run-u9.service"]
    assert s["setid"] == ["4755 /usr/bin/passwd", "4755 /usr/local/bin/find"]
    assert s["world_writable"] == ["0666 /etc/tool/defaults", "0777 /srv/share"]
    assert "/etc/sudoers.d/bob: bob ALL=(ALL) NOPASSWD: /usr/bin/find" in s["sudoers"]
    assert "/etc/sudoers.d/carol.conf (ignored by sudo): carol ALL=(ALL) ALL" in s["sudoers"]
    assert "/etc/pam.d/sshd: auth sufficient pam_permit.so" in s["pam"]
    assert "/etc/ssh/sshd_config.d/b.conf: PasswordAuthentication yes" in s["sshd"]


def test_package_files_are_judged_against_the_manifest_read_at_start(helper: Helper, tree: Path) -> None:
    """dpkg's md5sums as the helper read them when it started: rewriting them later hides nothing."""
    (tree / "usr/bin/tool").write_text("the tool, rewritten")
    (tree / "usr/lib/systemd/system/tool.service").unlink()
    (tree / "etc/tool/defaults").write_text("x=1\n")  # written again, the same bytes: unchanged
    (tree / "usr/share/doc/tool/README").write_text("outside the folders the question covers")
    md5sums = tree / "var/lib/dpkg/info/tool.md5sums"
    md5sums.write_text(md5sums.read_text().replace(_md5("the tool v1"), _md5("the tool, rewritten")))
    assert helper.state()["package_files"] == ["/usr/bin/tool", "/usr/lib/systemd/system/tool.service (missing)"]
    (tree / "usr/bin/tool").write_text("the tool v1")  # put back: matches again
    assert helper.state()["package_files"] == ["/usr/lib/systemd/system/tool.service (missing)"]


def test_data_trees_are_walked_for_new_files_only(helper: Helper, tree: Path) -> None:
    """Below /usr/share/doc (man, locale) only a folder that changed since the helper started
    has its files looked at: a new setid program there is seen, a data file made writable
    that was there at start is not (the walk's cost is mostly those trees)."""
    (tree / "usr/share/doc/tool/README").chmod(0o666)
    assert helper.state()["world_writable"] == []
    _write(tree, "usr/share/doc/tool/sh", "a copy of a shell", 0o4755)
    s = helper.state()
    assert s["setid"] == ["4755 /usr/bin/passwd", "4755 /usr/share/doc/tool/sh"]
    assert s["world_writable"] == ["0666 /usr/share/doc/tool/README"]  # its folder changed: all looked at
    (tree / "usr/share/doc/new").mkdir(mode=0o777)
    (tree / "usr/share/doc/new").chmod(0o777)
    assert "0777 /usr/share/doc/new" in helper.state()["world_writable"]


def test_a_long_category_is_cut_and_says_so(helper: Helper, tree: Path) -> None:
    for i in range(450):
        _write(tree, f"opt/many/f{i:03}", "", 0o2755)
    s = helper.state()
    assert len(s["setid"]) == 400 and s["setid_truncated"] is True
    assert "world_writable_truncated" not in s


def test_processes_and_sockets_come_from_the_kernel(helper: Helper) -> None:
    """A background process the agent's shell left is there, with its start time; the helper,
    its zygotes and its ancestors are not. A socket this test listens on is there, with its owner."""
    pid = int(helper.run("sleep 300 >/dev/null 2>&1 & echo $!").strip())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        for _ in range(50):  # the shell forks the sleep; its exe is bash's until it execs
            s = helper.state()
            mine = [f for f in s["processes"] if f.startswith(f"{pid} ")]
            if mine and "sleep" in mine[0]:
                break
            time.sleep(0.1)
    os.kill(pid, 9)
    start = Path(f"/proc/{helper.proc.pid}/stat").read_text().rpartition(")")[2].split()[19]
    assert mine and mine[0].split()[2].endswith("/sleep"), s["processes"]
    assert int(mine[0].split()[1]) > int(start)
    zygotes = {p for p in os.listdir("/proc") if p.isdigit()
               and _ppid(p) == helper.proc.pid}
    assert zygotes, "the helper has its zygotes"
    shown = {f.split()[0] for f in s["processes"]}
    assert not shown & (zygotes | {str(helper.proc.pid), str(os.getpid())})
    assert f"tcp 127.0.0.1:{port} {os.path.realpath('/proc/self/exe')} " in " ".join(
        f + " " for f in s["listening"]), s["listening"]
    assert any(f.startswith("/proc / proc ") for f in s["mounts"]), s["mounts"]


def _ppid(pid: str) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except OSError:
        return None
