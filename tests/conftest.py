"""Shared fixtures. VM tests boot real QEMU from the real image (built on first use).

The command line is run in this process (:func:`run_cli`, the ``cli`` fixture): a child
``python -m runner`` costs a second of start-up per call. Only a test about what a process
alone shows (a signal and its exit status, another user, the module entry point, a server
process) starts one, through :func:`run_cli_process`.

Tests live in a folder per kind, and the folder is the kind: ``unit/`` needs neither a VM
nor a model (``make test-fast``), ``vm/`` boots real QEMU VMs, ``model/`` talks to a real
llama-server with a real model, ``browser/`` drives Debian's headless Chromium, ``package/``
builds the wheel into a fresh venv. :func:`pytest_collection_modifyitems` gives each test its
folder's marker (so ``-m "not vm"`` and the folders agree) and refuses a ``unit/`` test that
carries another kind's marker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:  # the image fixture imports the backend when a test first asks for it
    from runner.backends.images import BuiltImage


def qemu_pids() -> set[int]:
    """PIDs of every qemu-system process on the machine."""
    out = subprocess.run(["pgrep", "-f", "qemu-system-x86_64"], capture_output=True, text=True,
                         timeout=10)
    return {int(p) for p in out.stdout.split()} - {os.getpid()}


def qemu_children(parent: int | None = None) -> set[int]:
    """QEMU processes started by ``parent`` (default: this very process); other runs are left alone."""
    out = subprocess.run(["pgrep", "-P", str(parent or os.getpid()), "-f", "qemu-system-x86_64"],
                         capture_output=True, text=True, timeout=10)
    return {int(p) for p in out.stdout.split()}


def first_finished_episode(runs: Path, bench: subprocess.Popen[str], deadline: float) -> Path | None:
    """The ``results.json`` under ``runs`` of the bench running as ``bench``, once it holds a
    finished episode; None if the bench ends first or the monotonic ``deadline`` passes."""
    while time.monotonic() < deadline and bench.poll() is None:
        found = list(runs.glob("*/results.json"))
        if found and json.loads(found[0].read_text())["episodes"]:
            return found[0]
        time.sleep(0.2)
    return None


def snapshot_hashes(snapshot: Path) -> dict[str, tuple[str, int]]:
    """sha256 and permission bits of each file of a golden snapshot: what "never written" compares
    (the frozen overlays of an image's extra disks included)."""
    from runner.backends.cachedir import file_sha256
    from runner.backends.snapshot import FILES

    files = (*FILES, *sorted(p.name for p in snapshot.glob("frozen-*.qcow2")))
    return {f: (file_sha256(snapshot / f), (snapshot / f).stat().st_mode & 0o777) for f in files}


def assert_base_never_written(image: BuiltImage) -> None:
    """A restored and a cold-booted sandbox write their disks; the base (root and every extra
    disk) keeps the sha256 its build recorded and stays read-only."""
    from runner.backends.images import base_sha256, disk_sha256s
    from runner.backends.sandbox import Sandbox

    before = base_sha256(image)
    assert before == image.sha256
    assert disk_sha256s(image) == {d.name: d.sha256 for d in image.disks}
    extra = " ".join(f"/dev/vd{chr(ord('b') + i)}" for i in range(len(image.disks)))
    # Through the file system on the root, and straight onto each extra disk's device.
    scribble = ("dd if=/dev/urandom of=/var/tmp/junk bs=1M count=20 && "
                f"for d in {extra}; do dd if=/dev/urandom of=$d bs=1M count=4 seek=8 conv=notrunc; done; sync")
    with Sandbox(image.name, accel="tcg") as box:
        assert box.guest.exec(scribble, 60).exit_code == 0
    with Sandbox(image.name, accel="tcg", snapshot=False) as box:
        assert box.guest.exec(f"rm -rf /usr/share/doc && {scribble}", 60).exit_code == 0
    assert base_sha256(image) == before
    assert disk_sha256s(image) == {d.name: d.sha256 for d in image.disks}
    for path in (image.base, *(d.base for d in image.disks)):
        assert not os.access(path, os.W_OK) or os.stat(path).st_mode & 0o222 == 0


@pytest.fixture
def no_new_qemu() -> Iterator[None]:
    """Fail the test if it leaves a QEMU process behind (counting only QEMUs this process
    started, so another rootbench run on the same machine cannot make it fail)."""
    before = qemu_children()
    yield
    leaked = qemu_children() - before
    assert not leaked, f"QEMU processes left behind: {sorted(leaked)}"


@pytest.fixture(scope="session")
def image() -> BuiltImage:
    """The default image, built if the cache lacks it (the first run takes a few minutes)."""
    from runner.backends.images import ensure_image

    return ensure_image("debian-12-nginx")


# --- scenarios for tests that are not about lasting fixes ---------------------------------------

# Under judging rules 3 every passing episode is re-checked after a reboot of its guest, about a
# minute of TCG each. A test of scheduling, executors, signals or an agent API re-proves nothing
# by it (the re-check has its own tests: tests/vm/test_lasting.py, the whole-suite verify), and
# those reboots were a third of make test's time: such a test runs copies of the bundled specs
# that opt out, with the reason the spec format asks for.
NOT_ABOUT_LASTING = ("a test of {what}, not of lasting fixes: the reboot re-check has tests of "
                     "its own (tests/vm/test_lasting.py), here it only made each passing episode "
                     "a minute longer")


def quick_specs(folder: Path, ids: Sequence[str], what: str) -> Path:
    """``folder`` holding a copy of each bundled spec in ``ids`` that opts out of the reboot
    re-check (``lasting: {reboot: false, why: ...}``; a spec's own ``reboot: true`` goes), for a
    test of ``what``; the rest of each spec, its probes, fault and oracle, is the bundled one's."""
    import yaml

    from runner.core.paths import repo_root

    folder.mkdir(parents=True, exist_ok=True)
    for scenario_id in ids:
        text = (repo_root() / "specs" / f"{scenario_id}.yaml").read_text(encoding="utf-8")
        text = "".join(ln for ln in text.splitlines(keepends=True) if ln.rstrip() != "reboot: true")
        opt_out = {"lasting": {"reboot": False, "why": NOT_ABOUT_LASTING.format(what=what)}}
        (folder / f"{scenario_id}.yaml").write_text(
            text.rstrip("\n") + "\n" + yaml.safe_dump(opt_out, width=1000), encoding="utf-8")
    return folder


# --- the command line ---------------------------------------------------------------------------

CLI_TIMEOUT = 120.0  # seconds a command of a test may take before it fails the test


@dataclass(frozen=True)
class CliResult:
    """What ``rootbench ARGS`` gave: its exit code and all it wrote on stdout and stderr.

    The names are :class:`subprocess.CompletedProcess`'s, so a test reads the same either way.
    """

    returncode: int
    stdout: str
    stderr: str


class Cli(Protocol):
    """The ``cli`` fixture: ``cli("list", "--format", "json")``."""

    def __call__(self, *args: str, cwd: Path | None = None,
                 env: Mapping[str, str | None] | None = None,
                 timeout: float = CLI_TIMEOUT) -> CliResult: ...


class CliTimeout(BaseException):
    """The command outran its timeout (a BaseException: no ``except Exception`` of the CLI's
    takes it for an error of its own and goes on)."""


def _with_env(env: Mapping[str, str | None] | None) -> dict[str, str]:
    """This process's environment with ``env`` laid over it (a value of None removes the name)."""
    merged = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return merged


def _set_environ(wanted: Mapping[str, str]) -> None:
    for name in [n for n in os.environ if n not in wanted]:
        del os.environ[name]
    for name, value in wanted.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@dataclass
class _Captured:
    """What went to descriptors 1 and 2, filled in when the capture ends."""

    stdout: str = ""
    stderr: str = ""


@contextlib.contextmanager
def _fd_capture() -> Iterator[_Captured]:
    """File descriptors 1 and 2, and ``sys.stdout``/``sys.stderr`` on them, into two files.

    At the descriptor level, so what a child process the command starts writes there (a
    worker's last words) is caught too, as it was when the command was a process of its own.
    The text streams have a process's defaults: strict UTF-8 on stdout, backslash escapes on
    stderr; stdin reads nothing. They are flushed (closed) before the files are read.
    """
    captured = _Captured()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    for stream in saved_streams[1:]:
        stream.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            open(os.devnull, encoding="utf-8") as stdin:
        saved_fds = os.dup(1), os.dup(2)
        opened: list[IO[str]] = []
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            opened.append(open(1, "w", encoding="utf-8", errors="strict",  # noqa: SIM115
                               buffering=1, closefd=False))
            opened.append(open(2, "w", encoding="utf-8", errors="backslashreplace",  # noqa: SIM115
                               buffering=1, closefd=False))
            sys.stdin, sys.stdout, sys.stderr = stdin, opened[0], opened[1]
            yield captured
        finally:
            for stream in opened:
                with contextlib.suppress(Exception):  # a broken stream: what it holds is lost
                    stream.close()  # flushes what is left of a line; descriptors stay open
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            out.seek(0)
            err.seek(0)
            captured.stdout = out.read().decode("utf-8")
            captured.stderr = err.read().decode("utf-8")


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """:class:`CliTimeout` in this (the main) thread after ``seconds``, even within a blocking
    call (a FIFO's open): a hang fails the test instead of stopping the test run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(_signum: int, _frame: FrameType | None) -> None:
        raise CliTimeout(f"still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(*args: str, cwd: Path | None = None, env: Mapping[str, str | None] | None = None,
            timeout: float = CLI_TIMEOUT) -> CliResult:
    """``rootbench ARGS`` in this process: ``runner.app.cli.main``, as ``python -m runner`` runs it.

    ``cwd`` defaults to the checkout's root; ``env`` is laid over the environment (None
    removes a name). Whatever the command changes of this process's state is put back
    after it: the working directory, the environment, the standard streams and
    descriptors 1 and 2, the ``rootbench`` logger (``logs.setup`` sets its handler, level
    and propagation on each call), the SIGINT/SIGTERM handlers and :mod:`tempfile`'s
    directory (read again from ``TMPDIR``, as a new process would). An
    argparse error (``UsageError``), ``--help`` and ``--version`` end in ``SystemExit``:
    its code is the exit code, as for the process.
    """
    from runner.app import logs
    from runner.app.cli import main
    from runner.core.paths import repo_root

    logger = logging.getLogger(logs.ROOT)
    saved_logger = list(logger.handlers), logger.level, logger.propagate
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_tempdir = tempfile.tempdir
    code: int | None = None
    late: BaseException | None = None
    with _fd_capture() as captured:
        try:
            _set_environ(_with_env(env))
            os.chdir(cwd or repo_root())
            tempfile.tempdir = None  # gettempdir() reads TMPDIR again
            with _deadline(timeout):
                try:
                    code = main(list(args))
                except SystemExit as exc:  # as the interpreter turns it into an exit status
                    if exc.code is None or isinstance(exc.code, int):
                        code = exc.code or 0
                    else:
                        print(exc.code, file=sys.stderr)
                        code = 1
        except CliTimeout as exc:
            late = exc
        finally:
            tempfile.tempdir = saved_tempdir
            os.chdir(saved_cwd)
            _set_environ(saved_env)
            for sig, handler in saved_signals.items():
                if signal.getsignal(sig) is not handler:  # (only the main thread may set one)
                    signal.signal(sig, handler)
            logger.handlers[:] = saved_logger[0]
            logger.setLevel(saved_logger[1])
            logger.propagate = saved_logger[2]
    if late is not None:
        raise AssertionError(f"rootbench {' '.join(args)}: {late}; stderr so far:\n"
                             f"{captured.stderr[-3000:]}")
    assert code is not None
    return CliResult(code, captured.stdout, captured.stderr)


@pytest.fixture
def cli() -> Cli:
    """``cli(*args, cwd=None, env=None) -> CliResult``: the command line, in this process."""
    return run_cli


def cli_argv(*args: str) -> list[str]:
    """The command that starts ``rootbench ARGS`` as a process of its own."""
    return [sys.executable, "-m", "runner", *args]


def run_cli_process(*args: str, cwd: Path | None = None,
                    env: Mapping[str, str | None] | None = None, timeout: float = CLI_TIMEOUT,
                    prefix: Sequence[str] = (), **popen: Any) -> subprocess.CompletedProcess[str]:
    """``python -m runner ARGS`` in a child process, for what only a process shows (its own
    user, umask or signals, the module entry point); ``prefix`` goes before the interpreter
    (``setpriv ...``), ``env`` and ``cwd`` are as for :func:`run_cli`, ``popen`` goes to
    :func:`subprocess.run`. Prefer the ``cli`` fixture: this costs a second per call."""
    from runner.core.paths import repo_root

    return subprocess.run([*prefix, *cli_argv(*args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or repo_root(), env=_with_env(env),
                          stdin=subprocess.DEVNULL, **popen)


# The folder a test lives in is its kind; each gives its marker (see the module docstring).
KIND_MARKERS = {"vm": "vm", "model": "model", "browser": "browser", "package": "wheel"}
_HEAVY = {"vm", "model", "browser", "wheel", "soak"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its folder; a test under ``unit/`` marked as needing more is an error.

    Tests marked ``long(minutes=N)`` are moved to the front, longest first: ``make test`` runs
    on two workers (pytest-xdist, ``--dist loadfile``), and a long test's file started first is filled
    around by the other worker, where one started last would run alone at the end.
    """
    def minutes(item: pytest.Item) -> float:
        mark = item.get_closest_marker("long")
        return float(mark.kwargs.get("minutes", 1)) if mark else 0.0

    items.sort(key=minutes, reverse=True)  # stable: the rest stay as found
    here = Path(__file__).parent
    for item in items:
        kind = item.path.relative_to(here).parts[0] if item.path.is_relative_to(here) else ""
        if kind in KIND_MARKERS:
            item.add_marker(KIND_MARKERS[kind])
        elif kind == "unit":
            heavy = sorted(_HEAVY & {m.name for m in item.iter_markers()})
            if heavy:
                raise pytest.UsageError(f"{item.nodeid} is in tests/unit but marked {heavy}: "
                                        f"move it to the folder of its kind")


@pytest.fixture(autouse=True)
def _no_vm_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test under ``tests/unit`` that would boot a VM fails at once, naming itself.

    A unit test meant to replay a recording once found none (the scenario had gained hints) and
    booted a real guest instead: 194 s, and an infra-error under load. ``pytest.fail`` is not an
    ``Exception``, so no handler of the harness takes it for a broken VM and goes on."""
    here = Path(__file__).parent
    if not request.node.path.is_relative_to(here / "unit"):
        return
    from runner.backends import sandbox

    def refuse(self: object) -> None:
        pytest.fail(f"{request.node.nodeid} booted a VM: a unit test must replay or fake it "
                    "(tests/vm is where real guests run)", pytrace=False)

    monkeypatch.setattr(sandbox.Sandbox, "_start", refuse)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The time each part of the suite took (its folder: unit, vm, model, browser, package),
    summed over its tests' set-up, call and tear-down on every worker, so a slow ``make test``
    says where its time went (issue #47) beside pytest's own ``--durations`` list."""
    parts: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid, duration = getattr(report, "nodeid", ""), getattr(report, "duration", None)
            if not nodeid.startswith("tests/") or not isinstance(duration, float):
                continue
            part = nodeid.split("/")[1] if nodeid.count("/") > 1 else "tests"
            parts[part] = parts.get(part, 0.0) + duration
    total = sum(parts.values())
    if total <= 0:
        return
    terminalreporter.write_sep("=", "time per part (test time, summed over the workers)")
    for part, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{part:>10} {seconds:8.0f} s {seconds / total:6.1%}")
    terminalreporter.write_line(f"{'all':>10} {total:8.0f} s")


# --- an oracle bench for compare's tests (tests/unit/test_compare.py, tests/vm/test_compare_vm.py) ---

# Scenarios whose probes do not wait (no `within`): a noop run of each takes ~10-20 s under TCG.
IDS = ["rogue-port-80", "permission-403", "nginx-config-syntax", "masked-unit"]
ROUNDS = 2  # 4 scenarios x 2 rounds = 8 pairs: McNemar exact p = 2/256 if all differ one way


def _only_dir(parent: Path) -> Path:
    (run,) = [p for p in parent.iterdir() if p.is_dir()]
    return run


_ORACLE = Path(__file__).resolve().parent.parent / "recordings" / "oracle"


def _oracle_run(tmp: Path, ids: list[str], rounds: int) -> Path:
    """An oracle bench replayed offline from the committed cassettes, one copy per round."""
    rec = tmp / "rec"
    rec.mkdir()
    for i in ids:
        shutil.copy2(_ORACLE / f"{i}.jsonl", rec / f"{i}.jsonl")  # round 0
        for rnd in range(1, rounds):
            shutil.copy2(_ORACLE / f"{i}.jsonl", rec / f"{i}.r{rnd}.jsonl")
    r = run_cli("-q", "bench", "--agent", "oracle", "--record-to", str(rec), "--record-mode", "once",
                "--only", *ids, "--repeat", str(rounds), "--runs-dir", str(tmp / "oracle"))
    assert r.returncode == 0, r.stderr
    return _only_dir(tmp / "oracle")


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One oracle run shared by the module's tests (they only read it)."""
    return _oracle_run(tmp_path_factory.mktemp("oracle"), IDS, ROUNDS)


@pytest.fixture
def host_server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server of the test's own on the host's loopback; records anything that connects."""
    seen: list[bytes] = []
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                seen.append(conn.recv(100) or b"connected")
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nhost secret\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], seen
    stop.set()
    t.join(timeout=5)
    srv.close()
