"""``--executor ray``: a bench's episodes as Ray tasks on a cluster, through Ray, not a home-made engine.

Each episode is one task that needs one unit of the custom ``vm`` resource,
which each node declares (``ray start --resources '{"vm": 8}'``): Ray places
the tasks, at most that many per node. A node builds or reuses its own cache
(image, snapshot) under its ``~/.cache/rootbench`` on first use, as any
rootbench does. The worker records its cassette to a temporary file and
ships it back as text with the episode; the driver writes the run directory
exactly as a local bench does, so ``--resume``, ``report`` and ``replay``
work unchanged. A worker (or node) that dies mid-episode is :class:`WorkerLost`:
that episode is ``infra-error``, the bench goes on.

Ray is an optional extra (``pip install 'rootbench[ray]'``): it is imported
inside :class:`RayExecutor` only, so a plain install never needs it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import time
from collections.abc import Callable, Hashable
from typing import Any

from runner.app import logs
from runner.app.executors import CANCEL_GRACE, Done, Executor, WorkerLost, _Job
from runner.core.errors import InvalidInput

log = logging.getLogger("rootbench.bench")
VM_RESOURCE = "vm"  # the custom resource each node declares: how many VMs it runs at once
CONNECT_TIMEOUT = 5.0  # seconds to reach the head before --ray-address is called unreachable


def reachable(address: str) -> None:
    """``--ray-address HOST:PORT`` parses and something answers there, or :class:`InvalidInput`."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"not HOST:PORT (the head's GCS address, e.g. 10.0.0.5:6379): "
                           f"{address!r}", field="--ray-address")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT):
            pass
    except OSError as exc:
        raise InvalidInput(f"nothing answers at {address} ({exc.strerror or exc}); is the Ray "
                           "head running?", field="--ray-address") from None


def _on_worker(fn: Callable[..., Any], args: tuple[Any, ...], verbosity: int) -> Any:
    """The task body on a Ray worker: progress lines as rootbench's, then the job itself."""
    logs.setup(verbosity)
    return fn(*args)


class RayExecutor(Executor):
    """Jobs as Ray tasks, each needing one ``vm``; ``slots`` is the cluster's ``vm`` total."""

    remote = True
    setup_slack = 3 * 3600.0  # a fresh node may build llama-server, the image and the snapshot

    def __init__(self, address: str, *, max_jobs: int | None = None) -> None:
        import ray  # the optional extra rootbench[ray]: only --executor ray needs it

        self._ray = ray
        # Ray prints its own messages (a worker that died, ...) on the driver's stdout, from a
        # thread, at any time: while the executor is open they go to stderr instead, so stdout
        # keeps only the command's answer (with --format json, one JSON document).
        self._stdout = contextlib.redirect_stdout(sys.stderr)
        self._stdout.__enter__()
        try:
            total = self._join(address)
        except BaseException:
            self._stdout.__exit__(None, None, None)
            raise
        self.slots = min(total, max_jobs) if max_jobs else total
        log.info("Ray cluster at %s: %d %s unit(s) on %d node(s)", address, total, VM_RESOURCE,
                 sum(1 for n in ray.nodes() if n.get("Alive")))
        self._task = ray.remote(_on_worker).options(resources={VM_RESOURCE: 1}, num_cpus=0,
                                                    max_retries=0)
        self._queue: list[_Job] = []
        self._running: dict[Any, tuple[_Job, float]] = {}  # ObjectRef -> (job, deadline)

    def _join(self, address: str) -> int:
        """Connect to the cluster; its ``vm`` total, or :class:`InvalidInput` naming the flag."""
        ray = self._ray
        try:
            # log_to_driver off: Ray would print the workers' lines (and its raylet's) on our
            # stdout, which with --format json must be one JSON document. The driver logs each
            # episode's start and end; the workers' own lines stay in each node's Ray session logs.
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            # Wrong address, another Ray version, or a token-authenticated cluster (Ray's default
            # for local clusters since 2.59) without RAY_AUTH_TOKEN or ~/.ray/auth_token here.
            raise InvalidInput(f"could not join the Ray cluster at {address} "
                               f"({str(exc).splitlines()[0][:120]}); with token authentication "
                               "set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)",
                               field="--ray-address") from None
        try:
            total = int(ray.cluster_resources().get(VM_RESOURCE, 0))
        except BaseException:
            ray.shutdown()
            raise
        if total < 1:
            ray.shutdown()
            raise InvalidInput(f"the Ray cluster at {address} has no {VM_RESOURCE!r} resource: "
                               "start each node with ray start --resources '{\"vm\": 8}'",
                               field="--ray-address")
        return total

    @property
    def busy(self) -> int:
        return len(self._queue) + len(self._running)

    def submit(self, key: Hashable, fn: Callable[..., Any], args: tuple[Any, ...], *,
               timeout: float) -> None:
        self._queue.append(_Job(key, fn, args, timeout))
        self._fill()

    def _fill(self) -> None:
        level = logging.getLogger(logs.ROOT).getEffectiveLevel()
        verbosity = -1 if level >= logging.WARNING else 1 if level <= logging.DEBUG else 0
        while self._queue and len(self._running) < self.slots:
            job = self._queue.pop(0)
            ref = self._task.remote(job.fn, job.args, verbosity)
            self._running[ref] = (job, time.monotonic() + job.timeout)

    def next_done(self, timeout: float) -> Done | None:
        ray = self._ray
        if not self._running:
            return None
        for ref, (job, deadline) in list(self._running.items()):
            if time.monotonic() > deadline:
                ray.cancel(ref, force=True)
                del self._running[ref]
                self._fill()
                return Done(job.key, error=WorkerLost(
                    f"the episode did not end within {job.timeout:.0f}s; its Ray task was cancelled"))
        ready, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout)
        if not ready:
            return None
        job, _deadline = self._running.pop(ready[0])
        self._fill()
        try:
            return Done(job.key, value=ray.get(ready[0], timeout=60))
        except ray.exceptions.RayTaskError as exc:  # the job raised: the driver decides, as locally
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            return Done(job.key, error=cause or WorkerLost(str(exc).splitlines()[0]))
        except ray.exceptions.RayError as exc:  # the worker or its node died, or Ray lost the result
            return Done(job.key, error=WorkerLost(
                f"its Ray worker was lost ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"))

    def cancel(self) -> None:
        """Interrupt every task (its ``with`` blocks tear the VM down), wait, then force."""
        ray = self._ray
        self._queue.clear()
        refs = list(self._running)
        for ref in refs:
            with contextlib.suppress(Exception):  # a task may have just ended
                ray.cancel(ref, force=False)
        if refs:
            with contextlib.suppress(Exception):  # cancelled tasks raise on wait
                _done, left = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE)
                for ref in left:
                    ray.cancel(ref, force=True)
        self._running.clear()

    def close(self) -> None:
        try:
            self.cancel()
            self._ray.shutdown()
        finally:
            self._stdout.__exit__(None, None, None)
