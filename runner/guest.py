"""The guest: a root shell inside the VM, seen through one small interface.

The agent, the probes and the replayer all talk to a :class:`Guest`. Real
guests (serial console, SSH) live here; the replay guest lives in
``runner.cassette`` because it is made of recorded exchanges.
"""

from __future__ import annotations

import abc
import base64
import re
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass

import pexpect
import pexpect.fdpexpect
import requests

from runner.errors import GuestDown


@dataclass(frozen=True)
class CommandResult:
    """What one command did. ``exit_code`` is None when it was killed at its timeout."""

    exit_code: int | None
    output: str  # stdout and stderr, merged, decoded (invalid UTF-8 replaced)
    duration: float  # seconds, host-side
    timed_out: bool = False
    truncated: bool = False  # output was cut at the caller's output_limit


@dataclass(frozen=True)
class HttpResult:
    """One HTTP GET made from the host through a forwarded port."""

    status: int | None  # None when no HTTP answer came at all
    body: str
    error: str | None = None  # why there was no answer
    duration: float = 0.0


class Guest(abc.ABC):
    """A root shell in the VM.

    ``exec`` is the agent's channel: state (cwd, variables) persists between
    calls, as in a real login. ``probe`` runs in a fresh, clean channel with a
    fixed PATH and no aliases, so nothing the agent defined can fool a probe.
    """

    @abc.abstractmethod
    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        """Run ``command`` as root in the agent's shell; kill it at ``timeout`` seconds."""

    @abc.abstractmethod
    def probe(self, command: str, timeout: float) -> CommandResult:
        """Run ``command`` in a clean environment the agent cannot have altered."""

    @abc.abstractmethod
    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        """GET ``path`` on ``guest_port`` from the host side (through a forwarded port)."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """True while the VM runs and the shell answers."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the channel; the VM's own teardown belongs to ``runner.vm``."""


# --- framing shared by the real guests ----------------------------------------------------
#
# A command is written to a script file in a small tmpfs (/run/rb, 2 MiB) by
# the shell's own printf, as bash ANSI-C strings ($'...', every byte outside
# plain printable ASCII written as \xHH, so no quote, control byte or history
# "!" reaches the shell raw). A wrapper runs that file in a child bash with
# stdin from /dev/null and its output written to the same tmpfs (a flood hits
# ENOSPC instead of filling memory or disk), then prints one line:
# RB<sentinel>:<base64 of the first cap+1 bytes>:<rc>:RB<sentinel>.
# The sentinel is random per command and is printed by concatenation (the
# typed text reads "RB" "sentinel" apart), so nothing the command prints or an
# echoed command line can forge the frame.
#
# The command's text is in no process's argv, as in a real interactive shell:
# otherwise ``pkill -f nginx; systemctl start nginx`` kills its own shell
# before the second half runs. And under TCG every process costs tens of
# milliseconds, so the wrapper uses builtins wherever it can (printf, read,
# test): the processes it starts are the child shell, timeout, bash, head,
# base64 and rm.

CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CHUNK_BYTES = 500  # command bytes per typed line: at most 2000 chars quoted (tty lines cap at 4096)
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("\\"), ord("'"), ord("!")}
_REMEMBER_CWD = b"\n__rb=$?; pwd > /run/rb/cwd 2>/dev/null; exit $__rb\n"


def _frame_re(sentinel: str) -> re.Pattern[bytes]:
    s = sentinel.encode()
    return re.compile(rb"RB" + s + rb":([A-Za-z0-9+/=]*):(\d+):RB" + s)


def quote_bytes(data: bytes) -> str:
    """``data`` as a bash ANSI-C string: printable ASCII only, no quote or "!" unescaped.

    NUL bytes are dropped (a bash string cannot hold them).
    """
    return "$'" + "".join(chr(b) if b in _PLAIN else f"\\x{b:02x}" for b in data if b) + "'"


def framed_lines(command: str, timeout: float, cap: int, sentinel: str, clean: bool) -> list[str]:
    """The shell lines that run one framed command (see the comment above).

    ``clean`` runs it the way probes need: fresh environment, no profile, cwd /.
    Otherwise it runs in the agent's working directory, which it then remembers.
    """
    t = max(1, int(round(timeout)))
    script, out = f"/run/rb/c.{sentinel}", f"/run/rb/o.{sentinel}"
    data = command.encode("utf-8", errors="surrogateescape") + (b"" if clean else _REMEMBER_CWD)
    pieces = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
    lines = [f"[ -d /run/rb ] || mkdir -p /run/rb; printf %s {quote_bytes(pieces[0])} >{script}"]
    lines += [f"printf %s {quote_bytes(p)} >>{script}" for p in pieces[1:]]
    if clean:
        run = (f"cd / && exec timeout -k 2 {t} env -i PATH={CLEAN_PATH} HOME=/root LANG=C.UTF-8 "
               f"TERM=dumb bash --noprofile --norc {script}")
    else:
        run = ("__rb_d=; read -r __rb_d 2>/dev/null </run/rb/cwd; "
               "cd \"${__rb_d:-/root}\" 2>/dev/null || cd /root; "
               f"exec timeout -k 2 {t} bash --noprofile --norc {script}")
    lines[-1] += (f"; ( {run} ) </dev/null >{out} 2>&1; __rb_rc=$?; "
                  f"printf '%s%s:' RB {sentinel}; head -c {cap + 1} {out} | base64 -w0; "
                  f"printf ':%s:%s%s\\n' \"$__rb_rc\" RB {sentinel}; "
                  f"rm -f {out} {script}; unset __rb_rc")
    return lines


def parse_frame(data: bytes, sentinel: str, duration: float, cap: int) -> CommandResult | None:
    """The CommandResult framed in ``data``, or None if the frame is not there (yet).

    The wrapper sends one byte more than ``cap``: if it is there, the output was cut.
    """
    m = _frame_re(sentinel).search(data)
    if not m:
        return None
    blob, rc = m.group(1), int(m.group(2))
    try:
        raw = base64.b64decode(blob + b"=" * (-len(blob) % 4))
    except ValueError:
        raw = b""
    output = raw[:cap].decode("utf-8", errors="replace")
    timed_out = rc in (124, 137)
    return CommandResult(None if timed_out else rc, output, duration, timed_out, len(raw) > cap)


def new_sentinel() -> str:
    return secrets.token_hex(8)


def output_cap(output_limit: int | None) -> int:
    """Bytes to fetch from the guest: enough for ``output_limit`` characters of UTF-8."""
    return min(max(output_limit or 16000, 256) * 4, 1 << 20)


# --- the serial console guest ---------------------------------------------------------------




_NEW_SHELL = re.compile(rb"\x1b\[\?2004hroot@rootbench:~# ")  # a fresh interactive shell prompting
SLACK = 20.0  # seconds beyond a command's own timeout before the channel is declared stuck
_SETUP = ("stty -echo -onlcr 2>/dev/null; set +o emacs +o vi; PS1=''; PS2=''; unset PROMPT_COMMAND; "
          "export HISTFILE=/dev/null TERM=dumb; mkdir -p /run/rb")


class _FramedGuest:
    """What both real guests share: framed exec/probe over ``_run``, and host-side HTTP."""

    def __init__(self, forwards: dict[int, int]) -> None:
        self.forwards = dict(forwards)

    def _run(self, command: str, timeout: float, output_limit: int | None, clean: bool) -> CommandResult:
        raise NotImplementedError

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        return self._run(command, timeout, output_limit, clean=False)

    def _shutting_down(self) -> bool:
        """A reboot or poweroff the agent started may take a while; the server is down all the same."""
        r = self._run("systemctl is-system-running 2>/dev/null; true", 15, 200, clean=True)
        return r.output.strip() == "stopping"

    def probe(self, command: str, timeout: float) -> CommandResult:
        return self._run(command, timeout, 64000, clean=True)

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        host_port = self.forwards.get(guest_port)
        if host_port is None:
            return HttpResult(None, "", error=f"guest port {guest_port} is not forwarded")
        t0 = time.monotonic()
        try:
            with requests.get(f"http://127.0.0.1:{host_port}{path}", timeout=(timeout, timeout),
                               allow_redirects=False, stream=True) as r:
                body = r.raw.read(1 << 20, decode_content=True) or b""
                return HttpResult(r.status_code, body.decode("utf-8", errors="replace"),
                                  duration=time.monotonic() - t0)
        except (requests.RequestException, OSError) as exc:
            return HttpResult(None, "", error=type(exc).__name__, duration=time.monotonic() - t0)


class SerialGuest(_FramedGuest, Guest):
    """The root shell the image's console service keeps on the serial port (a unix socket)."""

    def __init__(self, socket_path: str, forwards: dict[int, int], connect_timeout: float = 10.0) -> None:
        super().__init__(forwards)
        deadline = time.monotonic() + connect_timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(socket_path)
                break
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    raise GuestDown(f"cannot connect to the serial console {socket_path}") from None
                time.sleep(0.02)
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
        seen = self._expect([_frame_re(sentinel), _NEW_SHELL], timeout + SLACK)
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


# --- the SSH guest ------------------------------------------------------------------------------



class SshGuest(_FramedGuest, Guest):
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
        log = f"{workdir}/ssh-master.log"
        deadline = time.monotonic() + connect_timeout
        while True:
            # The master goes to the background once authenticated (-f); its stdio is a
            # file, never a pipe of ours, or waiting on it would hang.
            try:
                with open(log, "ab") as err:
                    r = subprocess.run([*self._ctl, "-o", "ControlMaster=yes",
                                         "-o", "ControlPersist=yes", "-f", "-N", "root@127.0.0.1"],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=err, timeout=20)
                if r.returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                tail = open(log, errors="replace").read().strip()[-200:]
                raise GuestDown(f"ssh to the guest failed: {tail or 'no answer'}")
            time.sleep(0.3)

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
