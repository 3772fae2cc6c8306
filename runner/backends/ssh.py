"""The SSH guest: the system ``ssh`` client, multiplexed over one master connection per VM.

One long-lived SSH session runs the guest helper (:mod:`runner.backends.guestd`)
with its stdin and stdout as the channel, so a command costs no new SSH
session, only the helper's one fork in the guest.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pexpect
import pexpect.popen_spawn

from runner.backends.framing import (
    FramedGuest,
    HelperRestarted,
    helper_command,
    helper_source,
    new_sentinel,
    ping,
    sync_re,
)
from runner.backends.process import die_with_parent, last_line
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
        self._helper: pexpect.popen_spawn.PopenSpawn | None = None
        log = Path(workdir) / "ssh-master.log"
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

        self._start_helper()

    def _start_helper(self) -> None:
        """A new SSH session running a fresh helper, proven by a ping (GuestDown if it fails)."""
        self._stop_helper()
        child = pexpect.popen_spawn.PopenSpawn([*self._base, helper_command()], timeout=30,
                                               maxread=1 << 16, preexec_fn=die_with_parent)
        child.delaybeforesend = None
        self._helper = child
        token = new_sentinel()
        child.send(helper_source() + ping(token).encode())
        i = child.expect([sync_re([token]), pexpect.EOF, pexpect.TIMEOUT], timeout=HELPER_START_TIMEOUT)
        if i != 0:
            self._stop_helper()
            self._dead = "the guest's command helper did not start over SSH"
            raise GuestDown(self._dead)

    def _stop_helper(self) -> None:
        child, self._helper = self._helper, None
        if child is None:
            return
        try:
            child.proc.stdin.close()  # the helper exits at the end of its input
            child.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            child.proc.kill()
            try:
                child.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _send(self, text: str) -> None:
        if self._helper is None:
            self._start_helper()
        assert self._helper is not None
        try:
            self._helper.send(text.encode())
        except OSError:
            pass  # the session is gone: _await sees its end and starts a new one

    def _await(self, pattern: re.Pattern[bytes], timeout: float) -> re.Match[bytes] | None:
        assert self._helper is not None
        i = self._helper.expect([pattern, pexpect.EOF, pexpect.TIMEOUT], timeout=timeout)
        if i == 1:
            # The session or the helper died (an agent can kill either): start another.
            self._start_helper()
            raise HelperRestarted()
        return self._helper.match if i == 0 else None

    def _recover(self) -> None:
        self._start_helper()

    def alive(self) -> bool:
        if self._dead:
            return False
        try:
            return not self._shutting_down()
        except GuestDown:
            return False

    def close(self) -> None:
        self._stop_helper()
        try:
            subprocess.run([*self._ctl, "-O", "exit", "root@127.0.0.1"], capture_output=True,
                            timeout=5, stdin=subprocess.DEVNULL)
        except (subprocess.TimeoutExpired, OSError):
            pass
