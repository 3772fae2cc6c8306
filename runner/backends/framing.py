"""Command framing shared by the real guests: any bytes in, any bytes back, never desynchronised.

Both transports (serial console and SSH) drive the same command helper in
the guest (:mod:`runner.backends.guestd`, sent over the channel and started
by python3) with the same request lines, and read the same frame back; only
how the lines travel differs. The helper's docstring describes the protocol
and the guarantees; this module is the host's half of it.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import re
import secrets
import time
from importlib import resources
from typing import Protocol

import urllib3

from runner.core.errors import GuestDown, VMError
from runner.core.guest import CommandResult, HttpResult, RebootResult

B64_CHUNK = 3000  # base64 characters per request line: a terminal line holds at most 4095


@functools.cache
def helper_source() -> bytes:
    """The guest helper's program text, as sent to the guest."""
    return resources.files("runner.backends").joinpath("guestd.py").read_bytes()


def helper_digest() -> str:
    """A short hash of the helper and how it starts: guest state with a running helper is keyed by it."""
    return hashlib.sha256(helper_command().encode() + b"\0" + helper_source()).hexdigest()[:12]


def helper_command() -> str:
    """The shell command that starts the helper; its program text must follow on its stdin.

    Named ``rb-guest`` in argv[0] (and in its comm, which it sets itself), so
    an agent's ``pkill python3`` or ``pkill -f python`` does not cut the channel.
    """
    return ("exec -a rb-guest python3 -I -S -c "
            f"'import sys;exec(sys.stdin.buffer.read({len(helper_source())}))'")


def frame_re(sentinel: str) -> re.Pattern[bytes]:
    s = sentinel.encode()
    return re.compile(rb"RB" + s + rb":([A-Za-z0-9+/=]*):(\d+):([012]):RB" + s)


def sync_re(tokens: list[str], word: bytes = b"RBSYNC") -> re.Pattern[bytes]:
    """The answer to any of the pings ``tokens`` (``RBSYNC`` from the helper)."""
    return re.compile(re.escape(word) + rb"(?:" + b"|".join(t.encode() for t in tokens) + rb")\b")


def ping(token: str) -> str:
    return f"#RBP {token}\n"


def clock_line(epoch: float) -> str:
    return f"#RBT {epoch:.3f}\n"


def request_text(command: str, timeout: float, cap: int, sentinel: str, clean: bool,
                 mode: str | None = None) -> str:
    """The lines that ask the helper to run ``command`` (see :mod:`runner.backends.guestd`).

    ``clean`` runs it the way probes need: fixed environment, no profile, cwd /.
    Otherwise it runs in the agent's working directory, which it then remembers.
    Any bytes travel: the text goes base64-encoded, in lines a terminal accepts.
    ``mode`` ``i`` sends a question the helper answers itself (:meth:`FramedGuest.inspect`).
    """
    t = max(1, int(round(timeout)))
    b64 = base64.b64encode(command.encode("utf-8", errors="surrogateescape")).decode()
    chunks = [b64[i:i + B64_CHUNK] for i in range(0, len(b64), B64_CHUNK)] or [""]
    mode = mode or ("c" if clean else "a")
    lines = [f"#RBQ {sentinel} {mode} {t} {cap} {len(chunks)}"]
    lines += [f"#RBD {c}" for c in chunks]
    return "".join(line + "\n" for line in lines)


def parse_frame(data: bytes, sentinel: str, duration: float, cap: int) -> CommandResult | None:
    """The CommandResult framed in ``data``, or None if the frame is not there (yet).

    The helper sends one byte more than ``cap``: if it is there, the output was cut.
    Its outcome says whether the timeout fired (1) or the status is unknown
    because the command killed its shell (2); only then is there no exit code.
    """
    m = frame_re(sentinel).search(data)
    if not m:
        return None
    blob, rc, outcome = m.group(1), int(m.group(2)), m.group(3)
    timed_out = outcome == b"1"
    try:
        raw = base64.b64decode(blob + b"=" * (-len(blob) % 4))
    except ValueError:
        raw = b""
    output = raw[:cap].decode("utf-8", errors="replace")
    return CommandResult(rc if outcome == b"0" else None, output, duration, timed_out, len(raw) > cap)


def new_sentinel() -> str:
    return secrets.token_hex(8)


def output_cap(output_limit: int | None) -> int:
    """Bytes to fetch from the guest: enough for ``output_limit`` characters of UTF-8."""
    return min(max(output_limit or 16000, 256) * 4, 1 << 20)



SLACK = 20.0  # seconds beyond a command's own timeout before the channel is declared stuck
CLEAN_SHUTDOWN = 120.0  # seconds a guest gets to shut down by itself before it is reset
HTTP_BODY_LIMIT = 1 << 20  # bytes of a host-side HTTP answer's body kept; a guest's endless body is cut
_HTTP = urllib3.PoolManager(num_pools=4, maxsize=4)


def _http_error_name(exc: BaseException) -> str:
    """The name a failed host-side request records, the same as before urllib3 was used directly
    (requests' names), so old and new cassettes say one thing for one failure."""
    if isinstance(exc, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ProtocolError,
                        urllib3.exceptions.MaxRetryError, ConnectionError)):
        return "ConnectionError"  # first: urllib3's NewConnectionError is a ConnectTimeoutError
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError):
        return "ConnectTimeout"
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return "ReadTimeout"
    return type(exc).__name__


# New on every boot: proof that one happened; read by the shell's builtin, not a guest binary.
BOOT_ID = 'read -r id < /proc/sys/kernel/random/boot_id && echo "$id"'


class Power(Protocol):
    """The VM's own controls a guest may use, lent by whoever owns the VM (the sandbox's QEMU)."""

    def allow_reboot(self, on: bool) -> None:
        """While on, a guest reboot resets the VM instead of ending it."""

    def wait_reset(self, timeout: float) -> bool:
        """Whether the VM reset within ``timeout`` seconds."""

    def reset(self) -> None:
        """Reset the VM now, without a shutdown."""


class HelperRestarted(Exception):
    """The guest helper a command went to is gone; a new one answers now."""


class FramedGuest:
    """What both real guests share: framed exec/run_clean through the guest helper, and host-side HTTP.

    A transport supplies three things: how lines reach the helper (``_send``),
    how its answer is awaited (``_await``), and how a wedged helper is
    replaced (``_recover``).
    """

    def __init__(self, forwards: dict[int, int]) -> None:
        self.forwards = dict(forwards)
        self._dead: str | None = None
        self.power: Power | None = None  # set by the VM's owner; without it no reboot

    def _send(self, text: str) -> None:
        raise NotImplementedError

    def _await(self, pattern: re.Pattern[bytes], timeout: float) -> re.Match[bytes] | None:
        """The match of ``pattern`` in what the helper sends, None at the timeout.

        Raises HelperRestarted when the helper was found gone and replaced,
        GuestDown when the channel is lost for good.
        """
        raise NotImplementedError

    def _recover(self) -> None:
        """Make the channel answer again after a helper that did not (GuestDown if it cannot)."""
        raise NotImplementedError

    def _come_back(self, deadline: float) -> None:
        """After a reset: by ``deadline``, a fresh helper answering, the guest's clock set to the
        host's (GuestDown if not)."""
        raise NotImplementedError

    def _run(self, command: str, timeout: float, output_limit: int | None, clean: bool,
             mode: str | None = None) -> CommandResult:
        if self._dead:
            raise GuestDown(self._dead)
        sentinel = new_sentinel()
        cap = output_cap(output_limit)
        t0 = time.monotonic()
        self._send(request_text(command, timeout, cap, sentinel, clean, mode))
        try:
            seen = self._await(frame_re(sentinel), timeout + SLACK)
        except HelperRestarted:
            return CommandResult(None, "[the guest's command helper was restarted; the command may not have run]",
                                 time.monotonic() - t0, timed_out=False)
        if seen is None:
            # The helper's own timeout should have fired: it is wedged. Replace it.
            self._recover()
            return CommandResult(None, "", time.monotonic() - t0, timed_out=True)
        result = parse_frame(seen.group(0), sentinel, time.monotonic() - t0, cap)
        assert result is not None
        return result

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        return self._run(command, timeout, output_limit, clean=False)

    def _shutting_down(self) -> bool:
        """A reboot or poweroff the agent started may take a while; the server is down all the same."""
        r = self._run("systemctl is-system-running 2>/dev/null; true", 15, 200, clean=True)
        return r.output.strip() == "stopping"

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        return self._run(command, timeout, 64000, clean=True)

    def inspect(self, question: str, timeout: float) -> CommandResult:
        return self._run(question, timeout, 1 << 18, clean=True, mode="i")  # a 1 MiB answer

    def reboot(self, timeout: float) -> RebootResult:
        """Reboot cleanly (``systemctl reboot``), reset if the guest does not within
        :data:`CLEAN_SHUTDOWN`, and return once a fresh helper answers and the boot is done.

        A clean reboot is what an admin does and what a fix must survive: the
        guest flushes what it wrote and stops its units first. QEMU announces
        the reset itself (QMP ``RESET``), so the wait needs no guessing from
        console output, and the guest's boot id, read before and after, proves
        a new boot. Anything that keeps the guest from answering again by
        ``timeout`` is GuestDown.
        """
        if self.power is None:
            raise GuestDown("this guest cannot be rebooted: no control of its VM was given")
        t0 = time.monotonic()
        deadline = t0 + timeout
        before = self._run(BOOT_ID, 15, 200, clean=True).output.strip()
        try:
            self.power.allow_reboot(True)
            try:
                self._run("systemctl --no-block reboot", 30, 2000, clean=True)
            except GuestDown:
                if self._dead:
                    raise
            clean = self.power.wait_reset(max(min(CLEAN_SHUTDOWN, deadline - time.monotonic()), 0.1))
            if not clean:
                self.power.reset()
            self._come_back(deadline)
            # Autologin can come before the boot's last units: judge the machine once it is up.
            left = deadline - time.monotonic()
            if left > 1:
                self._run("systemctl is-system-running --wait >/dev/null 2>&1; true",
                          min(left, 120.0), 200, clean=True)
            after = self._run(BOOT_ID, 15, 200, clean=True).output.strip()
        except VMError as exc:
            raise GuestDown(f"the VM could not be rebooted: {exc}") from None
        finally:
            with contextlib.suppress(VMError):
                self.power.allow_reboot(False)
        if not after or after == before:
            raise GuestDown(f"the guest did not reboot (its boot id is still {after[:36]!r})")
        return RebootResult(clean, round(time.monotonic() - t0, 3))

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        host_port = self.forwards.get(guest_port)
        if host_port is None:
            return HttpResult(None, "", error=f"guest port {guest_port} is not forwarded")
        # urllib3 rather than requests: requests reads a redirect's whole body to release the
        # connection (so the capped read below found it empty), and without a cap.
        t0 = time.monotonic()
        try:
            r = _HTTP.request("GET", f"http://127.0.0.1:{host_port}{path}", redirect=False, retries=False,
                              preload_content=False, timeout=urllib3.Timeout(connect=timeout, read=timeout))
            try:
                body = r.read(HTTP_BODY_LIMIT, decode_content=True) or b""
            finally:
                r.release_conn()
            return HttpResult(r.status, body.decode("utf-8", errors="replace"), duration=time.monotonic() - t0)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return HttpResult(None, "", error=_http_error_name(exc), duration=time.monotonic() - t0)


