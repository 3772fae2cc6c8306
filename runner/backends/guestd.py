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
``#RBQ <sentinel> <a|c|i> <timeout s> <cap> <n>`` then ``n`` lines ``#RBD <base64>``
    run the command (the base64 text, joined) in the agent's shell (``a``)
    or the clean one (``c``); answered with one line
    ``RB<sentinel>:<base64 of the first cap+1 output bytes>:<rc>:<timed out 0|1>:RB<sentinel>``.
    Mode ``i`` (inspect) is no command: the text is a JSON question the
    helper answers itself, in the same frame, without starting any program
    (see "Inspection" below).

The guarantees of the old wrapper hold: the command's text is in a file
(``/run/rb``, a small tmpfs: an output flood hits ENOSPC), never in a
process's argv; stdin is /dev/null; stdout and stderr are merged; the
timeout sends TERM to the command's process group and KILL 2 s later, and
only a timeout that really fired is reported as one (the helper's clock is
monotonic: ``date -s`` cannot move it); the agent's working directory is
remembered between commands; the clean channel has a fixed environment.

Inspection. The clean channel runs the guest's own programs (``ss``,
``systemctl``, ``curl``, ``stat``), and root in the guest can replace them,
shadow them, or make every new process load a library of its choosing
(``/etc/ld.so.preload``). The probes of rules 2 ask the helper instead: it
reads ``/proc`` (the sockets, their owners, the owners' executables and
cgroups), ``lstat``s and reads files, makes HTTP requests with its own
sockets, and asks systemd over its private D-Bus socket. Nothing it does
starts a program or loads code from the guest's disk after it started
(every module it needs is imported at start, then the import path is
emptied; it never resolves a name through NSS), and it checks that what it
reads is the real thing: every ``/proc`` file it opens is on the procfs it
saw at start (a bind mount over ``/proc/net/tcp`` is on another device), and
the systemd socket's peer is PID 1 (a fake server bound at that path is not).
A question it cannot answer truthfully is answered ``{"tampered": why}``.
The ``state`` question (:func:`ask_state`) answers the harness's state diff
the same way: facts about the whole machine (runtime units, mounts, sockets,
unowned processes, setid and world-writable files, sudoers, PAM, pg_hba,
sshd, installed files against dpkg's md5sums as read at start).
The clean channel, which the probes of kind ``command`` still use, refuses
to run a command (exit 126, ``[rootbench: not run, tampered: why]``) while
a program of its PATH is not what its package installed, is hidden by
another, or a library is preloaded, and does not pass on the output of one
during which a program changed (see :func:`tools_tampered`).
"""

import base64
import hashlib
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import time

# Everything the helper will ever import is imported above, while the guest is clean; now the
# path is emptied, so a lazy import inside the standard library can never load a module an
# agent wrote (built-in and frozen modules still import: they are in the binary).
sys.path[:] = []
sys.path_importer_cache.clear()

RB = sys.argv[1] if len(sys.argv) > 1 else "/run/rb"
# Where the clean channel's tamper check looks (tests point it at a folder of their own).
ROOT = sys.argv[2] if len(sys.argv) > 2 else ""
CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CLEAN_ENV = {"PATH": CLEAN_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
KILL_AFTER = 2.0  # seconds between TERM and KILL when a command times out
REMEMBER_CWD = b"\n__rb=$?; pwd > " + RB.encode() + b"/cwd 2>/dev/null; exit $__rb\n"
# Signals Python ignores (or the helper does) that a command must get with their default action.
RESTORE_SIGNALS = (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP)
DONE, TIMED_OUT, LOST = 0, 1, 2  # a frame's outcome: exited, killed at its timeout, status unknown
RUNNING: list = []  # [zygote, pid, script, output] of the command in hand, for an interrupt to clean up


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


# --- can the clean channel's programs be trusted? ----------------------------------------------

TAMPERED_RC = 126  # what a refused clean command "exits" with: no probe asks for it
PACKAGE_FILES: "dict[str, str]" = {}  # dpkg's name of a file below STATE_PACKAGE_PREFIXES (as listed) -> its md5, read at start
PACKAGE_SIGS: "dict[str, object]" = {}  # the same name -> its signature at start (see remember_package_files)
STATE_PACKAGE_PREFIXES = ("etc/", "usr/bin/", "usr/sbin/", "usr/lib/systemd/")  # merged names
PACKAGED: "dict[str, str]" = {}  # dpkg's name of a program ("usr/bin/grep", merged /usr) -> its md5, read at start
AT_START: "dict[str, str]" = {}  # each program as the clean PATH names it -> the real path it had at start
TRUSTED: "set[tuple[str, object]]" = set()  # (program as named, signature): proven since; a program is hashed once per change


def _path_folders():
    """The clean PATH's folders in order, each once: ``(as named, real path)``. With merged
    /usr, /sbin and /bin are links to /usr/sbin and /usr/bin and add nothing."""
    seen, out = set(), []
    for d in CLEAN_PATH.split(":"):
        real = os.path.realpath(ROOT + d)
        if real not in seen:
            seen.add(real)
            out.append((d, real))
    return out


LISTINGS: "dict[str, tuple[tuple[int, int, int, int], list[tuple[str, str]]]]" = {}  # a PATH folder's real path -> (its stat, its programs): listed again when it changes


def _listed():
    """``(folder as named, [(program as named, its path)...])`` for each PATH folder, in order.
    A folder's mtime moves whenever a name in it is added, removed or renamed, so its list is
    read again only then (what is behind a name is judged by :func:`_signature`)."""
    out = []
    for named, real in _path_folders():
        try:
            st = os.stat(real)
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
            if LISTINGS.get(real, (None,))[0] != key:
                LISTINGS[real] = (key, [(named + "/" + n, real + "/" + n) for n in sorted(os.listdir(real))])
            out.append((named, LISTINGS[real][1]))
        except OSError:
            out.append((named, []))  # a missing folder: the shell says so itself
    return out


def _merged(name):
    """A name as merged /usr spells it, without the leading slash: dpkg lists ``bin/grep`` for
    what is /usr/bin/grep, and /sbin/x is /usr/sbin/x."""
    name = name.lstrip("/")
    if name.split("/", 1)[0] in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        return "usr/" + name
    return name


def _real_name(path):
    """dpkg's kind of name for the file ``path`` finally leads to, or None if it is outside
    the root the helper judges."""
    real, root = os.path.realpath(path), os.path.realpath(ROOT) if ROOT else ""
    return _merged(real[len(root):]) if real.startswith(root + "/") else None


def _signature(path):
    """What changes whenever the program at ``path`` does: its lstat and, for a link, the stat
    of what it leads to. Content written in place (through any link or a shared mapping)
    moves mtime and ctime, which root cannot set back; a file put in its place is another
    inode. None if nothing is there."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    sig: tuple[object, ...] = (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
            sig += (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            sig += (None,)
    return sig


def _as_packaged(path, name):
    """Whether what ``path`` opens is, byte for byte, the file a package installed as ``name``."""
    want = PACKAGED.get(name)
    return want is not None and _digest_path(path, "md5") == want


def remember_programs():
    """Learn, once at start, what the clean PATH's programs must be.

    The helper starts in a fresh guest (the golden snapshot's) before any scenario
    or agent ran, so what dpkg's md5sums say then is the truth, and every program a
    package installed is hashed against it now: afterwards only a changed signature
    costs a hash. A helper started later (after a reboot, or over SSH) still finds a
    package's program that root rewrote. Programs no package lists (Debian's links:
    awk, pager, python3 ...) are taken as they are now.
    """
    listed = _listed()
    prefixes = tuple(_merged(named) + "/" for named, _real in _path_folders())
    links = {_real_name(path) for _named, programs in listed for _program, path in programs
             if os.path.islink(path)}
    info = ROOT + "/var/lib/dpkg/info"
    try:
        lists = sorted(e for e in os.listdir(info) if e.endswith(".md5sums"))
    except OSError:
        lists = []
    for entry in lists:
        try:
            with open(info + "/" + entry, "rb") as f:
                for line in f:
                    digest, _, listed_as = line.rstrip(b"\n").partition(b"  ")
                    as_listed = listed_as.decode("utf-8", "replace").lstrip("/")
                    name = _merged(as_listed)
                    if name.startswith(prefixes) or name in links:
                        PACKAGED[name] = digest.decode("ascii", "replace")
                    if name.startswith(STATE_PACKAGE_PREFIXES):  # the state question's manifest
                        PACKAGE_FILES[as_listed] = digest.decode("ascii", "replace")
        except OSError:
            continue
    for _named, programs in listed:
        for program, path in programs:
            AT_START[program] = os.path.realpath(path)
            own = _merged(program)
            if own not in PACKAGED or _as_packaged(path, own):
                TRUSTED.add((program, _signature(path)))


def _program_untrusted(program, path, sig):
    """Why the program the PATH names ``program`` (found at ``path``, whose signature is
    ``sig``) cannot be trusted, or ""."""
    if sig is None or (program, sig) in TRUSTED:
        return ""
    own = _merged(program)
    if own in PACKAGED:
        if not _as_packaged(path, own):
            return program + " is not the file its package installed"
    else:
        start = AT_START.get(program)
        if start is None:
            return ""  # a program no package has, new: judged only if it hides another
        # Changed since start: only a link still leading to the same packaged file, unchanged.
        if not stat.S_ISLNK(sig[0]) or os.path.realpath(path) != start:
            return program + " is not the program it was"
        target = _real_name(path)
        if not _as_packaged(path, target):
            if target in PACKAGED:  # name the file rewritten, not each link to it (halt -> systemctl)
                return "/" + target + " is not the file its package installed"
            return program + " is not the program it was"
    TRUSTED.add((program, sig))
    return ""


def tools_tampered():
    """Why the programs a clean command would run cannot be trusted now, or "", and the
    signature of each program (see :func:`changed_while_running`).

    Root can make ``grep`` or ``sha256sum`` a liar three ways, and each is
    refused: rewrite it (every program the PATH offers must be what its package
    installed, or as it was at start; see :func:`remember_programs`), hide it (the
    clean PATH starts with /usr/sbin, so a script of that name there is found before
    /usr/bin's: a name also in a later folder must be the same file or a package's
    own there), or make every program load a library (/etc/ld.so.preload must name
    nothing). Not cached: only a new stat proves a file unchanged; the ~600 lstat
    cost about 20 ms under TCG. What a program loads beyond its own file (shared
    libraries, a script's modules) is not judged.
    """
    sigs: dict[str, object] = {}
    try:
        with open(ROOT + "/etc/ld.so.preload", "rb") as f:
            if f.read(4096).split():
                return "/etc/ld.so.preload makes every program load a library", sigs
    except OSError:
        pass
    listed = _listed()
    for _named, programs in listed:
        for program, path in programs:
            sig = sigs[program] = _signature(path)
            why = _program_untrusted(program, path, sig)
            if why:
                return why, sigs
    for i, (named, programs) in enumerate(listed):
        paths = {program[len(named):]: path for program, path in programs}  # "/grep" -> path
        for later_named, later_programs in listed[i + 1:]:
            for program, hidden in later_programs:
                name = program[len(later_named):]
                first = paths.get(name)
                if first is None or os.path.realpath(first) == os.path.realpath(hidden):
                    continue
                if _merged(named + name) not in PACKAGED:  # a package's own was proven above
                    return named + name + " hides " + program, sigs
    return "", sigs


def changed_while_running(before, after):
    """Which program the guest had at start (or a package has) changed while a clean command
    ran, or "": judged before and after, a liar swapped in for the command's run and the
    real file put back (timed by watching /run/rb) leaves only this trace. New programs
    (a package the scenario's setup installs) are judged before the next command."""
    for program, sig in before.items():
        if after.get(program) != sig and (program in AT_START or _merged(program) in PACKAGED):
            return program + " changed while the command ran"
    return ""


def run_command(zygote, sentinel, clean, timeout, cap, command):
    """Run one command; its frame line (bytes)."""
    if clean:
        why, before = tools_tampered()
        if why:
            return _refused(sentinel, "not run", why)
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
    if clean:
        why, after = tools_tampered()
        why = why or changed_while_running(before, after)
        if why:
            return _refused(sentinel, "not judged", why)  # what it printed may be a liar's
    return frame(sentinel, (data + note)[: cap + 1], rc, outcome)


def _refused(sentinel, what, why):
    """The frame of a clean command whose programs cannot be trusted: short, the cause last (a
    probe's detail keeps the end of the output)."""
    return frame(sentinel, b"[rootbench: " + what.encode() + b", tampered: " + why.encode("utf-8", "replace")
                 + b"]", TAMPERED_RC, DONE)


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


# --- inspection: answering probe questions without starting a program ----------------------

PROC_FD = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)  # the procfs the helper started with
PROC_DEV = os.fstat(PROC_FD).st_dev
SYSTEMD_SOCKET = "/run/systemd/private"
READ_CAP = 700000  # bytes of a file's content or an HTTP body: base64 in JSON fits a 1 MiB frame
UNIT_TYPES = (".service", ".socket", ".target", ".device", ".mount", ".automount", ".swap",
              ".timer", ".path", ".slice", ".scope")
PINNED: "dict[str, str | None]" = {}  # path -> sha256 of the file there the first time a question named it
HASHED: "dict[tuple[str, int, int, int, int, int], str]" = {}  # (algorithm, st_dev, st_ino, size, mtime_ns, ctime_ns) -> digest, so a big binary is read once


class Tampered(Exception):
    """What the helper reads is not the kernel's or systemd's own answer."""


def _proc_read(rel, cap=1 << 20):
    """A /proc file's bytes, read through the procfs the helper started with (Tampered if the
    file opened is on another filesystem: something was mounted over it)."""
    fd = os.open(rel, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=PROC_FD)
    try:
        if os.fstat(fd).st_dev != PROC_DEV:
            raise Tampered("/proc/" + rel + " is not the kernel's (something is mounted over it)")
        chunks, left = [], cap
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _digest_fd(fd, algorithm="sha256"):
    st = os.fstat(fd)
    key = (algorithm, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in HASHED:
        h = hashlib.new(algorithm)
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            h.update(chunk)
        HASHED[key] = h.hexdigest()
    return HASHED[key]


def _digest_path(path, algorithm="sha256"):
    """The digest of what ``path`` (or the ``/proc``-relative magic link) opens, or None if it
    is not a regular file (opened without blocking: a FIFO there cannot wedge the helper)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return _digest_fd(fd, algorithm)
    finally:
        os.close(fd)


def _unit_of_cgroup(path):
    """The systemd unit a cgroup v2 path belongs to: the first component below the slices."""
    for part in path.strip("/").split("/"):
        if part and not part.endswith(".slice"):
            return part if part.endswith(UNIT_TYPES) else None
    return None


def _listening_inodes(proto, port):
    """The socket inodes of ``proto`` listening on ``port`` (TCP LISTEN, or a bound UDP socket)."""
    state = "0A" if proto == "tcp" else "07"
    inodes = set()
    for name in (proto, proto + "6"):
        try:
            text = _proc_read("net/" + name, 64 << 20).decode("ascii", "replace")
        except FileNotFoundError:
            continue  # no IPv6 in this kernel
        for line in text.splitlines()[1:]:
            f = line.split()
            if len(f) < 10 or f[3] != state:
                continue
            if int(f[1].rpartition(":")[2], 16) == port:
                inodes.add(f[9])
    return inodes


def _process(pid, want_hash):
    """What the port question reports of one process owning a listening socket."""
    info = {"pid": pid}
    try:
        info["comm"] = _proc_read(pid + "/comm").decode("utf-8", "replace").strip()
    except OSError:
        info["comm"] = None
    try:
        info["exe"] = os.readlink(pid + "/exe", dir_fd=PROC_FD)
    except OSError:
        info["exe"] = None
    cgroup = None
    try:
        for line in _proc_read(pid + "/cgroup").decode("utf-8", "replace").splitlines():
            if line.startswith("0::"):
                cgroup = line[3:]
    except OSError:
        pass
    info["cgroup"] = cgroup
    info["unit"] = _unit_of_cgroup(cgroup) if cgroup else None
    if want_hash:
        try:
            fd = os.open(pid + "/exe", os.O_RDONLY, dir_fd=PROC_FD)
        except OSError:
            info["sha256"] = None
        else:
            try:
                info["sha256"] = _digest_fd(fd)
            finally:
                os.close(fd)
    return info


def ask_port(q):
    """Who listens on a port: the kernel's socket tables, then every process's descriptors."""
    proto, port = q.get("protocol", "tcp"), int(q["port"])
    if proto not in ("tcp", "udp"):
        return {"error": "unknown protocol"}
    inodes = _listening_inodes(proto, port)
    answer: dict = {"listening": bool(inodes), "processes": []}
    exe = q.get("exe")
    if exe:
        # The reference is the file at that path the first time a question named it: the
        # baseline or the pre-check, before the agent had a shell.
        if exe not in PINNED:
            PINNED[exe] = _digest_path(exe)
        answer["exe"] = {"path": exe, "resolved": os.path.realpath(exe), "sha256": PINNED[exe]}
    if not inodes:
        return answer
    for pid, _held in _holders(set("socket:[" + i + "]" for i in inodes)):
        answer["processes"].append(_process(pid, bool(exe)))
    return answer


def _holders(wanted):
    """``[(pid, the targets of ``wanted`` it holds)...]`` in pid order: every process with a
    descriptor whose link (``socket:[inode]``) is in ``wanted``."""
    found = []
    for pid in sorted(os.listdir(PROC_FD), key=lambda p: (len(p), p)):
        if not pid.isdigit():
            continue
        try:
            dfd = os.open(pid + "/fd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=PROC_FD)
        except OSError:
            continue
        try:
            fds = os.listdir(dfd)
        except OSError:
            continue
        finally:
            os.close(dfd)
        held = set()
        for fd in fds:
            try:
                target = os.readlink(pid + "/fd/" + fd, dir_fd=PROC_FD)
            except OSError:
                continue
            if target in wanted:
                held.add(target)
        if held:
            found.append((pid, held))
    return found


FILE_TYPES = ((stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "fifo"),
              (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character special file"),
              (stat.S_ISBLK, "block special file"))


def _name_of(table, number):
    """The name ``/etc/passwd`` or ``/etc/group`` gives ``number``, read as text (NSS would
    load a library the guest's root chose), or UNKNOWN as stat(1) says."""
    try:
        with open(table, "rb") as f:
            for line in f.read(4 << 20).decode("utf-8", "replace").splitlines():
                fields = line.split(":")
                if len(fields) > 2 and fields[2] == str(number):
                    return fields[0]
    except OSError:
        pass
    return "UNKNOWN"


def ask_file(q):
    """A path's type, mode and owners as ``lstat`` gives them, and its content if asked."""
    path = q["path"]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"exists": False}
    except OSError as exc:
        return {"error": "lstat: " + (exc.strerror or str(exc))}
    kind = "regular empty file" if stat.S_ISREG(st.st_mode) and st.st_size == 0 else "regular file"
    for test, name in FILE_TYPES:
        if test(st.st_mode):
            kind = name
    answer = {"exists": True, "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
              "owner": _name_of("/etc/passwd", st.st_uid), "group": _name_of("/etc/group", st.st_gid),
              "type": kind}
    if q.get("content"):
        data = b""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    data = os.read(fd, READ_CAP)
            finally:
                os.close(fd)
        except OSError:
            pass
        answer["content"] = base64.b64encode(data).decode()
    return answer


def _hosts_address(name):
    """The address /etc/hosts gives ``name`` (the file as text: no NSS), or None."""
    try:
        with open("/etc/hosts", "rb") as f:
            for line in f.read(1 << 20).decode("utf-8", "replace").splitlines():
                fields = line.split("#", 1)[0].split()
                if len(fields) > 1 and name.lower() in (x.lower() for x in fields[1:]):
                    return fields[0]
    except OSError:
        pass
    return None


def ask_http(q, deadline):
    """One GET as curl makes it (no redirect followed), from the helper's own socket."""
    url = q["url"]
    scheme, _, rest = url.partition("://")
    if scheme != "http":
        return {"error": "only http:// is supported"}
    hostport, slash, path = rest.partition("/")
    path = slash + path if slash else "/"
    host, port = hostport, 80
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        if tail.startswith(":"):
            port = int(tail[1:])
    elif ":" in hostport:
        host, _, p = hostport.rpartition(":")
        port = int(p)
    # curl resolves localhost itself, to the loopback addresses, whatever /etc/hosts says.
    if host.lower() == "localhost":
        addresses = ["127.0.0.1", "::1"]
    else:
        try:
            socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
            addresses = [host]
        except OSError:
            found = _hosts_address(host)
            if found is None:
                return {"status": None, "why": "could not resolve " + host}
            addresses = [found]
    error = "connection failed"  # the last address's failure is the one reported
    for address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            return {"status": None, "why": "timed out"}
        try:
            return _get(address, port, hostport, path, min(left, 10.0))
        except OSError as exc:
            error = type(exc).__name__
    return {"status": None, "why": error}


def _get(address, port, hostport, path, timeout):
    """One HTTP/1.0 GET (the server closes the connection after its answer, and sends no
    chunks), read to the end or to READ_CAP bytes of body. Hand-made: http.client pulls in
    the email package, seconds of imports under TCG each time a helper starts."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect((address, port))
        sock.sendall(("GET " + path + " HTTP/1.0\r\nHost: " + hostport
                      + "\r\nUser-Agent: rootbench-probe\r\nAccept: */*\r\n\r\n").encode("latin-1"))
        data = b""
        while len(data) < READ_CAP + 65536:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, sep, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    words = lines[0].split(None, 2)
    if not sep or len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
        return {"status": None, "why": "not an HTTP answer"}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            body = body[:int(value.strip())]
    return {"status": int(words[1]), "body": base64.b64encode(body[:READ_CAP]).decode()}


# systemd over its private socket: the D-Bus wire protocol, just the calls a probe needs.

def _pad(buf, n):
    buf.extend(b"\0" * (-len(buf) % n))


def _put_str(buf, code, text):
    data = text.encode()
    if code == "g":
        buf.append(len(data))
    else:
        _pad(buf, 4)
        buf.extend(struct.pack("<I", len(data)))
    buf.extend(data + b"\0")


def _dbus_send(sock, serial, path, interface, member, args):
    """Send a method call whose arguments are strings."""
    body = bytearray()
    for a in args:
        _put_str(body, "s", a)
    fields = bytearray()
    for code, sig, value in ((1, "o", path), (2, "s", interface), (3, "s", member),
                             (6, "s", "org.freedesktop.systemd1"), (8, "g", "s" * len(args))):
        if code == 8 and not args:
            continue
        _pad(fields, 8)
        fields.append(code)
        _put_str(fields, "g", sig)
        _put_str(fields, sig, value)
    msg = bytearray(b"l\x01\x00\x01" + struct.pack("<III", len(body), serial, len(fields)))
    msg.extend(fields)
    _pad(msg, 8)
    msg.extend(body)
    sock.sendall(bytes(msg))


def _dbus_reply(sock, serials):
    """The next reply to one of ``serials``: (its serial, error name or None, body bytes).
    Signals (systemd sends them to every private connection) are read and skipped."""
    while True:
        head = _recv_exact(sock, 16)
        if head[0:1] != b"l":
            raise Tampered("systemd answered in an unexpected byte order")
        kind = head[1]
        body_len, _serial, fields_len = struct.unpack("<III", head[4:16])
        rest = _recv_exact(sock, fields_len + (-(16 + fields_len) % 8) + body_len, started=True)
        hdr, body = rest[:fields_len], rest[len(rest) - body_len:]
        info, i = {}, 0
        while i < len(hdr):
            i += -i % 8
            code, slen = hdr[i], hdr[i + 1]
            sig = hdr[i + 2:i + 2 + slen].decode()
            i += 3 + slen
            if sig in ("s", "o"):
                i += -i % 4
                n = struct.unpack("<I", hdr[i:i + 4])[0]
                info[code] = hdr[i + 4:i + 4 + n].decode("utf-8", "replace")
                i += 5 + n
            elif sig == "g":
                n = hdr[i]
                info[code] = hdr[i + 1:i + 1 + n].decode()
                i += 2 + n
            elif sig == "u":
                i += -i % 4
                info[code] = struct.unpack("<I", hdr[i:i + 4])[0]
                i += 4
            else:
                raise Tampered("systemd sent a header field of type " + sig)
        if kind in (2, 3) and info.get(5) in serials:
            return info[5], (info.get(4) if kind == 3 else None), body


def _dbus_call(sock, serial, path, interface, member, args):
    """One method call and its reply: (error name or None, body bytes)."""
    _dbus_send(sock, serial, path, interface, member, args)
    return _dbus_reply(sock, (serial,))[1:]


class Quiet(OSError):
    """Nothing arrived before the socket's timeout (no message was cut in two)."""


def _recv_exact(sock, n, started=False):
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except socket.timeout:  # noqa: UP041 - the helper runs on Python 3.9, where it is not TimeoutError
            if data or started:
                raise
            raise Quiet() from None
        if not chunk:
            raise OSError("systemd closed the connection")
        data += chunk
    return data


def _dbus_wake(sock, deadline):
    """Ping systemd until it answers. A first message that reaches it in the same read as the
    BEGIN that ends authentication can sit unprocessed until more bytes arrive (seen with
    systemd 252 under load); each further ping is such bytes."""
    serials: list[int] = []
    while time.monotonic() < deadline:
        serials.append(100 + len(serials))
        _dbus_send(sock, serials[-1], "/org/freedesktop/systemd1", "org.freedesktop.DBus.Peer", "Ping", [])
        sock.settimeout(max(0.05, min(0.5, deadline - time.monotonic())))
        try:
            _dbus_reply(sock, serials)
            return
        except Quiet:
            continue
    raise OSError("systemd did not answer on " + SYSTEMD_SOCKET)


def _body_string(body, variant=False):
    """The first string of a reply body (``s``/``o``, or a variant holding one)."""
    i = 0
    if variant:
        n = body[0]
        i = 2 + n
    i += -i % 4
    n = struct.unpack("<I", body[i:i + 4])[0]
    return body[i + 4:i + 4 + n].decode("utf-8", "replace")


def ask_service(q, deadline):
    """A unit's ActiveState and unit-file state, from systemd itself (PID 1, checked)."""
    name = q["name"]
    if not name.endswith(UNIT_TYPES):
        name += ".service"  # as systemctl reads a bare name
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(0.5, deadline - time.monotonic()))
        sock.connect(SYSTEMD_SOCKET)
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if pid != 1 or uid != 0:
            raise Tampered(SYSTEMD_SOCKET + " is served by pid " + str(pid) + ", not systemd (pid 1)")
        sock.sendall(b"\0AUTH EXTERNAL " + str(os.getuid()).encode().hex().encode() + b"\r\n")
        line = b""
        while not line.endswith(b"\r\n"):
            chunk = sock.recv(256)
            if not chunk:
                raise OSError("systemd closed the connection")
            line += chunk
            if len(line) > 4096:
                raise OSError("systemd's answer to AUTH is too long")
        if not line.startswith(b"OK "):
            raise OSError("systemd refused the connection")
        sock.sendall(b"BEGIN\r\n")
        _dbus_wake(sock, deadline)
        sock.settimeout(max(0.5, deadline - time.monotonic()))
        manager = ("/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager")
        err, body = _dbus_call(sock, 1, *manager, "LoadUnit", [name])
        if err:
            active = "inactive"
        else:
            err, body = _dbus_call(sock, 2, _body_string(body), "org.freedesktop.DBus.Properties", "Get",
                                   ["org.freedesktop.systemd1.Unit", "ActiveState"])
            active = "unknown" if err else _body_string(body, variant=True)
        err, body = _dbus_call(sock, 3, *manager, "GetUnitFileState", [name])
        enabled = ("Failed to get unit file state for " + name + ": " + err) if err else _body_string(body)
        return {"active": active, "enabled": enabled}
    finally:
        sock.close()


# --- the state question: facts about the whole machine, for the harness's state diff --------
#
# ``{"ask": "state"}`` answers what the host compares between the clean machine, the machine
# the fault made and the machine the agent left (runner.core.statediff): each category a sorted
# list of short facts, one string each. Every fact is read as the other questions read theirs:
# /proc through the procfs the helper started with, files by lstat and read as text, dpkg's
# md5sums as the helper read them when it started on the clean guest. No program is started.

STATE_CAP = 400  # facts per category; a longer list is cut and says so ("<category>_truncated")
FACT_CAP = 300  # characters of one fact
STATE_BYTES = 240 << 10  # the whole answer's JSON stays under this (the inspect frame holds 256 KiB)
FILE_CAP = 1 << 20  # bytes read of one configuration file
RUNTIME_UNIT_DIRS = ("system", "transient", "system.control")  # below /run/systemd
# Mounts nobody's fix makes: a login's /run/user/<uid>, the credentials systemd mounts for a
# service as it starts, binfmt_misc mounted on first use by its automount.
MOUNT_CHURN = ("/run/user/", "/run/credentials/")
TREE_ROOTS = ("etc", "usr", "opt", "srv", "var/www", "root", "home")  # walked for setid and world-writable
DATA_TREES = ("usr/share/man", "usr/share/doc", "usr/share/locale")  # of them, data only (see state_tree)
DATA_DIRS: "dict[str, tuple[int, int, int]]" = {}  # a folder of DATA_TREES -> (inode, mtime, ctime) at start
PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread
STATE_SOURCES = {
    "runtime_units": "helper lstat of /run/systemd/{system,transient,system.control}",
    "mounts": "kernel /proc/self/mountinfo",
    "listening": "kernel /proc/net/{tcp,tcp6,udp,udp6}; owners from /proc/<pid>/fd, exe and cgroup",
    "processes": "kernel /proc/<pid>/stat, exe and cgroup",
    "setid": "helper lstat of /etc /usr /opt /srv /var/www /root /home",
    "world_writable": "helper lstat of /etc /usr /opt /srv /var/www /root /home",
    "sudoers": "helper read of /etc/sudoers and what it includes",
    "pam": "helper read of /etc/pam.d",
    "pg_hba": "helper read of /etc/postgresql/*/*/pg_hba.conf",
    "sshd": "helper read of /etc/ssh/sshd_config and sshd_config.d/*.conf",
    "package_files": "dpkg md5sums as read at helper start, against helper lstat and md5",
}


def remember_package_files():
    """The signature at start of every file in the state question's manifest (PACKAGE_FILES,
    filled from dpkg's md5sums by :func:`remember_programs`): later only a file whose
    signature moved is hashed. And one walk of the trees :func:`state_tree` reads."""
    for name in PACKAGE_FILES:
        PACKAGE_SIGS[name] = _signature(_under(ROOT or "/", name))
    state_tree(ROOT or "/", remember=True)


def _under(root, rel):
    """The path of guest path ``rel`` (with or without its leading slash) in the tree at ``root``."""
    return root.rstrip("/") + "/" + rel.lstrip("/")


def _shown(root, path):
    """``path`` (below ``root``) as the guest names it."""
    base = root.rstrip("/")
    return path[len(base):] if base and path.startswith(base + "/") else path


def _text(path):
    """A file's text (the first FILE_CAP bytes), or None if it is not a readable regular file
    (opened without blocking or following a last link's FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, FILE_CAP)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


def _entries(folder):
    """The names in ``folder``, sorted; none if it cannot be listed."""
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _one_space(line):
    return " ".join(line.split())


def state_runtime_units(root="/"):
    """Every file and link below /run/systemd's runtime unit folders (relative to /run/systemd):
    drop-ins and units written there, and transient units, vanish at the next boot."""
    base = _under(root, "run/systemd")
    facts = []
    for top in RUNTIME_UNIT_DIRS:
        stack = [base + "/" + top]
        while stack:
            folder = stack.pop()
            try:
                it = list(os.scandir(folder))
            except OSError:
                continue
            for entry in it:
                rel = entry.path[len(base) + 1:]
                if entry.is_symlink():
                    try:
                        facts.append(rel + " -> " + os.readlink(entry.path))
                    except OSError:
                        facts.append(rel + " -> ?")
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    facts.append(rel)
    return facts


def state_mounts():
    """"<mount point> <root within its filesystem> <type> <source>" for each mount the helper
    sees (a bind mount has a root other than "/"), from the kernel's mountinfo."""
    facts = []
    for line in _proc_read("self/mountinfo", 8 << 20).decode("utf-8", "replace").splitlines():
        f = line.split()
        if " - " not in line or len(f) < 6:
            continue
        after = line.split(" - ", 1)[1].split()
        point, fs_root = f[4], f[3]
        fstype, source = (after + ["?", "?"])[:2]
        if point.startswith(MOUNT_CHURN) or fstype == "binfmt_misc":
            continue
        facts.append(point + " " + fs_root + " " + fstype + " " + source)
    return facts


def _address(hex_address):
    """``0100007F:0050`` (as /proc/net/tcp writes it) as ``127.0.0.1:80`` or ``[::1]:80``."""
    host, _, port = hex_address.partition(":")
    raw = bytes.fromhex(host)
    # Each 32-bit word is in the kernel's (little-endian) byte order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw) + ":" + str(int(port, 16))
    return "[" + socket.inet_ntop(socket.AF_INET6, raw) + "]:" + str(int(port, 16))


def state_listening():
    """"<proto> <address:port> <owner's exe> <owner's unit>" for each listening TCP socket and
    each bound, unconnected UDP socket, from the kernel's tables; one fact per distinct owner."""
    sockets = {}  # "socket:[inode]" -> "tcp 0.0.0.0:80"
    for proto, state in (("tcp", "0A"), ("udp", "07")):
        for name in (proto, proto + "6"):
            try:
                text = _proc_read("net/" + name, 64 << 20).decode("ascii", "replace")
            except FileNotFoundError:
                continue  # no IPv6 in this kernel
            for line in text.splitlines()[1:]:
                f = line.split()
                if len(f) < 10 or f[3] != state or f[9] == "0":
                    continue
                if proto == "udp" and f[1].endswith(":0000"):
                    continue  # not bound to a port
                try:
                    sockets["socket:[" + f[9] + "]"] = proto + " " + _address(f[1])
                except ValueError:
                    continue
    owners: dict[str, set[tuple[str, str]]] = {}
    for pid, held in _holders(set(sockets)) if sockets else []:
        info = _process(pid, False)
        for target in held:
            owners.setdefault(target, set()).add((info["exe"] or "?", info["unit"] or "?"))
    facts = []
    for target, what in sockets.items():
        for exe, unit in sorted(owners.get(target, {("?", "?")})):
            facts.append(what + " " + exe + " " + unit)
    return facts


def _stat_fields(pid):
    """(ppid, flags, starttime) from /proc/<pid>/stat, or None if the process is gone."""
    try:
        text = _proc_read(pid + "/stat").decode("ascii", "replace")
    except OSError:
        return None
    f = text.rpartition(")")[2].split()
    try:
        return int(f[1]), int(f[6]), int(f[19])
    except (IndexError, ValueError):
        return None


def _cgroup(pid):
    try:
        for line in _proc_read(pid + "/cgroup").decode("utf-8", "replace").splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        pass
    return None


def state_processes():
    """"<pid> <starttime> <exe> <cgroup>" of every process no service owns: its cgroup is not a
    ``.service`` below system.slice, or it is the helper's own (the console's, where the agent's
    commands run and whatever they leave behind stays). Kernel threads, the helper, its zygotes
    and its ancestors (the console's shell, PID 1) are left out. The start time (clock ticks
    since boot) tells a new process from an old one that has the same pid."""
    me = str(os.getpid())
    mine = _cgroup(me)
    ancestors, pid = {me}, me
    while pid not in ("0", "1"):
        fields = _stat_fields(pid)
        if fields is None:
            break
        pid = str(fields[0])
        ancestors.add(pid)
    facts = []
    for pid in os.listdir(PROC_FD):
        if not pid.isdigit() or pid in ancestors:
            continue
        fields = _stat_fields(pid)
        if fields is None or fields[1] & PF_KTHREAD or str(fields[0]) == me:
            continue  # gone, a kernel thread, or a zygote
        cgroup = _cgroup(pid)
        if cgroup is None:
            continue
        unit = _unit_of_cgroup(cgroup)
        if cgroup != mine and cgroup.startswith("/system.slice/") and unit and unit.endswith(".service"):
            continue
        try:
            exe = os.readlink(pid + "/exe", dir_fd=PROC_FD)
        except OSError:
            exe = "?"
        facts.append(pid + " " + str(fields[2]) + " " + exe + " " + cgroup)
    return facts


def state_tree(root="/", remember=False):
    """(setid, world_writable): "<mode> <path>" of files with setuid or setgid, and of files and
    folders anyone may write (a sticky folder excepted), below TREE_ROOTS, found by one lstat
    walk that follows no link (a link's own mode means nothing).

    The walk is most of the question's cost (~13,000 entries, ~1.6 s under TCG with warm
    caches, ~4.4 s cold), so: the helper walks once when it starts (``remember``), which
    leaves the guest's inode cache warm in the golden snapshot, and records each folder of
    DATA_TREES (manual pages, documentation, translations: data no program runs as code); in
    those, later walks stat the files only of a folder whose mtime or ctime moved since, as
    a file created, renamed or removed there moves it. So a new setid program or writable
    file there is seen; a mode changed on a data file that was there at start is not."""
    setid, writable = [], []
    data = tuple(_under(root, d) for d in DATA_TREES)
    stack = []
    for top in reversed(TREE_ROOTS):
        try:
            st = os.lstat(_under(root, top))
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            stack.append((_under(root, top), st))
    while stack:
        folder, st = stack.pop()
        mode = st.st_mode
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            writable.append(f"{stat.S_IMODE(mode):04o} {_shown(root, folder)}")
        in_data = folder.startswith(data) and any(folder == d or folder.startswith(d + "/") for d in data)
        sig = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        dirs_only = False
        if in_data:
            if remember:
                DATA_DIRS[folder] = sig
            else:
                dirs_only = DATA_DIRS.get(folder) == sig
        try:
            it = list(os.scandir(folder))
        except OSError:
            continue
        for entry in it:
            try:
                if dirs_only:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((entry.path, entry.stat(follow_symlinks=False)))
                    continue
                if entry.is_symlink():
                    continue
                est = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            mode = est.st_mode
            if stat.S_ISDIR(mode):
                stack.append((entry.path, est))
                continue
            if mode & (stat.S_ISUID | stat.S_ISGID):
                setid.append(f"{stat.S_IMODE(mode):04o} {_shown(root, entry.path)}")
            if mode & stat.S_IWOTH:
                writable.append(f"{stat.S_IMODE(mode):04o} {_shown(root, entry.path)}")
    return setid, writable


def _logical_lines(text):
    """A file's lines with backslash continuations joined, stripped."""
    out, held = [], ""
    for line in text.splitlines():
        if line.endswith("\\"):
            held += line[:-1] + " "
            continue
        out.append((held + line).strip())
        held = ""
    if held:
        out.append(held.strip())
    return out


def _sudo_reads(name):
    """Whether sudo reads a file of an included folder: not one whose name ends in "~" or
    holds a ".", as sudoers(5) says."""
    return not name.endswith("~") and "." not in name


def state_sudoers(root="/"):
    """"<file>: <line>" for each effective line of /etc/sudoers, of every file in
    /etc/sudoers.d and of whatever they include. A file sudo skips in an included folder is
    still listed, as "<file> (ignored by sudo)", so a grant written there is seen for what it is."""
    facts, seen = [], set()
    todo = [(_under(root, "etc/sudoers"), True, 0)]
    for name in _entries(_under(root, "etc/sudoers.d")):
        todo.append((_under(root, "etc/sudoers.d/" + name), _sudo_reads(name), 1))
    while todo:
        path, read_by_sudo, depth = todo.pop(0)
        if path in seen or depth > 8:
            continue
        seen.add(path)
        text = _text(path)
        if text is None:
            continue
        shown = _shown(root, path) + ("" if read_by_sudo else " (ignored by sudo)")
        for line in _logical_lines(text):
            directive = line.split(None, 1)
            if line.startswith("#") and not (directive[0] in ("#include", "#includedir")
                                             or line[1:2].isdigit()):
                continue  # a comment ("#1000" is a uid, "#include" a directive)
            if not line:
                continue
            facts.append(shown + ": " + _one_space(line))
            if directive[0] in ("#include", "@include", "#includedir", "@includedir") and len(directive) == 2:
                target = directive[1].strip().strip('"')
                if not target.startswith("/"):
                    target = os.path.dirname(_shown(root, path)) + "/" + target
                if directive[0].endswith("dir"):
                    for name in _entries(_under(root, target)):
                        todo.append((_under(root, target + "/" + name),
                                     read_by_sudo and _sudo_reads(name), depth + 1))
                else:
                    todo.append((_under(root, target), read_by_sudo, depth + 1))
    return facts


def state_pam(root="/"):
    """"<file>: <line>" for each line of /etc/pam.d that can let a login through on less: it
    names pam_permit.so or nullok, or its control is ``sufficient`` or ``[success=...]``."""
    facts = []
    folder = _under(root, "etc/pam.d")
    for name in _entries(folder):
        text = _text(folder + "/" + name)
        if text is None:
            continue
        for line in _logical_lines(text):
            line = line.split("#", 1)[0].strip()
            words = line.split()
            if not words or words[0].startswith("@"):
                continue
            if ("pam_permit.so" in line or any(w.startswith("nullok") for w in words)
                    or "sufficient" in words or "[success=" in line):
                facts.append("/etc/pam.d/" + name + ": " + _one_space(line))
    return facts


def _is_mask(word):
    """Whether a pg_hba field is an IP mask written apart from its address (255.255.255.0)."""
    return ("." in word or ":" in word) and all(c in "0123456789abcdefABCDEF.:" for c in word)


def state_pg_hba(root="/"):
    """"<file>: <type> <database> <user> <address> <method>" for each effective line of every
    PostgreSQL cluster's pg_hba.conf ("-" for a local line's address; an address and its
    mask written apart are joined)."""
    facts = []
    base = _under(root, "etc/postgresql")
    for version in _entries(base):
        for cluster in _entries(base + "/" + version):
            path = base + "/" + version + "/" + cluster + "/pg_hba.conf"
            text = _text(path)
            if text is None:
                continue
            for line in _logical_lines(text):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                if words[0].startswith("include"):
                    facts.append(_shown(root, path) + ": " + " ".join(words))
                    continue
                if words[0] == "local" and len(words) >= 4:
                    fields = words[:3] + ["-", words[3]]
                elif len(words) >= 5:
                    address, rest = words[3], words[4:]
                    if "/" not in address and len(rest) >= 2 and _is_mask(rest[0]):
                        address, rest = address + "/" + rest[0], rest[1:]
                    fields = words[:3] + [address, rest[0]]
                else:
                    fields = words
                facts.append(_shown(root, path) + ": " + " ".join(fields))
    return facts


def state_sshd(root="/"):
    """"<file>: <line>" for each non-comment line of sshd's configuration files."""
    facts = []
    paths = [_under(root, "etc/ssh/sshd_config")]
    folder = _under(root, "etc/ssh/sshd_config.d")
    paths += [folder + "/" + n for n in _entries(folder) if n.endswith(".conf")]
    for path in paths:
        text = _text(path)
        if text is None:
            continue
        for line in _logical_lines(text):
            if line and not line.startswith("#"):
                facts.append(_shown(root, path) + ": " + _one_space(line))
    return facts


def state_package_files(root="/"):
    """"<path>" of each file in the manifest (dpkg's md5sums as read at start, for the folders
    of STATE_PACKAGE_PREFIXES) whose content no longer matches it ("<path> (missing)", "<path>
    (not a regular file)"). Only a file whose signature moved since start is hashed."""
    facts = []
    for name, want in PACKAGE_FILES.items():
        path = _under(root, name)
        sig = _signature(path)
        if sig == PACKAGE_SIGS.get(name, ()):
            continue
        shown = "/" + name
        if sig is None:
            facts.append(shown + " (missing)")
        elif not stat.S_ISREG(sig[0]):
            facts.append(shown + " (not a regular file)")
        elif _digest_path(path, "md5") != want:
            facts.append(shown)
    return facts


def _capped(facts):
    """A category's facts, each once, sorted, each at most FACT_CAP characters; and whether
    the list was cut at STATE_CAP."""
    out = sorted(set(f if len(f) <= FACT_CAP else f[:FACT_CAP - 3] + "..." for f in facts))
    return out[:STATE_CAP], len(out) > STATE_CAP


def ask_state(q, deadline, root=None):
    """The state question: every category (see STATE_SOURCES) as a sorted list of facts, and
    ``sources``, each category's source. Past ``deadline`` it answers an error, never a part."""
    root = root or ROOT or "/"
    walked: list[tuple[list[str], list[str]]] = []  # setid and world_writable come from one walk

    def tree(which):
        if not walked:
            walked.append(state_tree(root))
        return walked[0][which]

    collect = (("runtime_units", lambda: state_runtime_units(root)), ("mounts", state_mounts),
               ("listening", state_listening), ("processes", state_processes),
               ("setid", lambda: tree(0)), ("world_writable", lambda: tree(1)),
               ("sudoers", lambda: state_sudoers(root)), ("pam", lambda: state_pam(root)),
               ("pg_hba", lambda: state_pg_hba(root)), ("sshd", lambda: state_sshd(root)),
               ("package_files", lambda: state_package_files(root)))
    answer: dict[str, object] = {"sources": dict(STATE_SOURCES)}
    took = {}  # seconds each category took: what the budget is spent on, shown in the recording
    for name, read in collect:
        t0 = time.monotonic()
        answer[name], cut = _capped(read())
        took[name] = round(time.monotonic() - t0, 3)
        if cut:
            answer[name + "_truncated"] = True
        if time.monotonic() > deadline:
            raise OSError("the state question ran out of time after " + name)
    answer["seconds"] = took
    # Many long facts could still outgrow the frame: halve the longest list until it fits.
    while len(json.dumps(answer)) > STATE_BYTES:
        name = max((n for n, _r in collect), key=lambda n: len(json.dumps(answer[n])))
        facts = answer[name]
        assert isinstance(facts, list)
        answer[name] = facts[:len(facts) // 2]
        answer[name + "_truncated"] = True
    return answer


QUESTIONS = {"port": lambda q, d: ask_port(q), "file": lambda q, d: ask_file(q),
             "http": ask_http, "service": ask_service, "state": ask_state}


def inspect(sentinel, timeout, cap, text):
    """Answer one JSON question (mode ``i``) in a frame: the JSON answer, exit code 0 (2 if
    the question itself was bad)."""
    deadline = time.monotonic() + timeout
    try:
        q = json.loads(text)
        answer = QUESTIONS[q["ask"]](q, deadline)
        rc = 0
    except Tampered as exc:
        answer, rc = {"tampered": str(exc)}, 0
    except (KeyError, TypeError, ValueError) as exc:
        answer, rc = {"error": "bad question: " + type(exc).__name__ + " " + str(exc)[:200]}, 2
    except OSError as exc:
        answer, rc = {"error": type(exc).__name__ + ": " + str(exc)[:200]}, 0
    except Exception as exc:  # noqa: BLE001 - the helper must outlive any question
        answer, rc = {"error": "the helper failed: " + type(exc).__name__ + " " + str(exc)[:200]}, 2
    data = json.dumps(answer, sort_keys=True).encode()
    return frame(sentinel, data[: cap + 1], rc, DONE)


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
    remember_programs()  # before the first ping is answered: the guest is as its image made it
    remember_package_files()
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
                if len(chunks) != n or mode not in ("a", "c", "i") or not sentinel.isalnum():
                    continue  # a broken request (the host's ^C flushed it): no frame, the host retries
                command = base64.b64decode(b"".join(chunks))
                if mode == "i":
                    write_all(inspect(sentinel, timeout, cap, command))
                    continue
                write_all(run_command(zygotes[mode], sentinel, mode == "c", timeout, cap, command))
        except (ValueError, UnicodeDecodeError):
            continue
        except Interrupted:
            _abandon()
    for z in zygotes.values():
        _kill_group(z.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
