"""Command framing shared by the real guests: any bytes in, any bytes back, never desynchronised.

Both transports (serial console and SSH) send the same shell lines and read
the same frame back; only how the lines travel differs.
"""

from __future__ import annotations

import base64
import re
import secrets
import time

import requests

from runner.core.guest import CommandResult, HttpResult

#
# A command is written to a script file in a small tmpfs (/run/rb, 2 MiB) by
# the shell's own printf, as bash ANSI-C strings ($'...', every byte outside
# plain printable ASCII written as \xHH, so no quote, control byte or history
# "!" reaches the shell raw). A wrapper runs that file in a child bash with
# stdin from /dev/null and its output written to the same tmpfs (a flood hits
# ENOSPC instead of filling memory or disk), then prints one line:
# RB<sentinel>:<base64 of the first cap+1 bytes>:<rc>:<timed out 0|1>:RB<sentinel>.
#
# ``timeout`` exits 124 (137 after its -k KILL) when it fires, but a command
# can exit 124 or 137 by itself (``exit 124``, a SIGKILL from the OOM killer).
# So the wrapper says whether the timeout really fired: only if the command
# ran for its whole timeout. The clock is /proc/uptime read by the ``read``
# builtin: monotonic (an agent's ``date -s`` cannot move it, nor can the
# clock set after a restore), in hundredths of a second, and no process.
# The sentinel is random per command and is printed by concatenation (the
# typed text reads "RB" "sentinel" apart), so nothing the command prints or an
# echoed command line can forge the frame.
#
# The command's text is in no process's argv, as in a real interactive shell:
# otherwise ``pkill -f nginx; systemctl start nginx`` kills its own shell
# before the second half runs. And under TCG every process costs tens of
# milliseconds, so the wrapper uses builtins wherever it can (printf, read,
# test, case, arithmetic): the processes it starts are the child shell,
# timeout, bash, head, base64 and rm.

CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CHUNK_BYTES = 500  # command bytes per typed line: at most 2000 chars quoted (tty lines cap at 4096)
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("\\"), ord("'"), ord("!")}
_REMEMBER_CWD = b"\n__rb=$?; pwd > /run/rb/cwd 2>/dev/null; exit $__rb\n"


def frame_re(sentinel: str) -> re.Pattern[bytes]:
    s = sentinel.encode()
    return re.compile(rb"RB" + s + rb":([A-Za-z0-9+/=]*):(\d+):([01]):RB" + s)


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
    # Timed out: rc 124/137 and at least the timeout's length gone by (less 50 ms for
    # the uptime's 10 ms steps). If /proc/uptime cannot be read, rc alone decides.
    lines[-1] += (f"; __rb_u0=; read -r __rb_u0 _ 2>/dev/null </proc/uptime; "
                  f"( {run} ) </dev/null >{out} 2>&1; __rb_rc=$?; "
                  f"__rb_u1=; read -r __rb_u1 _ 2>/dev/null </proc/uptime; "
                  f"__rb_to=0; case $__rb_rc in 124|137) __rb_to=1;; esac; "
                  f"case $__rb_to:$__rb_u0:$__rb_u1 in 1:[0-9]*.[0-9][0-9]:[0-9]*.[0-9][0-9]) "
                  f"(( 10#${{__rb_u1/./}} - 10#${{__rb_u0/./}} < {t * 100 - 5} )) && __rb_to=0;; esac; "
                  f"printf '%s%s:' RB {sentinel}; head -c {cap + 1} {out} | base64 -w0; "
                  f"printf ':%s:%s:%s%s\\n' \"$__rb_rc\" \"$__rb_to\" RB {sentinel}; "
                  f"rm -f {out} {script}; unset __rb_rc __rb_to __rb_u0 __rb_u1")
    return lines


def parse_frame(data: bytes, sentinel: str, duration: float, cap: int) -> CommandResult | None:
    """The CommandResult framed in ``data``, or None if the frame is not there (yet).

    The wrapper sends one byte more than ``cap``: if it is there, the output was cut.
    It also says whether the timeout fired; only then is there no exit code.
    """
    m = frame_re(sentinel).search(data)
    if not m:
        return None
    blob, rc, timed_out = m.group(1), int(m.group(2)), m.group(3) == b"1"
    try:
        raw = base64.b64decode(blob + b"=" * (-len(blob) % 4))
    except ValueError:
        raw = b""
    output = raw[:cap].decode("utf-8", errors="replace")
    return CommandResult(None if timed_out else rc, output, duration, timed_out, len(raw) > cap)


def new_sentinel() -> str:
    return secrets.token_hex(8)


def output_cap(output_limit: int | None) -> int:
    """Bytes to fetch from the guest: enough for ``output_limit`` characters of UTF-8."""
    return min(max(output_limit or 16000, 256) * 4, 1 << 20)



SLACK = 20.0  # seconds beyond a command's own timeout before the channel is declared stuck


class FramedGuest:
    """What both real guests share: framed exec/run_clean over ``_run``, and host-side HTTP."""

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

    def run_clean(self, command: str, timeout: float) -> CommandResult:
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


