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

The model is either an ``--endpoint`` every worker reaches, or, for a named
model or ``--model-file``, a llama-server per node (:class:`NodeServers`):
an actor pinned to each node starts it there, bound to that node's loopback
only, with as many slots as the node has ``vm`` units.

Joining the cluster has a deadline (``--ray-timeout``) and yields to SIGTERM and
Ctrl-C (:meth:`RayExecutor._join`), and Ray dials the address it is given
(:func:`import_ray`): a head that never answers is one line, exit 1, not a
driver stuck in Ray's own retries for a quarter of an hour.

Ray is an optional extra (``pip install 'rootbench[ray]'``): it is imported
through :func:`import_ray` only, so a plain install never needs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import secrets
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from runner.app import logs
from runner.app.agents import AgentChoice, ModelProvider
from runner.app.episodes import EpisodeJob
from runner.app.executors import CANCEL_GRACE, POLL, Done, Executor, WorkerLost, _Job
from runner.app.signals import signals_raise
from runner.backends.llama import (
    BUILD_TIMEOUT,
    LlamaServer,
    ensure_llama_server,
    fetch_model,
    llama_fingerprint,
)
from runner.backends.openai import OpenAIModel
from runner.core.errors import InfraError, InvalidInput, ModelServerError
from runner.core.model import ChatRequest, Model, ModelReply
from runner.core.outcomes import AgentKind
from runner.core.protocol import Protocol, choose_protocol, get_protocol
from runner.core.spec import Scenario
from runner.core.text import one_line

log = logging.getLogger("rootbench.bench")
VM_RESOURCE = "vm"  # the custom resource each node declares: how many VMs it runs at once
CONNECT_TIMEOUT = 5.0  # seconds to reach the head before --ray-address is called unreachable
JOIN_TIMEOUT = 60.0  # seconds joining the cluster may take (--ray-timeout's default)
# Ray's switch for single-machine use (its default on macOS and Windows), read once when Ray is
# imported: off, Ray keeps a loopback address as given. On, it rewrites 127.0.0.1 and localhost
# to this host's outside interface address, both in the address a driver dials and in a node's
# --node-ip-address, so a cluster bound to loopback could not be reached at its own address.
KEEP_LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def import_ray() -> ModuleType:
    """Ray, imported so that it dials the address it is given (:data:`KEEP_LOOPBACK`).

    The switch changes nothing else for a driver, which only joins a cluster: the node it
    runs on is found by its own files, and a multi-node cluster's addresses are not loopback
    ones. It is set for the import only (Ray reads it then), so no child process inherits it.
    """
    if "ray" not in sys.modules:
        saved = {name: os.environ.get(name) for name in KEEP_LOOPBACK}
        os.environ.update(KEEP_LOOPBACK)
        try:
            import ray  # Ray reads the switch here, once
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    import ray

    return ray


def reachable(address: str) -> None:
    """``--ray-address HOST:PORT`` parses and something answers there, or :class:`InvalidInput`."""
    host, _, port = address.rpartition(":")
    # ASCII digits, at most five: str.isdigit takes any script's, and int() will not read
    # an integer of 4,300 digits or more (a crash, not a one-line refusal).
    if "://" in address or not host or not re.fullmatch(r"[0-9]{1,5}", port) \
            or not 0 < int(port) < 65536:
        raise InvalidInput(f"not HOST:PORT (the head's GCS address, e.g. 10.0.0.5:6379): "
                           f"{one_line(address, 80)!r}", field="--ray-address")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT):
            pass
    except (OSError, UnicodeError) as exc:  # UnicodeError: a label the IDNA codec refuses
        why = getattr(exc, "strerror", None) or exc
        raise InvalidInput(f"nothing answers at {one_line(address, 80)} ({one_line(str(why))}); "
                           "is the Ray head running?", field="--ray-address") from None


def resolve_auto(env_var: str = "RAY_ADDRESS") -> str:
    """``--ray-address auto``: the local cluster's GCS address, resolved by Ray itself, as
    ``ray status`` and ``ray.init(address="auto")`` resolve it (``canonicalize_bootstrap_address_or_die``):
    ``RAY_ADDRESS`` if set, else the cluster the last ``ray start`` recorded in Ray's temp
    directory (``ray_current_cluster``), else the one GCS process running here. None found,
    or several and none recorded, is :class:`InvalidInput` in our words (Ray's name its own
    ``--address`` flag)."""
    import_ray()  # first: Ray keeps the recorded loopback address as it is
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError as exc:  # Ray moved its private helper: say so rather than guess
        raise InvalidInput(f"this Ray cannot resolve auto ({exc}); give HOST:PORT",
                           field="--ray-address") from None
    try:
        return str(canonicalize_bootstrap_address_or_die("auto"))
    except (ConnectionError, ValueError) as exc:
        several = re.search(r"\{.*\}", str(exc)) if "multiple" in str(exc) else None
        why = (f"several Ray clusters run on this machine ({several.group(0)}): give one as "
               "HOST:PORT" if several else "no running Ray cluster found on this machine "
               f"(start one with `ray start --head`, or give HOST:PORT or {env_var})")
        raise InvalidInput(f"auto: {why}", field="--ray-address") from None


class NodeModel(Model):
    """A model served by a llama-server on whichever node runs the episode.

    ``--executor ray`` with a named model (or ``--model-file``) and no
    ``--endpoint``: the driver hands this placeholder to the task, and the
    worker swaps it (:meth:`resolve`) for an :class:`OpenAIModel` talking to
    its own node's server, which the node's :class:`_NodeServer` actor starts
    on first use, bound to that node's loopback.
    """

    agent = AgentKind.MODEL

    def __init__(self, choice: AgentChoice, seed: int, actors: str) -> None:
        self.choice = choice
        self.name = choice.label()
        self.seed = seed
        self.actors = actors  # the actors' name prefix: <prefix>-<node id>

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        raise ModelServerError("a node's model is resolved on its Ray worker, never called here")

    def resolve(self) -> OpenAIModel:
        """This node's server as a model (on a Ray worker; the server starts on first use)."""
        import ray  # on a Ray worker: the optional extra is installed there

        node = ray.get_runtime_context().get_node_id()
        actor = ray.get_actor(f"{self.actors}-{node}")
        ref: ray.ObjectRef[tuple[str, dict[str, Any]]] = actor.endpoint.remote()  # _NodeServer's
        endpoint, fingerprint = ray.get(ref, timeout=BUILD_TIMEOUT)
        c = self.choice
        return OpenAIModel(endpoint, self.name, extra_fingerprint=fingerprint,
                           temperature=c.temperature, seed=self.seed, max_tokens=c.max_tokens)


class _NodeServer:
    """A Ray actor pinned to one node: that node's llama-server, on its loopback, ``slots`` slots.

    Started on the first episode that asks (building llama-server and fetching
    the model into the node's cache if they are missing), restarted if it
    died, stopped with the actor. Its log (and pid) go to a folder under the
    node's temp directory, named in the driver's progress lines.
    """

    def __init__(self, choice: AgentChoice, slots: int) -> None:
        self.choice = choice
        self.slots = slots
        self.folder = Path(tempfile.mkdtemp(prefix="rootbench-llama-"))
        self._server: LlamaServer | None = None
        self._fingerprint: dict[str, Any] = {}

    def endpoint(self) -> tuple[str, dict[str, Any]]:
        if self._server is None or not self._server.alive():
            if self._server is not None:
                self._server.stop()
            c = self.choice
            binary = ensure_llama_server(path=c.llama_server)
            model_path = Path(c.model_file) if c.model_file else fetch_model(c.model)
            self._server = LlamaServer(binary, model_path, self.folder / "llama-server.log",
                                       ctx_size=c.ctx_size, seed=c.seed, parallel=self.slots)
            self._server.start()
            assert self._server.proc is not None
            (self.folder / "llama-server.pid").write_text(f"{self._server.proc.pid}\n")
            self._fingerprint = llama_fingerprint(self._server, binary, model_path)
        return self._server.endpoint, self._fingerprint

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()


def _choose_on_node(model: NodeModel, requested: str) -> tuple[str, str]:
    """``--protocol auto`` asked of a node's server (the driver cannot reach its loopback)."""
    protocol, reason = choose_protocol(model.resolve(), requested=requested)
    return protocol.name, reason


class NodeServers(ModelProvider):
    """The model provider of a Ray bench: one :class:`_NodeServer` actor per node with ``vm``
    units (as many slots as it has units), created here and ended when the bench's model is done."""

    def __init__(self, executor: RayExecutor, choice: AgentChoice, run_dir: Path) -> None:
        super().__init__(choice, run_dir, parallel=executor.slots)
        self._executor = executor
        self._prefix = f"rootbench-llama-{secrets.token_hex(4)}"
        self._actors: list[Any] = []

    def __enter__(self) -> NodeServers:
        ray = self._executor._ray
        from ray.util.scheduling_strategies import (  # the optional extra, as in RayExecutor
            NodeAffinitySchedulingStrategy,
        )

        actor = ray.remote(_NodeServer)
        for node in ray.nodes():
            units = int((node.get("Resources") or {}).get(VM_RESOURCE, 0))
            if not node.get("Alive") or units < 1:
                continue
            self._actors.append(actor.options(
                name=f"{self._prefix}-{node['NodeID']}", num_cpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            ).remote(self.choice, units))
        log.info("a llama-server per node (%d node(s)), each on its own loopback, started by "
                 "the first episode there", len(self._actors))
        return self

    def __exit__(self, *exc: object) -> None:
        ray = self._executor._ray
        for actor in self._actors:
            with contextlib.suppress(Exception):  # a node that is gone has nothing to stop
                ray.get(actor.stop.remote(), timeout=60)
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self._actors.clear()

    def protocol(self, requested: str) -> tuple[Protocol, str]:
        if requested != "auto":
            return get_protocol(requested), f"--protocol {requested}"
        ray = self._executor._ray
        task = ray.remote(_choose_on_node).options(resources={VM_RESOURCE: 1}, num_cpus=0,
                                                   max_retries=0)
        with _signals_through_ray():
            name, reason = ray.get(task.remote(NodeModel(self.choice, self.choice.seed,
                                                         self._prefix), requested),
                                   timeout=BUILD_TIMEOUT)
        return get_protocol(name), reason

    def for_scenario(self, scenario: Scenario, round_: int = 0, protocol: str = "tools") -> Model:
        return NodeModel(self.choice, self.choice.seed + round_, self._prefix)


def _resolve(arg: Any) -> Any:
    """An episode whose model is a node's: with that node's server instead."""
    if isinstance(arg, EpisodeJob) and isinstance(arg.model, NodeModel):
        return dataclasses.replace(arg, model=arg.model.resolve())
    return arg


def _on_worker(fn: Callable[..., Any], args: tuple[Any, ...], verbosity: int) -> Any:
    """The task body on a Ray worker: progress lines as rootbench's, then the job itself."""
    logs.setup(verbosity)
    return fn(*(_resolve(a) for a in args))


def _same_address(dialled: str, given: str) -> bool:
    """Whether Ray's GCS address is the ``HOST:PORT`` given (a name counts as any address it
    resolves to: ``localhost:6379`` is ``127.0.0.1:6379``)."""
    d_host, _, d_port = dialled.rpartition(":")
    g_host, _, g_port = given.rpartition(":")
    if d_port != g_port:
        return False
    d_host, g_host = d_host.strip("[]"), g_host.strip("[]")
    if d_host == g_host:
        return True
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(g_host, int(g_port),
                                                              type=socket.SOCK_STREAM)}
    except (OSError, ValueError):
        return False
    return d_host in resolved


@contextlib.contextmanager
def _ray_stderr_to_file() -> Iterator[IO[bytes]]:
    """Within the block, the process's stderr (descriptor 2, where Ray's C++ core writes) goes
    to an unnamed file, yielded for reading; restored afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as said:
        os.dup2(said.fileno(), 2)
        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _lines(said: IO[bytes]) -> list[str]:
    """The lines Ray wrote in ``said``, each without its ``[time level pid tid] file:line:``
    prefix and cut to 200 characters."""
    said.seek(0)
    text = said.read().decode(errors="replace")
    return [re.sub(r"^\[[^]]*\]\s*(\S+:\d+:\s*)?", "", ln.strip())[:200]
            for ln in text.splitlines() if ln.strip()]


@contextlib.contextmanager
def _signals_through_ray() -> Iterator[None]:
    """Within the block, a signal's exception raised inside a blocking Ray call comes out as
    itself: SIGTERM or Ctrl-C (:class:`~runner.app.signals.Interrupted`), not a crash.

    ``ray.wait`` runs Python's signal handlers from its C++ loop and then returns as if
    nothing had been raised, so CPython raises ``SystemError`` ("returned a result with an
    exception set") with the handler's exception as its cause: a SIGTERM mid-episode was
    "unexpected error", exit 1, instead of interrupted, exit 143.
    """
    try:
        yield
    except SystemError as exc:
        cause = exc.__cause__
        if isinstance(cause, BaseException) and not isinstance(cause, Exception):
            raise cause from None
        raise


class _DropSigtermNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


@contextlib.contextmanager
def _without_sigterm_note() -> Iterator[None]:
    """Ray's note that a connect from a thread installs no SIGTERM handler, dropped: that is
    what rootbench wants (its own handlers stay)."""
    logger = logging.getLogger("ray._private.worker")
    note = _DropSigtermNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


class RayExecutor(Executor):
    """Jobs as Ray tasks, each needing one ``vm``; ``slots`` is the cluster's ``vm`` total."""

    remote = True
    setup_slack = 3 * 3600.0  # a fresh node may build llama-server, the image and the snapshot

    def __init__(self, address: str, *, max_jobs: int | None = None,
                 join_timeout: float = JOIN_TIMEOUT) -> None:
        ray = import_ray()  # the optional extra rootbench[ray]: only --executor ray needs it

        self._ray = ray
        # Ray prints its own messages (a worker that died, ...) on the driver's stdout, from a
        # thread, at any time: while the executor is open they go to stderr instead, so stdout
        # keeps only the command's answer (with --format json, one JSON document).
        self._stdout = contextlib.redirect_stdout(sys.stderr)
        self._stdout.__enter__()
        try:
            total, nodes = self._join(address, join_timeout)
        except BaseException:
            self._stdout.__exit__(None, None, None)
            raise
        self.slots = min(total, max_jobs) if max_jobs else total
        log.info("Ray cluster at %s: %d %s unit(s) on %d node(s)", address, total, VM_RESOURCE,
                 nodes)
        self._task = ray.remote(_on_worker).options(resources={VM_RESOURCE: 1}, num_cpus=0,
                                                    max_retries=0)
        self._queue: list[_Job] = []
        self._running: dict[Any, tuple[_Job, float]] = {}  # ObjectRef -> (job, deadline)

    def _join(self, address: str, timeout: float) -> tuple[int, int]:
        """Connect to the cluster within ``timeout`` seconds: its ``vm`` total and live nodes.

        Ray's connect blocks in its C++ core, retrying for about 13 minutes against a
        head that accepts and never answers, with no timeout to give it, and the main
        thread blocked there runs no signal handler: SIGTERM went unheard. So it runs in a
        thread of its own while this (main) thread waits against a monotonic deadline,
        with SIGTERM and SIGINT raising :class:`~runner.app.signals.Interrupted`. Past the
        deadline, the thread is abandoned to the process's exit (a daemon, still stuck in
        Ray's C++). From a thread, Ray installs no SIGTERM handler of its own (its handler,
        ``sys.exit(15)``, would have replaced rootbench's), and says so: that note is dropped.
        Ray's C++ core prints its connect warnings on the process's stderr while it retries:
        those go to a file instead, whose last line names the address Ray dialled when
        the deadline passes. A wrong address, another Ray version or a missing token is
        :class:`InvalidInput` naming the flag; no answer in time is an :class:`InfraError`.
        """
        ray = self._ray
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def connect() -> None:
            try:
                # log_to_driver off: Ray would print the workers' lines (and its raylet's) on
                # our stdout, which with --format json must be one JSON document. The driver
                # logs each episode's start and end; the workers' own lines stay in each
                # node's Ray session logs.
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
                outcome["dialled"] = ray.get_runtime_context().gcs_address
                outcome["total"] = int(ray.cluster_resources().get(VM_RESOURCE, 0))
                outcome["nodes"] = sum(1 for n in ray.nodes() if n.get("Alive"))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as it is
                outcome["error"] = exc
            finally:
                done.set()

        deadline = time.monotonic() + timeout
        with _ray_stderr_to_file() as said, _without_sigterm_note(), signals_raise():
            threading.Thread(target=connect, name="ray-join", daemon=True).start()
            while not done.wait(max(0.0, min(POLL, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    last = _lines(said)[-1:]
                    raise InfraError(
                        f"the Ray cluster at {address} did not answer within {timeout:.0f} s; is "
                        "it a Ray head's GCS port, of this Ray version?"
                        + (f" (Ray's last word: {last[0]})" if last else ""))
            said_lines = _lines(said)
        for line in said_lines:  # what Ray said on the way in: for -v, not the screen
            log.debug("Ray, joining: %s", line)
        error = outcome.get("error")
        if isinstance(error, (ConnectionError, RuntimeError, ValueError)):
            # Wrong address, another Ray version, or a token-authenticated cluster (Ray's default
            # for local clusters since 2.59) without RAY_AUTH_TOKEN or ~/.ray/auth_token here.
            raise InvalidInput(f"could not join the Ray cluster at {address} "
                               f"({str(error).splitlines()[0][:120] if str(error) else ''}); "
                               "with token authentication set RAY_AUTH_TOKEN (or "
                               "RAY_AUTH_TOKEN_PATH)", field="--ray-address") from None
        if error is not None:
            with contextlib.suppress(Exception):
                ray.shutdown()
            raise error
        if not _same_address(outcome["dialled"], address):
            ray.shutdown()
            raise InfraError(f"Ray dialled {outcome['dialled']}, not the {address} given: "
                             "it was imported before rootbench could keep loopback addresses")
        if outcome["total"] < 1:
            ray.shutdown()
            raise InvalidInput(f"the Ray cluster at {address} has no {VM_RESOURCE!r} resource: "
                               "start each node with ray start --resources '{\"vm\": 8}'",
                               field="--ray-address")
        return outcome["total"], outcome["nodes"]

    def provider(self, choice: AgentChoice, run_dir: Path, *,
                 log_label: str | None = None) -> ModelProvider:
        """A named model without ``--endpoint`` is served on each node by a llama-server of its
        own; an ``--endpoint`` (every node reaches it) and scripted agents as locally."""
        if choice.kind is AgentKind.MODEL and not choice.endpoint:
            return NodeServers(self, choice, run_dir)
        return ModelProvider(choice, run_dir, parallel=1, log_label=log_label)

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
        with _signals_through_ray():
            ready, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout)
        if not ready:
            return None
        job, _deadline = self._running.pop(ready[0])
        self._fill()
        try:
            with _signals_through_ray():
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
            with contextlib.suppress(Exception), _signals_through_ray():  # cancelled tasks raise
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
