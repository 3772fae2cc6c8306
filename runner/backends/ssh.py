"""The SSH guest: the system ``ssh`` client, multiplexed over one master connection per VM."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from runner.backends.framing import (
    SLACK,
    FramedGuest,
    framed_lines,
    new_sentinel,
    output_cap,
    parse_frame,
)
from runner.backends.process import last_line
from runner.core.errors import GuestDown
from runner.core.guest import CommandResult, Guest
from runner.core.waiting import wait_until


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
        self._dead: str | None = None
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

    def _run(self, command: str, timeout: float, output_limit: int | None, clean: bool) -> CommandResult:
        if self._dead:
            raise GuestDown(self._dead)
        sentinel = new_sentinel()
        cap = output_cap(output_limit)
        # The script goes on stdin, so the command's text is in no argv (see the framing notes).
        script = "\n".join(framed_lines(command, timeout, cap, sentinel, clean)) + "\n"
        t0 = time.monotonic()
        try:
            r = subprocess.run([*self._base, "bash --noprofile --norc -s"], input=script.encode(),
                               capture_output=True, timeout=timeout + SLACK)
        except subprocess.TimeoutExpired:
            return CommandResult(None, "", time.monotonic() - t0, timed_out=True)
        result = parse_frame(r.stdout, sentinel, time.monotonic() - t0, cap)
        if result is None:
            if r.returncode == 255:
                self._dead = "the SSH connection to the guest broke"
                raise GuestDown(self._dead)
            return CommandResult(r.returncode, r.stdout.decode(errors="replace")[-2000:],
                                 time.monotonic() - t0)
        return result

    def alive(self) -> bool:
        if self._dead:
            return False
        try:
            r = subprocess.run([*self._base, "true"], capture_output=True, timeout=15,
                                stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
        try:
            return r.returncode == 0 and not self._shutting_down()
        except GuestDown:
            return False

    def close(self) -> None:
        try:
            subprocess.run([*self._ctl, "-O", "exit", "root@127.0.0.1"], capture_output=True,
                            timeout=5, stdin=subprocess.DEVNULL)
        except (subprocess.TimeoutExpired, OSError):
            pass
