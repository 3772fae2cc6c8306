"""Child processes the harness owns (QEMU, llama-server, builds): started tied to us, ended for sure.

None of them may outlive rootbench, each is always reaped, and a long one
(an image build, the llama-server compile) reports progress and is killed
at its deadline even if it goes silent. Those pieces live here once.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from runner.core.errors import InfraError
from runner.core.settings import whole_number

# The model first: every QEMU runs this many nice levels below rootbench (and so below the
# llama-server it starts, which runs at rootbench's own priority). Under TCG a guest that keeps
# its vCPU busy (cpu-hog's fault, a runaway loop an agent starts) takes a whole core; at the
# same priority it took 0.4-0.5 of a core from the model on 2 cores and about half its speed,
# so the scenario's own fault changed how many tokens fit in the model's time budget. At +10
# the kernel gives the vCPU about a tenth of a model thread's weight when both want a core (CFS
# weights 110 against 1024; measured 0.07-0.14 of a core), and the whole core when the model
# waits for the guest, as it does between turns: the guest's commands cost what they did
# whenever the model is not generating. Nice values compare within one session (autogroup),
# where rootbench's QEMUs and llama-server are. With as many model threads as cores even that
# tenth can stall the model's threads (see llama.DEFAULT_THREADS). `rootbench perf` measures
# it (busy_guest_gen_ratio); ROOTBENCH_GUEST_NICE=0 turns it off.
GUEST_NICE = 10
GUEST_NICE_ENV = "ROOTBENCH_GUEST_NICE"

# Linux caps a Unix socket's path at 108 bytes with its NUL; the longest name put in a socket
# directory ("console.sock", "nowhere.sock") is 12, and a margin keeps room for more.
_SOCKET_PATH_MAX = 107
_SOCKET_NAME_ROOM = 16


def socket_dir(prefix: str) -> Path:
    """A new private directory (0700) for Unix sockets, made where every socket in it fits the
    path cap: under the temporary directory (``TMPDIR``) when its path is short enough, else
    under ``/tmp``. A user's or a test worker's long ``TMPDIR`` must not make QEMU's
    console and QMP sockets unreachable. The caller removes it."""
    fits = _SOCKET_PATH_MAX - _SOCKET_NAME_ROOM
    for parent in (tempfile.gettempdir(), "/tmp"):
        if len(parent) + 1 + len(prefix) + 8 <= fits:  # mkdtemp adds 8 random characters
            made = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            if len(str(made)) <= fits:
                return made
            made.rmdir()
    raise InfraError(f"no directory short enough for Unix sockets (TMPDIR={tempfile.gettempdir()!r})")


def free_port() -> int:
    """A TCP port on the loopback that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on the loopback that were free a moment ago.

    Their sockets are held open together while the ports are chosen: two calls
    of :func:`free_port` in a row may get the same port back (QEMU then refused
    to forward two guest ports from one host port, seen once in the VM tests).
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                 for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def die_with_parent() -> None:
    """``preexec_fn``: SIGKILL the child if rootbench itself dies, so nothing is orphaned."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def guest_nice(env: Mapping[str, str] | None = None) -> int:
    """The nice increment for QEMU: :data:`GUEST_NICE`, or ``$ROOTBENCH_GUEST_NICE`` (0 to 19)."""
    return whole_number(GUEST_NICE_ENV, GUEST_NICE, 0, 19, env, low_means="off")


def _lowered_child(nice: int) -> None:
    """``preexec_fn``: :func:`die_with_parent`, then ``nice`` levels lower priority (in the
    child before it runs QEMU, so every thread QEMU starts inherits it)."""
    die_with_parent()
    if nice:
        with contextlib.suppress(OSError):  # raising one's own nice value is always allowed
            os.nice(nice)


def lowered(nice: int) -> Callable[[], None]:
    """The ``preexec_fn`` for a child that dies with rootbench and runs ``nice`` levels below it."""
    return functools.partial(_lowered_child, nice)


def end_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; always reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def last_line(path: Path) -> str:
    """The last non-blank line of a (log) file, or ""."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - 8192))
            lines = [ln for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def run_child(cmd: list[str], *, what: str, timeout: float, log_file: Path,
              logger: logging.Logger, every: float = 10.0,
              env: dict[str, str] | None = None) -> None:
    """Run a long child process to completion, its output in ``log_file``.

    Every ``every`` seconds the child's latest output line is logged, so long
    builds show progress. The deadline holds even when the child prints
    nothing: the wait is on the process, not on its output. On timeout or
    failure the child is killed and reaped, and the error names ``what``
    and the last line it printed.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + timeout
    with log_file.open("ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, preexec_fn=die_with_parent)
        try:
            shown = ""
            next_report = t0 + every
            while True:
                try:
                    # Woken by the child's exit, its deadline or the next report, whichever is first.
                    rc = proc.wait(timeout=max(0.05, min(deadline, next_report) - time.monotonic()))
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if now >= deadline:
                    raise InfraError(f"{what} took longer than {timeout:.0f}s "
                                     f"(last output: {last_line(log_file)[:120] or 'none'})")
                if now >= next_report:
                    next_report = now + every
                    line = last_line(log_file)
                    if line and line != shown:
                        shown = line
                        logger.info("%s (%.0fs): %s", what, now - t0, line[:110])
        finally:
            end_process(proc, grace=2)
    if rc != 0:
        raise InfraError(f"{what} failed (exit {rc}); see {log_file}: {last_line(log_file)[:160]}")
