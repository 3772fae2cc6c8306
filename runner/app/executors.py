"""Where a bench's (or verify's) jobs run, and how many at once.

A job is a module-level function and its (picklable) arguments; an executor
runs jobs and hands each result back to the one driver thread, which alone
writes the run directory. Three executors share that interface:

- :class:`InProcess` (``--jobs 1``): each job runs in the driver itself, when
  the driver asks for the next result: exactly the one-at-a-time bench of
  before, Ctrl-C included.
- :class:`ProcessPool` (``--jobs N``): up to N jobs at once, each in a child
  ``python -m runner.app.executors`` process of its own. A child is a whole
  rootbench episode with its own signal handling, so Ctrl-C or SIGTERM (which
  the terminal sends the children too, and the pool sends them again) tears
  each VM down exactly as a one-job bench does; a child that dies or overruns
  its deadline is :class:`WorkerLost`, never a lost bench.
- ``runner.app.ray_executor.RayExecutor`` (``--executor ray``): the same jobs
  as Ray tasks on a cluster.

:func:`auto_jobs` sizes ``--jobs auto`` from this host's cores (less those a model
server rootbench starts keeps for its threads), its free memory and the model
server's slots.
"""

from __future__ import annotations

import abc
import contextlib
import enum
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from runner.app import logs
from runner.app.agents import AgentChoice, ModelProvider
from runner.app.signals import Interrupted, signals_raise
from runner.backends.process import die_with_parent, end_process
from runner.core.errors import InfraError
from runner.core.registry import Registry

log = logging.getLogger("rootbench.bench")

MAX_JOBS = 64  # the most --jobs accepts: beyond it one host's QEMUs only contend
# What one more episode at once costs in memory, in MiB: the guest's 256 MiB (resident once
# touched, though the restored template's pages are shared through the page cache), QEMU's own
# ~100 MiB and the child Python process's ~60 MiB, rounded up. `rootbench perf` measures the
# resident memory of one restored QEMU (qemu_rss_mib) on your machine.
EPISODE_MIB = 512
RESERVE_MIB = 1024  # left to the host, the driver and the page cache
CANCEL_GRACE = 60.0  # seconds an interrupted child gets to tear its VM down before SIGKILL
POLL = 0.2  # seconds between looks at the children


class ExecutorKind(str, enum.Enum):
    """``--executor``: this host (``--jobs``), or a Ray cluster."""

    LOCAL = "local"
    RAY = "ray"


EXECUTORS: Registry[ExecutorKind] = Registry("executor", "--executor",
                                             {k.value: k for k in ExecutorKind})


class WorkerLost(InfraError):
    """The worker running a job died, or overran its deadline: that job ends as infra-error."""


@dataclass
class Done:
    """One finished job: its key and either its value or the exception it raised."""

    key: Hashable
    value: Any = None
    error: BaseException | None = None


@dataclass
class _Job:
    key: Hashable
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    timeout: float


class Executor(abc.ABC):
    """Runs jobs, at most ``slots`` at once, and returns their results one at a time."""

    slots: int = 1
    # Results come back from other machines: files a job writes (cassettes) must be shipped back
    # as data, not left on the worker's disk.
    remote: bool = False
    # Extra seconds on a job's deadline beyond its own budget (a fresh Ray node builds its cache).
    setup_slack: float = 900.0

    @abc.abstractmethod
    def submit(self, key: Hashable, fn: Callable[..., Any], args: tuple[Any, ...], *,
               timeout: float) -> None:
        """Queue ``fn(*args)``; it must end within ``timeout`` seconds of starting."""

    @abc.abstractmethod
    def next_done(self, timeout: float) -> Done | None:
        """The next finished job, or None if none finished within ``timeout`` seconds."""

    @property
    @abc.abstractmethod
    def busy(self) -> int:
        """Jobs submitted and not yet returned by :meth:`next_done`."""

    def provider(self, choice: AgentChoice, run_dir: Path, *,
                 log_label: str | None = None) -> ModelProvider:
        """Who serves ``choice``'s model to this executor's episodes: by default one
        :class:`ModelProvider` in the driver (a llama-server with a slot per episode at once)."""
        return ModelProvider(choice, run_dir, parallel=self.slots, log_label=log_label)

    def free(self) -> bool:
        """Whether one more job would start at once rather than wait."""
        return self.busy < self.slots

    def cancel(self) -> None:  # noqa: B027 - nothing to cancel by default
        """Stop every running job (tearing its VM down) and forget the queued ones."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release what the executor holds (a cluster connection); running jobs are cancelled."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.cancel()
        self.close()

    @contextlib.contextmanager
    def cancelling(self) -> Iterator[Executor]:
        """Within the block, an exception (Ctrl-C above all) cancels every running job first."""
        try:
            yield self
        except BaseException:
            self.cancel()
            raise


class InProcess(Executor):
    """``--jobs 1``: each job runs in the driver when the driver asks for the next result."""

    def __init__(self) -> None:
        self._queue: list[_Job] = []

    def submit(self, key: Hashable, fn: Callable[..., Any], args: tuple[Any, ...], *,
               timeout: float) -> None:
        self._queue.append(_Job(key, fn, args, timeout))

    def next_done(self, timeout: float) -> Done | None:
        if not self._queue:
            return None
        job = self._queue.pop(0)
        # Not caught: in-process, a job's exception (Ctrl-C above all) is the driver's, as before.
        return Done(job.key, job.fn(*job.args))

    @property
    def busy(self) -> int:
        return len(self._queue)

    def cancel(self) -> None:
        self._queue.clear()


@dataclass
class _Child:
    job: _Job
    proc: subprocess.Popen[bytes]
    folder: Path
    deadline: float
    started: float = field(default_factory=time.monotonic)


class ProcessPool(Executor):
    """``--jobs N``: up to N jobs at once, each in a child process of its own."""

    def __init__(self, slots: int) -> None:
        if not 1 <= slots <= MAX_JOBS:
            raise ValueError(f"slots must be 1 to {MAX_JOBS}, not {slots}")
        self.slots = slots
        self._queue: list[_Job] = []
        self._running: list[_Child] = []

    def submit(self, key: Hashable, fn: Callable[..., Any], args: tuple[Any, ...], *,
               timeout: float) -> None:
        self._queue.append(_Job(key, fn, args, timeout))
        self._fill()

    @property
    def busy(self) -> int:
        return len(self._queue) + len(self._running)

    def _fill(self) -> None:
        while self._queue and len(self._running) < self.slots:
            self._start(self._queue.pop(0))

    def _start(self, job: _Job) -> None:
        folder = Path(tempfile.mkdtemp(prefix="rootbench-job-"))
        (folder / "job.pickle").write_bytes(pickle.dumps((job.fn, job.args)))
        level = logging.getLogger(logs.ROOT).getEffectiveLevel()
        verbosity = -1 if level >= logging.WARNING else 1 if level <= logging.DEBUG else 0
        proc = subprocess.Popen([sys.executable, "-m", "runner.app.executors", str(folder),
                                 str(verbosity)], stdin=subprocess.DEVNULL,
                                preexec_fn=die_with_parent)
        self._running.append(_Child(job, proc, folder, time.monotonic() + job.timeout))

    def next_done(self, timeout: float) -> Done | None:
        deadline = time.monotonic() + timeout
        while True:
            for child in list(self._running):
                done = self._collect(child)
                if done is not None:
                    self._running.remove(child)
                    shutil.rmtree(child.folder, ignore_errors=True)
                    self._fill()
                    return done
            if not self._running or time.monotonic() >= deadline:
                return None
            time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))

    def _collect(self, child: _Child) -> Done | None:
        """The child's result once it has exited (or overrun its deadline); else None."""
        rc = child.proc.poll()
        if rc is None:
            if time.monotonic() < child.deadline:
                return None
            end_process(child.proc, grace=CANCEL_GRACE)
            return Done(child.job.key, error=WorkerLost(
                f"the episode did not end within {child.job.timeout:.0f}s; its worker was stopped"))
        result = child.folder / "result.pickle"
        if not result.is_file():
            how = f"signal {-rc}" if rc < 0 else f"code {rc}"
            return Done(child.job.key, error=WorkerLost(
                f"its worker process exited ({how}) before the episode ended"))
        try:
            status, value = pickle.loads(result.read_bytes())
        except Exception as exc:  # noqa: BLE001 - an unreadable result is a lost worker, not a crash
            return Done(child.job.key, error=WorkerLost(f"its worker's result is unreadable ({exc})"))
        return Done(child.job.key, value=value) if status == "ok" else Done(child.job.key,
                                                                           error=value)

    def cancel(self) -> None:
        """SIGTERM every child (each tears its VM down as a one-job bench does), wait, SIGKILL."""
        self._queue.clear()
        for child in self._running:
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CANCEL_GRACE
        for child in self._running:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait(timeout=10)
            shutil.rmtree(child.folder, ignore_errors=True)
        self._running.clear()

    def close(self) -> None:
        self.cancel()


def make_local(jobs: int) -> Executor:
    """The executor for ``--jobs N`` on this host."""
    return InProcess() if jobs == 1 else ProcessPool(jobs)


# --- --jobs auto ------------------------------------------------------------------------------

def _available_mib() -> int:
    """MemAvailable from /proc/meminfo, in MiB (0 when it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def host_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def jobs_limits(cores: int, available_mib: int, *, server_slots: int | None = None,
                reserve_mib: int = 0, model_threads: int = 0) -> dict[str, int]:
    """What bounds ``--jobs auto``, each bound by name: the smallest wins (see :func:`auto_jobs`).

    ``model_threads``: the threads of a llama-server rootbench starts for the bench. Under TCG
    a busy guest keeps a core busy, and the model comes first (its server runs above every
    QEMU, :data:`~runner.backends.process.GUEST_NICE`): the guests get the cores the model's
    threads leave, at least one, so a guest is never left to run only in the model's pauses.
    """
    by_memory = max(1, (available_mib - RESERVE_MIB - reserve_mib) // EPISODE_MIB)
    limits = {"cores": cores, "memory": by_memory, "the server's slots": server_slots or MAX_JOBS,
              "the cap": MAX_JOBS}
    if model_threads:
        limits["cores the model leaves"] = max(1, cores - model_threads)
    return limits


def auto_jobs(*, server_slots: int | None = None, reserve_mib: int = 0,
              model_threads: int = 0) -> tuple[int, str]:
    """``--jobs auto``: how many episodes at once this host can take, and why, in one line.

    The smallest of: the host's cores (under TCG a busy guest keeps one core
    busy) or, with a model server rootbench starts, the cores its
    ``model_threads`` leave (at least one); the VMs its available memory holds
    at :data:`EPISODE_MIB` each after :data:`RESERVE_MIB` and ``reserve_mib``
    (that model server); and ``server_slots`` (an ``--endpoint`` server's
    parallel slots, when it says; a llama-server rootbench starts is given as
    many as asked).
    """
    cores = host_cores()
    free = _available_mib()
    limits = jobs_limits(cores, free, server_slots=server_slots, reserve_mib=reserve_mib,
                         model_threads=model_threads)
    jobs = max(1, min(limits.values()))
    by = min(limits, key=lambda k: limits[k])
    why = (f"{jobs} ({cores} cores"
           + (f", {model_threads} of them the model's" if model_threads else "")
           + f"; {free} MiB available holds {limits['memory']} episodes at {EPISODE_MIB} MiB each"
           + (f"; the model server has {server_slots} slots" if server_slots else "")
           + f"; limited by {by})")
    return jobs, why


# --- the child process ------------------------------------------------------------------------

def _child(folder: Path, verbosity: int) -> int:
    """Run the job in ``folder/job.pickle``; its result (or exception) into ``result.pickle``.

    An interrupted job leaves no result and exits 130/143 after its ``with``
    blocks tore its VM down; the pool reads the missing result as "lost".
    """
    logs.setup(verbosity)
    fn, args = pickle.loads((folder / "job.pickle").read_bytes())
    try:
        with signals_raise(once=True):
            out: tuple[str, Any] = ("ok", fn(*args))
    except Interrupted as exc:
        return exc.code
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the driver, which decides
        out = ("error", exc)
    try:
        data = pickle.dumps(out)
    except Exception as exc:  # noqa: BLE001 - an exception that cannot be pickled is told as text
        data = pickle.dumps(("error", InfraError(f"{type(out[1]).__name__}: {exc}")))
    tmp = folder / "result.pickle.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / "result.pickle")
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1]), int(sys.argv[2])))
