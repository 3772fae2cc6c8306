"""The SSH guest: the system ``ssh`` client, multiplexed over one master connection per VM.

One long-lived SSH session runs the guest helper (:mod:`runner.backends.guestd`)
with its stdin and stdout as the channel, so a command costs no new SSH
session, only the helper's one fork in the guest.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from pathlib import Path

import pexpect
import pexpect.fdpexpect

from runner.backends.framing import (
    FramedGuest,
    HelperRestarted,
    clock_line,
    helper_command,
    helper_source,
    new_sentinel,
    ping,
    sync_re,
)
from runner.backends.process import die_with_parent, end_process, last_line
from runner.core.errors import GuestDown
from runner.core.guest import Guest
from runner.core.waiting import wait_until

HELPER_START_TIMEOUT = 60.0  # ssh session plus python3 starting on a busy TCG guest


class SshGuest(FramedGuest, Guest):
    """The system ``ssh`` client, multiplexed over one master connection per VM."""

    def __init__(self, port: int, key: str, workdir: str, forwards: dict[int, int],
                 connect_timeout: float = 60.0) -> None:
        super().__init__(forwards)
        common = [
            "-q", "-p", str(port), "-i", key, "-F", "/dev/null",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={workdir}/known_hosts", "-o", "StrictHostKeyChecking=accept-new",
            "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-o", f"ControlPath={workdir}/ssh.ctl", "-o", "LogLevel=ERROR",
        ]
        self._ctl = ["ssh", *common]
        self._base = ["ssh", *common, "-o", "ControlMaster=no", "root@127.0.0.1"]
        self._helper: tuple[subprocess.Popen[bytes], pexpect.fdpexpect.fdspawn[bytes]] | None = None
        self._helper_log = Path(workdir) / "ssh-helper.log"
        self._master_log = Path(workdir) / "ssh-master.log"
        self._control = Path(workdir) / "ssh.ctl"
        self._connect(connect_timeout)
        self._start_helper()

    def _connect(self, connect_timeout: float) -> None:
        """The master connection, up within ``connect_timeout`` seconds (GuestDown if not)."""
        log = self._master_log
        deadline = time.monotonic() + connect_timeout

        def master_up() -> bool:
            # The master goes to the background once authenticated (-f); its stdio is a
            # file, never a pipe of ours, or waiting on it would hang. One try may take
            # up to 20 s (a guest still waking), but never past the deadline.
            try:
                with log.open("ab") as err:
                    r = subprocess.run([*self._ctl, "-o", "ControlMaster=yes",
                                        "-o", "ControlPersist=yes", "-f", "-N", "root@127.0.0.1"],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=err, timeout=max(0.5, min(20.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                return False
            return r.returncode == 0

        def why() -> str:
            tail = last_line(log)[-200:]
            return f"ssh to the guest failed: {tail or 'no answer'}"

        wait_until(master_up, connect_timeout, "ssh to the guest", interval=0.3, error=GuestDown,
                   message=why)

    def _start_helper(self) -> None:
        """A new SSH session running a fresh helper, proven by a ping (GuestDown if it fails)."""
        self._stop_helper()
        with self._helper_log.open("ab") as err:
            proc = subprocess.Popen([*self._base, helper_command()], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, preexec_fn=die_with_parent)
        assert proc.stdin is not None and proc.stdout is not None
        reader: pexpect.fdpexpect.fdspawn[bytes] = pexpect.fdpexpect.fdspawn(
            proc.stdout.fileno(), timeout=30, maxread=1 << 16)  # no encoding: bytes
        self._helper = (proc, reader)
        token = new_sentinel()
        self._send_bytes(helper_source() + ping(token).encode())
        i = reader.expect([sync_re([token]), pexpect.EOF, pexpect.TIMEOUT], timeout=HELPER_START_TIMEOUT)
        if i != 0:
            self._stop_helper()
            self._dead = "the guest's command helper did not start over SSH: " + (
                last_line(self._helper_log)[-160:] or "no answer")
            raise GuestDown(self._dead)

    def _stop_helper(self) -> None:
        """End the helper's session: its input closed (the helper exits), then the process reaped."""
        helper, self._helper = self._helper, None
        if helper is None:
            return
        proc, _reader = helper
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            end_process(proc, grace=2)
        proc.stdout.close()

    def _send_bytes(self, data: bytes) -> None:
        assert self._helper is not None
        try:
            stdin = self._helper[0].stdin
            assert stdin is not None
            stdin.write(data)
            stdin.flush()
        except (OSError, ValueError):
            pass  # the session is gone: _await sees its end and starts a new one

    def _send(self, text: str) -> None:
        if self._helper is None:
            self._start_helper()
        self._send_bytes(text.encode())

    def _await(self, pattern: re.Pattern[bytes], timeout: float) -> re.Match[bytes] | None:
        assert self._helper is not None
        reader = self._helper[1]
        try:
            i = reader.expect([pattern, pexpect.EOF, pexpect.TIMEOUT], timeout=timeout)
        except OSError:
            i = 1
        if i == 1:
            # The session or the helper died (an agent can kill either): start another.
            self._start_helper()
            raise HelperRestarted()
        if i != 0:
            return None
        match = reader.match
        assert isinstance(match, re.Match)  # pexpect's match is the Match of the pattern seen
        return match

    def _recover(self) -> None:
        self._start_helper()

    def _come_back(self, deadline: float) -> None:
        """After a reset: the old connection dropped, a new one up once sshd answers, a fresh
        helper on it, and the clock set (a reset guest reads the time from its RTC)."""
        self._stop_helper()
        self._exit_master()
        self._connect(max(deadline - time.monotonic(), 0.1))
        self._start_helper()
        self._send(clock_line(time.time()))

    def _exit_master(self) -> None:
        """Ask the master connection to end, and clear its socket so a new master can bind it."""
        try:
            subprocess.run([*self._ctl, "-O", "exit", "root@127.0.0.1"], capture_output=True,
                           timeout=5, stdin=subprocess.DEVNULL)
        except (subprocess.TimeoutExpired, OSError):
            pass
        with contextlib.suppress(OSError):
            self._control.unlink()

    def alive(self) -> bool:
        if self._dead:
            return False
        try:
            return not self._shutting_down()
        except GuestDown:
            return False

    def close(self) -> None:
        self._stop_helper()
        self._exit_master()
