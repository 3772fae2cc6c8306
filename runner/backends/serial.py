"""The serial-console guest: the root shell the image keeps on ttyS0, over a unix socket."""

from __future__ import annotations

import re
import socket
import time

import pexpect
import pexpect.fdpexpect

from runner.backends.framing import (
    SLACK,
    FramedGuest,
    frame_re,
    framed_lines,
    new_sentinel,
    output_cap,
    parse_frame,
)
from runner.backends.images import GUEST_HOSTNAME
from runner.core.errors import GuestDown
from runner.core.guest import CommandResult, Guest
from runner.core.waiting import wait_until

# A fresh interactive shell prompting (bracketed paste on, then bash's default prompt).
_NEW_SHELL = re.compile(rb"\x1b\[\?2004hroot@" + re.escape(GUEST_HOSTNAME.encode()) + rb":~# ")
_SETUP = ("stty -echo -onlcr 2>/dev/null; set +o emacs +o vi; PS1=''; PS2=''; unset PROMPT_COMMAND; "
          "export HISTFILE=/dev/null TERM=dumb; mkdir -p /run/rb")

class SerialGuest(FramedGuest, Guest):
    """The root shell the image's console service keeps on the serial port (a unix socket)."""

    def __init__(self, socket_path: str, forwards: dict[int, int], connect_timeout: float = 10.0) -> None:
        super().__init__(forwards)
        deadline = time.monotonic() + connect_timeout

        def connected() -> socket.socket | None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                # A full listen backlog would block connect(): bounded by the time left.
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                sock.connect(socket_path)
                sock.settimeout(None)  # pexpect reads and writes the descriptor blocking
                return sock
            except OSError:
                sock.close()
                return None

        sock = wait_until(connected, connect_timeout, "the serial console", interval=0.02,
                          error=GuestDown,
                          message=lambda: f"cannot connect to the serial console {socket_path}")
        self._sock = sock
        self._child = pexpect.fdpexpect.fdspawn(sock.fileno(), timeout=30, maxread=1 << 16)
        self._child.delaybeforesend = None
        self._dead: str | None = None

    def _send(self, text: str) -> None:
        try:
            self._child.send(text.encode())
        except OSError as exc:
            self._dead = f"the serial console closed ({exc.strerror})"
            raise GuestDown(self._dead) from None

    def _expect(self, patterns: list[re.Pattern[bytes]], timeout: float) -> tuple[int, re.Match[bytes]] | None:
        """(index, match) of the first pattern seen, None at the timeout; GuestDown at EOF."""
        try:
            i = self._child.expect([*patterns, pexpect.EOF, pexpect.TIMEOUT], timeout=timeout)
        except OSError as exc:
            self._dead = f"the serial console failed ({exc.strerror})"
            raise GuestDown(self._dead) from None
        if i == len(patterns):
            self._dead = "the serial console closed: the VM is gone"
            raise GuestDown(self._dead)
        if i == len(patterns) + 1:
            return None
        return i, self._child.match

    def _drain(self) -> None:
        try:
            while True:
                self._child.read_nonblocking(1 << 16, timeout=0)
        except (pexpect.TIMEOUT, pexpect.EOF, OSError):
            pass

    def wait_for_login(self, timeout: float) -> None:
        """After a cold boot: wait for the console shell's prompt, then make it quiet."""
        if self._expect([re.compile(rb"root@[^\r\n]*# ?")], timeout) is None:
            raise GuestDown(f"no root prompt on the serial console within {timeout:.0f}s")
        self._send(_SETUP + "\n")
        self.sync(20)

    def sync(self, timeout: float, *, idle: bool = False, set_clock: bool = False) -> None:
        """Prove the shell answers (and skip whatever was printed before).

        If the console shell died (an agent can kill it), systemd starts a
        new one; the quieting line sent first puts it right before it is trusted.
        ``idle`` says the shell is known to be waiting for a line (just restored
        from the snapshot): the first try then sends no ^C, whose flush of the
        tty's input can eat the line after it while the guest is still waking.
        ``set_clock`` sets the guest's clock to the host's in the same line (a
        restored guest wakes with the time its snapshot was taken).
        """
        deadline = time.monotonic() + timeout
        wait = 1.0  # then 2, 4, 5 s: a slow answer to an earlier try still counts
        tokens: list[bytes] = []
        while True:
            tokens.append(new_sentinel().encode())
            # ^C flushes the tty's pending input, and with it whatever arrived in the
            # same burst: it goes alone, and the rest a moment later. The quieting
            # line is idempotent, so it goes first every time: a shell that was
            # replaced (or never set up) is put right before it is trusted.
            if not (idle and len(tokens) == 1):
                self._send("\x03")
                time.sleep(0.05)
            clock = f"date -s @{time.time():.3f} >/dev/null 2>&1; " if set_clock else ""
            self._send(f"\n{_SETUP}\n{clock}printf '%s%s\\n' RBSYNC {tokens[-1].decode()}\n")
            step = min(wait, max(deadline - time.monotonic(), 0.1))
            wait = min(wait * 2, 5.0)
            if self._expect([re.compile(rb"RBSYNC(?:" + b"|".join(tokens) + rb")")], step) is not None:
                self._drain()
                return
            if time.monotonic() >= deadline:
                raise GuestDown(f"the serial shell did not answer within {timeout:.0f}s")

    def _run(self, command: str, timeout: float, output_limit: int | None, clean: bool) -> CommandResult:
        if self._dead:
            raise GuestDown(self._dead)
        sentinel = new_sentinel()
        cap = output_cap(output_limit)
        t0 = time.monotonic()
        for line in framed_lines(command, timeout, cap, sentinel, clean):
            self._send(line + "\n")
        seen = self._expect([frame_re(sentinel), _NEW_SHELL], timeout + SLACK)
        if seen is not None and seen[0] == 1:
            # The console service started a new shell: the one this command went to is gone.
            self.sync(30)
            return CommandResult(None, "[the console shell was restarted; the command may not have run]",
                                 time.monotonic() - t0, timed_out=False)
        if seen is None:
            # The wrapper's own timeout should have fired; the shell is wedged. Try to recover.
            try:
                self.sync(10)
            except GuestDown:
                self._dead = "the serial shell stopped answering"
                raise
            return CommandResult(None, "", time.monotonic() - t0, timed_out=True)
        result = parse_frame(seen[1].group(0), sentinel, time.monotonic() - t0, cap)
        assert result is not None
        return result

    def alive(self) -> bool:
        if self._dead:
            return False
        try:
            self.sync(15)
            return not self._shutting_down()
        except GuestDown:
            return False

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


