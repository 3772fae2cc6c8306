"""Child processes and the waits on them, without a VM.

``run_child`` must kill a child at its deadline even when it prints nothing,
say what failed with the child's last words, and show progress. Each wait
for something to come up (QMP, the serial console, the SSH master, the
llama-server, a cache lock) must end at its own deadline with its own error,
and never block past it inside one try.
"""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.backends import llama
from runner.backends.cachedir import file_lock, lock_path
from runner.backends.process import free_port, run_child
from runner.backends.qemu import Qemu
from runner.backends.serial import SerialGuest
from runner.backends.ssh import SshGuest
from runner.core.errors import GuestDown, InfraError, VMError

log = logging.getLogger("rootbench.test")


# --- run_child ---------------------------------------------------------------------------------

def test_a_silent_child_is_killed_at_its_deadline(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    t0 = time.monotonic()
    with pytest.raises(InfraError, match=r"sleeping took longer than 1s \(last output: none\)"):
        run_child(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60 >/dev/null"], what="sleeping",
                  timeout=1, log_file=tmp_path / "child.log", logger=log)
    assert time.monotonic() - t0 < 5
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped, not a zombie


def test_a_failing_child_is_named_with_its_last_output_line(tmp_path: Path) -> None:
    script = "echo starting; echo 'E: the mirror is unreachable'; echo; exit 3"
    with pytest.raises(InfraError) as err:
        run_child(["sh", "-c", script], what="fetching", timeout=30,
                  log_file=tmp_path / "child.log", logger=log)
    message = str(err.value)
    assert message.startswith("fetching failed (exit 3)")
    assert message.endswith("E: the mirror is unreachable") and str(tmp_path / "child.log") in message


def test_a_long_child_reports_progress(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    script = "for i in 1 2 3 4 5 6 7 8 9 10; do echo \"step $i\"; sleep 0.25; done"
    with caplog.at_level(logging.INFO, logger=log.name):
        run_child(["sh", "-c", script], what="building", timeout=30,
                  log_file=tmp_path / "child.log", logger=log, every=0.2)
    progress = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert len(progress) >= 5, progress  # about every 0.2 s of the child's 2.5 s
    assert all(m.startswith("building (") and ": step " in m for m in progress), progress
    assert len(set(progress)) == len(progress)  # a line is shown once, not again while unchanged


# --- waits that end at their deadline ------------------------------------------------------------

@pytest.fixture
def silent_listener() -> Iterator[socket.socket]:
    """A TCP port that accepts connections and never says a word (a guest still waking)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s


def test_the_ssh_master_wait_ends_at_its_deadline(tmp_path: Path,
                                                  silent_listener: socket.socket) -> None:
    """One try (ssh's own ConnectTimeout is 10 s) may not run past the wait's deadline."""
    port = silent_listener.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(GuestDown, match="ssh to the guest failed"):
        SshGuest(port, str(tmp_path / "no-key"), str(tmp_path), {}, connect_timeout=1.0)
    assert time.monotonic() - t0 < 5


def test_a_failed_ssh_connect_leaves_no_file_open(tmp_path: Path) -> None:
    """The master's log is read for the error and closed (it was left to the garbage collector)."""
    gc.collect()  # garbage left by earlier tests (an event loop of inspect-ai's) is not this test's leak
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(GuestDown, match=r"ssh to the guest failed: \S"):
            SshGuest(free_port(), str(tmp_path / "no-key"), str(tmp_path), {}, connect_timeout=0.5)
        gc.collect()
    leaks = [str(w.message) for w in caught
             if issubclass(w.category, ResourceWarning) and "event loop" not in str(w.message)]
    assert not leaks, leaks


def test_a_qmp_socket_that_never_greets_ends_at_the_deadline(tmp_path: Path) -> None:
    """QEMU stuck before its main loop accepts on QMP but never greets: no endless wait."""
    sock_path = tmp_path / "qmp.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(sock_path))
        server.listen(8)
        q = Qemu.__new__(Qemu)  # only what _connect_qmp reads: a live process and its socket
        q.accel, q.qmp_path, q.log_path = "tcg", sock_path, tmp_path / "qemu.log"
        q.proc = subprocess.Popen(["sleep", "60"])
        outcome: list[BaseException | object] = []

        def connect() -> None:
            try:
                outcome.append(q._connect_qmp(1.0))
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome.append(exc)

        try:
            t0 = time.monotonic()
            worker = threading.Thread(target=connect, daemon=True)
            worker.start()
            worker.join(10)
            assert not worker.is_alive(), "the QMP connect blocked past its deadline"
            assert time.monotonic() - t0 < 5
        finally:
            q.proc.kill()
            q.proc.wait(10)
    assert len(outcome) == 1 and isinstance(outcome[0], VMError), outcome
    assert str(outcome[0]) == "QEMU's QMP socket did not answer within 1s"


def test_a_qemu_that_exits_at_start_is_told_at_once(tmp_path: Path) -> None:
    q = Qemu.__new__(Qemu)
    q.accel, q.qmp_path, q.log_path = "tcg", tmp_path / "qmp.sock", tmp_path / "qemu.log"
    q.log_path.write_text("qemu-system-x86_64: -m 99999T: cannot set up guest memory\n")
    q.proc = subprocess.Popen(["sh", "-c", "exit 1"])
    q.proc.wait(10)
    with pytest.raises(VMError, match=r"^QEMU exited at start \(code 1\): .*cannot set up guest memory"):
        q._connect_qmp(10.0)


def test_a_missing_serial_console_is_guest_down(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(GuestDown, match="cannot connect to the serial console"):
        SerialGuest(str(tmp_path / "console.sock"), {}, connect_timeout=0.5)
    assert 0.5 <= time.monotonic() - t0 < 3


def test_a_held_cache_lock_times_out(tmp_path: Path) -> None:
    artefact = tmp_path / "image"
    lock_path(artefact).touch()
    # flock locks belong to an open file: a second open of the lock file, even here, must wait.
    with lock_path(artefact).open() as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with pytest.raises(InfraError, match="^timed out waiting for the lock on image x$"), \
                file_lock(artefact, "image x", timeout=1.0):
            pass
        assert 1.0 <= time.monotonic() - t0 < 3
    with file_lock(artefact, "image x", timeout=1.0):  # free again: taken at once
        pass


def _fake_server(tmp_path: Path, body: str) -> Path:
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!/bin/sh\n{body}\n")
    os.chmod(binary, 0o755)
    return binary


def test_a_llama_server_that_dies_at_start_says_why(tmp_path: Path) -> None:
    binary = _fake_server(tmp_path, "echo 'error: failed to load model'; exit 1")
    server = llama.LlamaServer(binary, tmp_path / "model.gguf", tmp_path / "server.log")
    with pytest.raises(InfraError, match=r"exited at start \(code 1\): error: failed to load model"):
        server.start()
    assert server.proc is not None and server.proc.poll() is not None


def test_a_llama_server_that_never_gets_healthy_is_stopped(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama, "HEALTH_TIMEOUT", 1.0)
    binary = _fake_server(tmp_path, "exec sleep 60")
    server = llama.LlamaServer(binary, tmp_path / "model.gguf", tmp_path / "server.log")
    t0 = time.monotonic()
    with pytest.raises(InfraError, match="did not become healthy within 1s"):
        server.start()
    assert time.monotonic() - t0 < 6
    assert server.proc is not None and server.proc.poll() is not None  # stopped, not left running


def test_free_ports_are_distinct() -> None:
    """QEMU forwards each guest port from its own host port: two forwards on one port fail."""
    from runner.backends.process import free_ports
    for _ in range(20):
        ports = free_ports(3)
        assert len(set(ports)) == 3 and all(1 <= p <= 65535 for p in ports)


def test_socket_dirs_fit_the_unix_path_cap_under_any_tmpdir(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A long TMPDIR (a test worker's, a user's) must not make QEMU's sockets unreachable."""
    from runner.backends.process import socket_dir

    short = tmp_path / "s"
    short.mkdir()
    deep = tmp_path / ("x" * 60) / ("y" * 40)
    deep.mkdir(parents=True)
    for tmpdir, under in ((short, short), (deep, Path("/tmp"))):
        monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
        made = socket_dir("rb-")
        try:
            assert made.parent == under and (made.stat().st_mode & 0o777) == 0o700
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(str(made / "console.sock"))  # fits: binding would raise OSError if not
        finally:
            shutil.rmtree(made)
    assert len(str(deep / "rb-12345678" / "console.sock")) > 107  # the long one would not fit
