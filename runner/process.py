"""Child processes the harness owns (QEMU, llama-server): started tied to us, ended for sure.

Both kinds must never outlive rootbench and must always be reaped, so the
three pieces they share live here once.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess


def free_port() -> int:
    """A TCP port on the loopback that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """``preexec_fn``: SIGKILL the child if rootbench itself dies, so nothing is orphaned."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


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
