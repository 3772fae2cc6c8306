"""The serial-console guest: the root shell the image keeps on ttyS0, over a unix socket.

The shell only starts the guest helper (:mod:`runner.backends.guestd`),
which then owns the console and runs every command. The helper is started
once per golden boot and lives on in every restored VM; if an agent kills
it, the console service starts a new shell, and the next sync starts a new
helper from the host's copy.
"""

from __future__ import annotations

import re
import socket
import time

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
from runner.backends.images import GUEST_HOSTNAME
from runner.core.errors import GuestDown
from runner.core.guest import Guest
from runner.core.waiting import wait_until

# A fresh interactive shell prompting (bracketed paste on, then bash's default prompt).
_NEW_SHELL = re.compile(rb"\x1b\[\?2004hroot@" + re.escape(GUEST_HOSTNAME.encode()) + rb":~# ")
_SETUP = ("stty -echo -onlcr 2>/dev/null; set +o emacs +o vi; PS1=''; PS2=''; unset PROMPT_COMMAND; "
          "export HISTFILE=/dev/null TERM=dumb; mkdir -p /run/rb")

# python3 starting on a busy TCG guest: seconds, not minutes; at least this long, and as long as
# the caller's own deadline leaves (a reboot re-check's is minutes).
HELPER_START_TIMEOUT = 60.0


class SerialGuest(FramedGuest, Guest):
    """The root shell the image's console service keeps on the serial port, running the guest helper."""

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
        self._child: pexpect.fdpexpect.fdspawn[bytes] = pexpect.fdpexpect.fdspawn(
            sock.fileno(), timeout=30, maxread=1 << 16)  # no encoding: bytes in and out
        self._child.delaybeforesend = None

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
        match = self._child.match
        assert isinstance(match, re.Match)  # pexpect's match is the Match of the pattern seen
        return i, match

    def _drain(self) -> None:
        try:
            while True:
                self._child.read_nonblocking(1 << 16, timeout=0)
        except (pexpect.TIMEOUT, pexpect.EOF, OSError):
            pass

    def wait_for_login(self, timeout: float) -> None:
        """After a cold boot: wait for the console shell's prompt, then make it quiet and start
        the helper, within ``timeout`` in all (a boot's tail can keep a slow guest busy)."""
        deadline = time.monotonic() + timeout
        if self._expect([re.compile(rb"root@[^\r\n]*# ?")], timeout) is None:
            raise GuestDown(f"no root prompt on the serial console within {timeout:.0f}s")
        self._send(_SETUP + "\n")
        self.sync(max(20.0, deadline - time.monotonic()))

    def sync(self, timeout: float, *, idle: bool = False, set_clock: bool = False) -> None:
        """Prove the helper answers (and skip whatever was printed before); start it if need be.

        Each try sends a ping the helper answers, then a shell line the helper
        ignores (it does not start with ``#RB``) but a bare console shell runs
        and answers differently: so one try finds out which of the two is
        listening, and a shell is told to start the helper. If the console shell
        was replaced (an agent can kill it), the quieting line put it right first.
        ``idle`` says the helper is known to be waiting for a line (just restored
        from the snapshot): the first try then sends no ^C, whose flush of the
        tty's input can eat the line after it while the guest is still waking.
        ``set_clock`` sets the guest's clock to the host's in the same try (a
        restored guest wakes with the time its snapshot was taken).
        """
        deadline = time.monotonic() + timeout
        wait = 1.0  # then 2, 4, 5 s: a slow answer to an earlier try still counts
        tokens: list[str] = []
        while True:
            tokens.append(new_sentinel())
            # ^C flushes the tty's pending input, and with it whatever arrived in the
            # same burst: it goes alone, and the rest a moment later.
            if not (idle and len(tokens) == 1):
                self._send("\x03")
                time.sleep(0.05)
            now = time.time()
            lines = f"{clock_line(now) if set_clock else ''}{ping(tokens[-1])}"
            if not (idle and len(tokens) == 1):
                # Every byte costs the guest an emulated UART access: a restored helper is
                # asked alone first, and the shell's line follows only if it did not answer.
                shell_clock = f"date -s @{now:.3f} >/dev/null 2>&1; " if set_clock else ""
                lines = f"\n{lines}{_SETUP}; {shell_clock}printf '%s%s\\n' RBSH {tokens[-1]}\n"
            self._send(lines)
            step = min(wait, max(deadline - time.monotonic(), 0.1))
            wait = min(wait * 2, 5.0)
            seen = self._expect([sync_re(tokens), sync_re(tokens, b"RBSH")], step)
            if seen is not None:
                if seen[0] == 1:
                    # The caller's deadline, not a fixed minute: after a reboot the guest
                    # is still finishing its boot, and a starved one (a busy host, QEMU
                    # niced below a model that computes) starts python3 slowly.
                    self._start_helper(max(HELPER_START_TIMEOUT, deadline - time.monotonic()))
                self._drain()
                return
            if time.monotonic() >= deadline:
                raise GuestDown(f"the serial shell did not answer within {timeout:.0f}s")

    def _start_helper(self, timeout: float = HELPER_START_TIMEOUT) -> None:
        """The console shell answered, so no helper runs: replace the shell by one."""
        token = new_sentinel()
        self._send(helper_command() + "\n")
        self._send(helper_source().decode())
        self._send(ping(token))
        if self._expect([sync_re([token])], timeout) is None:
            raise GuestDown(f"the guest's command helper did not start within {timeout:.0f}s")

    def _await(self, pattern: re.Pattern[bytes], timeout: float) -> re.Match[bytes] | None:
        seen = self._expect([pattern, _NEW_SHELL], timeout)
        if seen is not None and seen[0] == 1:
            # The console service started a new shell: the helper this command went to is gone.
            self.sync(30)
            raise HelperRestarted()
        return None if seen is None else seen[1]

    def _recover(self) -> None:
        try:
            self.sync(10)
        except GuestDown:
            self._dead = "the serial shell stopped answering"
            raise

    def _come_back(self, deadline: float) -> None:
        """After a reset: the console service's new shell, quieted, running a fresh helper, and
        the clock set (a reset guest reads the time from the RTC QEMU restored with it)."""
        self._drain()  # whatever the old boot said on its way down
        self.wait_for_login(max(deadline - time.monotonic(), 0.1))
        self.sync(max(min(20.0, deadline - time.monotonic()), 1.0), set_clock=True)

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


