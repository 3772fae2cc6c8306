"""The command helper that runs inside the guest: one persistent process per channel.

This file is not imported by the host. Its text is sent over the channel
itself (the serial console or an SSH session) and started with
``python3 -I -S -c 'import sys;exec(sys.stdin.buffer.read(N))'``, so the guest
needs nothing but the python3 every image has, and a copy an agent edited
on disk can never be the one that runs. Standard library only; Python 3.9+.

Why a helper: under TCG every process the guest starts costs tens of
milliseconds, and a shell wrapper around each command started five (timeout,
bash, head, base64, rm). The helper keeps two bash "zygotes" alive (one with
the agent's environment, one clean for probes) and each command costs one
``fork`` of a zygote, which then ``source``s the command's script. The
helper does the rest itself: the timeout, the exit code, reading and
encoding the output.

The protocol is lines of printable ASCII, each under the 4096 bytes a
terminal line can hold. Every request starts with ``#RB``, so a bash that
reads one (the console shell before the helper runs) takes it as a comment;
the helper ignores every line that does not. Requests:

``#RBP <token>``
    ping: answered with ``RBSYNC<token>``.
``#RBT <seconds since the epoch>``
    set the guest's clock (a restored guest wakes with its snapshot's time).
``#RBQ <sentinel> <a|c> <timeout s> <cap> <n>`` then ``n`` lines ``#RBD <base64>``
    run the command (the base64 text, joined) in the agent's shell (``a``)
    or the clean one (``c``); answered with one line
    ``RB<sentinel>:<base64 of the first cap+1 output bytes>:<rc>:<timed out 0|1>:RB<sentinel>``.

The guarantees of the old wrapper hold: the command's text is in a file
(``/run/rb``, a small tmpfs: an output flood hits ENOSPC), never in a
process's argv; stdin is /dev/null; stdout and stderr are merged; the
timeout sends TERM to the command's process group and KILL 2 s later, and
only a timeout that really fired is reported as one (the helper's clock is
monotonic: ``date -s`` cannot move it); the agent's working directory is
remembered between commands; the clean channel has a fixed environment.
"""

import base64
import os
import select
import signal
import stat
import sys
import time

RB = sys.argv[1] if len(sys.argv) > 1 else "/run/rb"
CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CLEAN_ENV = {"PATH": CLEAN_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
KILL_AFTER = 2.0  # seconds between TERM and KILL when a command times out
REMEMBER_CWD = b"\n__rb=$?; pwd > " + RB.encode() + b"/cwd 2>/dev/null; exit $__rb\n"
# Signals Python ignores (or the helper does) that a command must get with their default action.
RESTORE_SIGNALS = (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP)
DONE, TIMED_OUT, LOST = 0, 1, 2  # a frame's outcome: exited, killed at its timeout, status unknown
RUNNING = []  # [zygote, pid, script, output] of the command in hand, for an interrupt to clean up


class ZygoteGone(Exception):
    """The zygote's report pipe closed: it was killed."""


class Zygote:
    """A bash that forks one subshell per command, each in its own process group.

    ``set -m`` gives every background job its own process group, so a
    timeout can kill the command and its children without the zygote. The
    subshell closes the report pipe (fd 3) and turns job control back off,
    so the command's own background jobs stay in its group, as under
    ``timeout``. The zygote reports the subshell's pid, then its status.
    """

    def __init__(self, env, cwd):
        self.env, self.cwd = env, cwd
        self.pid = 0
        self._start()

    def _start(self):
        to_zygote, self._w = os.pipe()
        self._r, from_zygote = os.pipe()
        null = os.open("/dev/null", os.O_RDWR)
        try:
            self.pid = os.posix_spawn(
                "/bin/bash", ["bash", "--noprofile", "--norc", "-s"], self.env,
                file_actions=[(os.POSIX_SPAWN_DUP2, to_zygote, 0), (os.POSIX_SPAWN_DUP2, null, 1),
                              (os.POSIX_SPAWN_DUP2, null, 2), (os.POSIX_SPAWN_DUP2, from_zygote, 3)],
                setsid=True, setsigdef=RESTORE_SIGNALS)
        finally:
            for fd in (to_zygote, from_zygote, null):
                os.close(fd)
        self._buf = b""
        self._send(b"set -m; cd " + self.cwd.encode() + b"\n")

    def restart(self):
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        self._start()

    def _send(self, data):
        os.write(self._w, data)

    def run(self, prelude, script, out):
        """Fork the subshell; its pid, or None if the zygote is gone."""
        line = ("( exec 3>&-; set +m; " + prelude + "; source " + script + " ) </dev/null >" + out
                + " 2>&1 & echo $! >&3; wait $!; echo $? >&3\n")
        try:
            self._send(line.encode())
            return self.read_int(time.monotonic() + 10)
        except (OSError, ZygoteGone):
            return None

    def read_int(self, deadline):
        """The next number the zygote reports, None at the deadline; ZygoteGone if it died."""
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._r, 64)
            if not chunk:
                raise ZygoteGone()
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return int(line)
        except ValueError:
            return None

    def reap(self):
        """Collect the zygote if it exited (it is our child: no zombie left)."""
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except OSError:
            pass


class Interrupted(Exception):
    """The host sent ^C: give up the command in hand and listen again."""


def _on_interrupt(signum, frame):
    raise Interrupted()


def _kill_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def run_command(zygote, sentinel, clean, timeout, cap, command):
    """Run one command; its frame line (bytes)."""
    # Files named apart from the sentinel: a command can see its own script's path, and must
    # not learn the sentinel from it (it could then forge its frame on the console).
    name = os.urandom(8).hex()
    script, out = RB + "/c." + name, RB + "/o." + name
    note = b""
    try:
        os.makedirs(RB, mode=0o700, exist_ok=True)  # an agent may have removed it
        with open(script, "wb") as f:
            f.write(command + (b"" if clean else REMEMBER_CWD))
    except OSError as exc:
        return frame(sentinel, b"[rootbench: cannot write the command file: " + str(exc).encode() + b"]",
                     255, DONE)
    if clean:
        prelude = "cd /"
    else:
        prelude = ('__rb_d=; read -r __rb_d 2>/dev/null <' + RB + '/cwd; '
                   'cd "${__rb_d:-/root}" 2>/dev/null || cd /root; unset __rb_d')
    RUNNING[:] = [zygote, None, script, out]
    pid = zygote.run(prelude, script, out)
    if pid is None:
        zygote.restart()
        pid = zygote.run(prelude, script, out)
    RUNNING[1] = pid
    if pid is None:
        rc, outcome = 255, DONE
        note = b"\n[rootbench: the guest's shell could not start the command]"
    else:
        rc, outcome = _await_exit(zygote, pid, timeout)
        if outcome == LOST:
            note = b"\n[rootbench: the shell running this command was killed; its exit code is unknown]"
    del RUNNING[:]
    zygote.reap()
    try:
        data = _read_head(out, cap + 1)
    except OSError:
        data = b""
    for path in (out, script):
        try:
            os.unlink(path)
        except OSError:
            pass
    return frame(sentinel, (data + note)[: cap + 1], rc, outcome)


def _read_head(path, size):
    """The first ``size`` bytes of the output file, if it still is one: a command may have
    replaced it with a FIFO, a device or a symlink, which must neither block nor be followed."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b"[rootbench: the command replaced its output file]"
        chunks, left = [], size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _await_exit(zygote, pid, timeout):
    """(exit status, outcome) of the command forked as ``pid``, killing it at its timeout."""
    deadline = time.monotonic() + timeout
    try:
        rc = zygote.read_int(deadline)
        if rc is not None:
            return rc, DONE
        _kill_group(pid, signal.SIGTERM)
        rc = zygote.read_int(time.monotonic() + KILL_AFTER)
        if rc is None:
            _kill_group(pid, signal.SIGKILL)
            rc = zygote.read_int(time.monotonic() + 5)
        return (137 if rc is None else rc), TIMED_OUT
    except ZygoteGone:
        # The command killed its shell (``kill $$`` does, as in an interactive shell). The
        # command itself may live on; it was the zygote's child, not ours: wait for it by pid.
        zygote.restart()
        if not _gone_by(pid, deadline):
            _kill_group(pid, signal.SIGTERM)
            if not _gone_by(pid, time.monotonic() + KILL_AFTER):
                _kill_group(pid, signal.SIGKILL)
            return 137, TIMED_OUT
        return 255, LOST


def _gone_by(pid, deadline):
    """Whether process ``pid`` has exited by ``deadline`` (it need not be our child)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return True  # already gone and reaped
    try:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        return bool(ready)
    finally:
        os.close(fd)


def frame(sentinel, data, rc, outcome):
    s = sentinel.encode()
    return (b"RB" + s + b":" + base64.b64encode(data) + b":" + str(rc).encode() + b":"
            + str(outcome).encode() + b":RB" + s + b"\n")


def write_all(data):
    view = memoryview(data)
    while view:
        n = os.write(1, view)
        view = view[n:]


def _abandon():
    """After ^C: kill the command in hand and start its zygote afresh (its reports are now stale)."""
    if not RUNNING:
        return
    zygote, pid, script, out = RUNNING
    del RUNNING[:]
    if pid:
        _kill_group(pid, signal.SIGKILL)
    zygote.restart()
    for path in (out, script):
        try:
            os.unlink(path)
        except OSError:
            pass


def main():
    # The host's ^C (it flushes the terminal's input when the channel seems stuck) must not
    # kill the helper: it abandons the command in hand instead.
    signal.signal(signal.SIGINT, _on_interrupt)
    try:
        with open("/proc/self/comm", "w") as f:
            f.write("rb-guest")  # so an agent's `pkill python3` leaves the channel alone
    except OSError:
        pass
    agent_env = dict(os.environ)
    agent_env["TERM"] = "dumb"
    zygotes = {"a": Zygote(agent_env, "/root" if os.path.isdir("/root") else "/"),
               "c": Zygote(CLEAN_ENV, "/")}
    stdin = sys.stdin.buffer
    while True:
        try:
            line = stdin.readline()
        except Interrupted:
            _abandon()
            continue
        if not line:
            break
        words = line.split()
        if not words:
            continue
        verb = words[0]
        try:
            if verb == b"#RBP" and len(words) == 2:
                write_all(b"RBSYNC" + words[1] + b"\n")
            elif verb == b"#RBT" and len(words) == 2:
                try:
                    time.clock_settime(time.CLOCK_REALTIME, float(words[1]))
                except (OSError, ValueError):
                    pass
            elif verb == b"#RBQ" and len(words) == 6:
                sentinel, mode = words[1].decode(), words[2].decode()
                timeout, cap, n = float(words[3]), int(words[4]), int(words[5])
                chunks = []
                for _ in range(n):
                    part = stdin.readline().split()
                    if not part or part[0] != b"#RBD" or len(part) > 2:
                        break
                    chunks.append(part[1] if len(part) == 2 else b"")
                if len(chunks) != n or mode not in zygotes or not sentinel.isalnum():
                    continue  # a broken request (the host's ^C flushed it): no frame, the host retries
                command = base64.b64decode(b"".join(chunks))
                write_all(run_command(zygotes[mode], sentinel, mode == "c", timeout, cap, command))
        except (ValueError, UnicodeDecodeError):
            continue
        except Interrupted:
            _abandon()
    for z in zygotes.values():
        _kill_group(z.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
