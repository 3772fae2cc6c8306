"""``rootbench mcp SPEC``: one scenario served to an outside agent as an MCP server.

The sandbox is restored and the fault injected as for any run; an MCP client
(Claude Code, an IDE, any agent framework, the SDK's own client) then acts
through two tools, ``run_command`` and ``finish``, and reads the task from the
server's instructions or the ``task`` prompt. It is the same inversion as the
Python agent API (:mod:`runner.core.agent_api`): the client's tool calls are
the bridge model's replies, so budgets, forbidden commands, fix tracking,
milestones, judging, the cassette and replay are the bundled loop's code.

Every episode that starts ends judged (or ``infra-error``) with its cassette
complete, whatever the client, the transport or a signal does: on ``finish``,
when the budget runs out, when the client goes (stdio: its stdin closes, its
stdout breaks; streamable HTTP: it ends its session with a DELETE), when the
transport itself fails, and on SIGINT, SIGTERM or SIGHUP (the first one ends
the serving and the machine is judged; later ones are ignored while it is, which
is bounded). :func:`serve` holds that rule in one place: whatever ended the
transport, it then ends the episode and waits, bounded, for the verdict. No
thread this module starts can keep the process alive: the blocking calls into
the bridge, the stdio pipes and the episode all run on daemon threads (an AnyIO
worker thread is not one, and a worker left waiting held the process and its VM
for the judge's 900 s).

Streamable HTTP is a listener that hands out a root shell, so (:class:`Listener`)
it binds loopback unless ``--http-remote`` says otherwise (with a warning), is
bound before the VM starts (a busy port or an unknown host is one line, exit 2),
answers only requests that carry the server's bearer token (made afresh for each
server, shown once to the user who started it, compared in constant time), and
refuses a ``Host`` or ``Origin`` that names another site (DNS rebinding), on
loopback too.

Built on the official ``mcp`` SDK (``pip install 'rootbench[mcp]'``), imported
only here and only when the command runs.

Over stdio, the SDK's client stops a server by closing its stdin and, two
seconds later, killing its whole process group: far too soon to judge a
machine under TCG. So the stdio server runs the episode in a child process of
its own session (:func:`detach`), which keeps reading the same stdin and
writing the same stdout, and finishes judging and tearing down after the
client has gone. The parent passes on to the child any SIGINT, SIGTERM or SIGHUP
it gets, and exits with the child's status.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import ipaddress
import json
import logging
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from runner.app.episodes import RunOptions, run_one
from runner.app.runs import new_run_dir, write_results
from runner.app.signals import Interrupted
from runner.core import layout
from runner.core.agent_api import BridgeModel, EpisodeOver
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.outcomes import AgentKind
from runner.core.protocol import get_protocol
from runner.core.spec import Scenario, task_text
from runner.core.text import one_line

log = logging.getLogger("rootbench.mcp")
DETACHED_ENV = "ROOTBENCH_MCP_DETACHED"  # set in the child that holds the episode (stdio)
JUDGE_WAIT = 900.0  # seconds: the most judging and tearing down may take after the loop ends
# The longest JSON-RPC message read from stdin: the SDK's cap on an HTTP request body, so both
# transports take the same; a longer line is refused (and skipped) without being held whole.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
HTTP_PATH = "/mcp"
T = TypeVar("T")
Play = Callable[..., Episode]  # run_one's signature: how the episode is played (a VM, by default)


class McpAgentModel(BridgeModel):
    """The bridge whose agent is an MCP client: it is there already, nothing to start."""

    agent = AgentKind.MCP

    def disconnect(self, why: str = "the client disconnected without calling finish") -> None:
        """The client is gone: end the loop now (a finish nobody called), so it is judged."""
        self.abandon(why)


def _instructions(scenario: Scenario, hint_level: int) -> str:
    b = scenario.budget
    return (f"{task_text(scenario, hint_level).strip()}\n\n"
            "You have a root shell on the server through the tool run_command (one shell "
            "command; you get its exit code and output). Call finish with a short summary when "
            f"the problem is fixed: the server is then judged. Budget: {b.turns} commands, "
            f"{int(b.seconds)} seconds, {int(b.command_timeout)} s per command.")


class EpisodeRun:
    """One episode on its own daemon thread: the loop waits in ``bridge`` for an outside agent.

    Shared by the MCP server and the Inspect sandbox: the cassette goes to
    ``run_dir/cassettes`` and the verdict to ``run_dir/results.json``. ``play``
    is how the episode is played, :func:`~runner.app.episodes.run_one` (a VM)
    unless a test hands in one on a guest of its own. If it raises (the
    machinery broke), the episode is ``infra-error`` in ``results.json`` all the
    same: an episode that started is never left without a verdict.
    """

    def __init__(self, scenario: Scenario, opts: RunOptions, run_dir: Path, hint_level: int,
                 bridge: BridgeModel, agent_info: dict[str, Any], play: Play = run_one) -> None:
        self.scenario = scenario
        self.run_dir = run_dir
        self.bridge = bridge
        self.episode: Episode | None = None
        self.done = threading.Event()
        self.cassette = layout.cassette_path(run_dir, scenario.id, 0, hint_level)
        self._play = play
        self._info = {"agent": {"kind": bridge.agent.value, **agent_info},
                      "options": {"accel": opts.accel, "transport": opts.transport,
                                  "hints": hint_level, "track_fix": opts.track_fix},
                      "scenarios": [scenario.path]}
        self._thread = threading.Thread(target=self._main, args=(opts, hint_level),
                                        name="episode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _main(self, opts: RunOptions, hint_level: int) -> None:
        protocol = get_protocol("tools")
        try:
            try:
                self.episode = self._play(
                    self.scenario, self.bridge, protocol,
                    f"an outside agent's actions ({self.bridge.agent})", opts, self.cassette,
                    hint_level=hint_level)
            except Exception as exc:  # noqa: BLE001 - the machinery broke: infra-error, not lost
                log.error("the episode failed: %s", one_line(f"{type(exc).__name__}: {exc}"))
                self.episode = Episode.infra_error(
                    self.scenario.id, self.bridge.agent, self.bridge.name, protocol.name,
                    f"mcp: {one_line(f'{type(exc).__name__}: {exc}')}", hint_level=hint_level)
            write_results(self.run_dir, self._info, [self.episode])
            ep = self.episode
            log.info("%s: %s (%s) in %.1fs; results: %s", ep.scenario, ep.verdict, ep.reason,
                     ep.seconds, self.run_dir / layout.RESULTS)
        except Exception as exc:  # noqa: BLE001 - results.json unwritable: say so, still end
            log.error("the results could not be written: %s", one_line(str(exc)))
        finally:
            self.bridge.close()  # a client still waiting in run_command hears it is over
            self.done.set()

    def verdict_line(self) -> str:
        ep = self.episode
        if ep is None:
            return "the episode ended without a verdict (see the server's log)"
        return json.dumps({"verdict": ep.verdict.value, "reason": ep.reason,
                           "score": ep.score, "milestones": ep.milestones,
                           "flags": [f.value for f in ep.flags]})


# --- waiting without holding the process ---------------------------------------------------------

async def _off_loop(fn: Callable[[], T]) -> T:
    """``fn()`` on a daemon thread of its own, awaited.

    ``anyio.to_thread`` would do, but its worker threads are not daemons: one
    left blocked (a client gone mid-command, a transport that failed) kept the
    whole process, and the VM, alive until it returned. Cancelled, the call is
    abandoned; the thread ends when ``fn`` does (every call here is bounded).
    """
    import anyio
    import anyio.from_thread
    import anyio.lowlevel

    token = anyio.lowlevel.current_token()
    done = anyio.Event()
    box: list[tuple[bool, Any]] = []

    def main() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            box.append((False, exc))
        with contextlib.suppress(Exception):  # the loop may be gone: nobody is waiting then
            anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=main, name="mcp-call", daemon=True).start()
    await done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


async def _until(event: threading.Event, seconds: float) -> bool:
    """Poll ``event`` for at most ``seconds``; whether it was set (no thread waits on it)."""
    import anyio

    deadline = time.monotonic() + seconds
    while not event.is_set() and time.monotonic() < deadline:
        await anyio.sleep(0.1)
    return event.is_set()


def _server(run: EpisodeRun, instructions: str) -> Any:
    """The MCP server: the two tools and the task prompt, all on the bridge."""
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("rootbench", instructions=instructions,
                       description="A broken Linux server to fix, judged by rootbench.",
                       log_level="WARNING")

    @server.tool()
    async def run_command(command: str, timeout: float | None = None) -> str:
        """Run a shell command as root on the server; returns its exit code and output."""
        try:
            code, output = await _off_loop(lambda: run.bridge.submit_run(command, timeout))
        except (EpisodeOver, ValueError, RuntimeError) as exc:
            raise ToolError(str(exc)) from None
        head = "the command timed out and was killed" if code is None else f"exit code {code}"
        return f"{head}\n{output}" if output else head

    @server.tool()
    async def finish(summary: str) -> str:
        """Say the problem is fixed (or that you give up): the server is judged; returns the
        verdict."""
        try:
            run.bridge.submit_finish(summary)
        except (EpisodeOver, ValueError) as exc:
            raise ToolError(str(exc)) from None
        await _until(run.done, JUDGE_WAIT)
        return run.verdict_line()

    @server.prompt()
    def task() -> str:
        """The task: what the user says is wrong with the server."""
        return instructions

    return server


# --- signals -------------------------------------------------------------------------------------

class _Stop:
    """SIGINT, SIGTERM and SIGHUP, recorded instead of raised: the first one ends the serving,
    and the episode is then judged rather than lost (an exception would have abandoned the
    cassette half written). Later ones are ignored while the machine is judged."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Stop]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals reach only the main thread: nothing to install elsewhere
            return
        old = {s: signal.signal(s, self._handler) for s in STOP_SIGNALS}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


# --- stdio ---------------------------------------------------------------------------------------

def _error_line(msg_id: Any, code: int, message: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code,
                                                                  "message": message}})


def _lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in a parsed JSON value (keys too), as ``U+XXXX``, or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"U+{ord(v[exc.start]):04X}"
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def screen_message(line: bytes) -> tuple[str | None, str | None]:
    """One line from stdin: ``(text for the SDK, None)``, or ``(None, the JSON-RPC error to
    answer)`` for what the SDK would drop without a word.

    The SDK's stdio transport answers nothing to a line it cannot parse, to a
    batch (a JSON array, which MCP does not use), to a string with a lone
    surrogate escape (``"\\ud800"``, valid JSON but not Unicode text), nor to
    anything its own reader refuses or takes for a notification (not an object,
    an id that is a float, a bool or null, a wrong ``jsonrpc``, no ``method``,
    nesting deeper than its parser takes): the client then waits for ever. Each
    gets an error naming the request's ``id`` when it has a usable one (JSON-RPC
    2.0: -32700 parse error, -32600 invalid request, -32602 invalid params).
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, _error_line(None, -32700, f"Parse error: the line is not UTF-8 text "
                                               f"(byte {exc.start})")
    if not text.strip():
        return None, None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return None, _error_line(None, -32700, f"Parse error: {one_line(str(exc), 120)}")
    if isinstance(value, list):
        return None, _error_line(None, -32600, "Invalid Request: JSON-RPC batches are not "
                                               "supported; send one message per line")
    if not isinstance(value, dict):
        return None, _error_line(None, -32600, "Invalid Request: a message is a JSON object")
    msg_id = value.get("id")
    usable = isinstance(msg_id, str | int) and not isinstance(msg_id, bool)
    msg_id = msg_id if usable and _lone_surrogate(msg_id) is None else None
    # A request whose id the SDK cannot use is a notification to it, answered with nothing
    # (a response's null id is JSON-RPC's own, and passes).
    if "id" in value and "method" in value and not usable:
        return None, _error_line(None, -32600, "Invalid Request: the id must be a string or "
                                               "an integer")
    if (where := _lone_surrogate(value)) is not None:
        return None, _error_line(msg_id, -32602,
                                 f"Invalid params: a string holds a lone surrogate ({where}), "
                                 "which is not Unicode text; send valid UTF-8")
    if (why := _not_a_message(text)) is not None:
        return None, _error_line(msg_id, -32600, f"Invalid Request: {why}")
    return text, None


def _not_a_message(text: str) -> str | None:
    """Why the SDK cannot read ``text`` as a JSON-RPC message (it would log that and answer
    nothing: a wrong ``jsonrpc``, no ``method``, nesting deeper than its parser takes), in
    one line; None when it can. Its own reader, so the two never disagree."""
    from mcp.types import jsonrpc_message_adapter
    from pydantic import ValidationError

    try:
        jsonrpc_message_adapter.validate_json(text, by_name=False)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[:1]
        where = ".".join(str(x) for x in first[0]["loc"][1:]) if first else ""
        said = first[0]["msg"] if first else str(exc)
        return one_line(f"{where}: {said}" if where else said, 160)
    return None


class _StdioOut:
    """The wire's stdout for the SDK's stdio transport: one daemon thread writes, in order.

    ``write`` never blocks the event loop and never raises: a client that has
    gone (EPIPE) or stopped reading leaves the episode to be judged rather than
    an exception through the server (the ExceptionGroup that lost episodes).
    """

    def __init__(self, fd: int) -> None:
        import queue

        self._fd = fd
        self._queue: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.gone = threading.Event()
        threading.Thread(target=self._pump, name="mcp-stdout", daemon=True).start()

    def send(self, text: str) -> None:
        if not self.gone.is_set():
            self._queue.put(text.encode("utf-8", "replace"))

    async def write(self, text: str) -> None:
        self.send(text)

    async def flush(self) -> None:
        return None

    def _pump(self) -> None:
        while True:
            view = memoryview(self._queue.get())
            try:
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError:
                self.gone.set()
                return


class _StdioIn:
    """The wire's stdin for the SDK's stdio transport, read by a daemon thread.

    Each line is screened first (:func:`screen_message`; a line over
    :data:`MAX_MESSAGE_BYTES` is refused and skipped in bounded pieces); what
    the SDK would drop silently is answered here on ``out``. ``on_eof`` runs once
    stdin ends: the client has gone.
    """

    def __init__(self, fd: int, out: _StdioOut, on_eof: Callable[[], None]) -> None:
        self._fd = fd
        self._out = out
        self._on_eof = on_eof
        self.ended = threading.Event()
        self._receive: Any = None

    def start(self) -> None:
        """Start reading (in the event loop: lines are handed to it)."""
        import anyio
        import anyio.from_thread
        import anyio.lowlevel

        send, self._receive = anyio.create_memory_object_stream[str | None](0)
        token = anyio.lowlevel.current_token()

        def main() -> None:
            reader = io.BufferedReader(io.FileIO(self._fd, "rb", closefd=False))
            try:
                for line in self._lines(reader):
                    text, error = screen_message(line)
                    if error is not None:
                        self._out.send(error + "\n")
                    elif text is not None:
                        anyio.from_thread.run(send.send, text, token=token)
            except Exception as exc:  # noqa: BLE001 - the loop has gone, or stdin broke
                log.debug("stdin reader: %s", exc)
            finally:
                self.ended.set()
                self._on_eof()
                with contextlib.suppress(Exception):
                    anyio.from_thread.run(send.send, None, token=token)

        threading.Thread(target=main, name="mcp-stdin", daemon=True).start()

    def _lines(self, reader: io.BufferedIOBase) -> Iterator[bytes]:
        while True:
            line = reader.readline(MAX_MESSAGE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_MESSAGE_BYTES and not line.endswith(b"\n"):
                while (rest := reader.readline(MAX_MESSAGE_BYTES)) and not rest.endswith(b"\n"):
                    pass  # skip the rest of the line, a bounded piece at a time
                self._out.send(_error_line(None, -32600, "Invalid Request: the message is "
                                           f"longer than {MAX_MESSAGE_BYTES:,} bytes") + "\n")
                continue
            yield line

    def __aiter__(self) -> _StdioIn:
        return self

    async def __anext__(self) -> str:
        item = await self._receive.receive()
        if item is None:
            raise StopAsyncIteration
        return str(item)


@contextlib.contextmanager
def _wire() -> Iterator[tuple[int, int]]:
    """The stdio wire on private descriptors, and fd 0 and 1 pointed away from it meanwhile
    (stdin at /dev/null, stdout at stderr), as the SDK's own transport does: a stray
    ``print`` or a child's output cannot corrupt the JSON-RPC stream."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        yield wire_in, wire_out
    finally:
        os.close(null)
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        # The wire descriptors stay open: a daemon thread may still be in a read or write on
        # them, and a closed descriptor's number could be reused under it.


def _serve_stdio(server: Any, run: EpisodeRun, stop: _Stop, gone: Callable[[], None]) -> None:
    """Serve the SDK's server on the stdio wire until the client has gone, the episode is
    judged (and its answer out), or a signal came."""
    import anyio
    from mcp.server.stdio import stdio_server

    with _wire() as (wire_in, wire_out):
        out = _StdioOut(wire_out)
        stdin = _StdioIn(wire_in, out, gone)

        async def main() -> None:
            stdin.start()

            async def watch(scope: anyio.CancelScope) -> None:
                judged_at = None
                while True:
                    await anyio.sleep(0.1)
                    if run.done.is_set() and judged_at is None:
                        judged_at = time.monotonic()
                    if stop.signal is not None or out.gone.is_set() and stdin.ended.is_set():
                        break
                    # Judged and the client gone: a reply still being made goes nowhere.
                    if judged_at and stdin.ended.is_set() and time.monotonic() - judged_at > 1:
                        break
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, tg.cancel_scope)
                lowlevel = server._lowlevel_server  # the SDK's own run_stdio_async, on our wire
                async with stdio_server(stdin=stdin, stdout=out) as (read, write):  # type: ignore[arg-type]  # duck-typed AsyncFiles
                    await lowlevel.run(read, write, lowlevel.create_initialization_options())
                tg.cancel_scope.cancel()

        anyio.run(main)


# --- streamable HTTP -----------------------------------------------------------------------------

_ADDRESS = re.compile(r"^(?:(?P<host>\[[^\]]*\]|[^:\[\]]*):)?(?P<port>[0-9]{1,5})$")


@dataclass(frozen=True)
class HttpAddress:
    """Where ``--http`` listens: checked and resolved before anything starts."""

    host: str  # as given (brackets of an IPv6 address removed); "127.0.0.1" when none was
    port: int
    family: int
    sockaddr: tuple[Any, ...]
    loopback: bool

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{HTTP_PATH}"


def parse_http(value: str, *, remote: bool = False) -> HttpAddress:
    """``--http [HOST:]PORT``, resolved; loopback unless ``remote`` (``--http-remote``).

    Refused with one line (exit 2), before any VM starts: a URL instead of an
    address, a port out of 1..65535, a host that does not resolve, and a host
    that is not loopback without ``--http-remote``.
    """
    text = value.strip()
    if "://" in text or "/" in text:
        raise InvalidInput(f"give HOST:PORT or PORT, not a URL (the server's URL is then "
                           f"http://HOST:PORT{HTTP_PATH}): {value!r}", field="--http")
    m = _ADDRESS.match(text)
    port = int(m.group("port")) if m else 0
    if m is None or not 0 < port < 65536:
        raise InvalidInput(f"not [HOST:]PORT with a port from 1 to 65535 (an IPv6 host in "
                           f"brackets: [::1]:8765): {value!r}", field="--http")
    host = (m.group("host") or "").strip("[]") or "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidInput(f"cannot resolve the host {host!r}: "
                           f"{getattr(exc, 'strerror', None) or exc}", field="--http") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)  # localhost: 127.0.0.1, as clients try first
    family, _, _, _, sockaddr = infos[0]
    loopback = all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)
    if not loopback and not remote:
        raise InvalidInput(f"{host} is not a loopback address, so the root shell would be "
                           "reachable from other machines; add --http-remote to listen there "
                           "anyway", field="--http")
    return HttpAddress(host, port, family, tuple(sockaddr), loopback)


def listen(address: HttpAddress) -> socket.socket:
    """A socket bound and listening at ``address``, or one line (exit 2) saying why not.

    Bound here, before the VM starts, and handed to the HTTP server as it is:
    a busy port is found out at once, and nobody can take the port in between.
    """
    sock = socket.socket(address.family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address.sockaddr)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"cannot listen on {address.host}:{address.port}: "
                           f"{exc.strerror or exc}", field="--http") from None
    return sock


def new_token() -> str:
    """A bearer token for one server: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def write_token_file(path: Path, token: str) -> None:
    """Write ``token`` to ``path``, readable by its owner only (0600, whatever the file's mode
    was); a symbolic link or anything but a regular file is refused (one line, exit 2)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        why = "a symbolic link" if exc.errno == 40 else exc.strerror or str(exc)  # ELOOP
        raise InvalidInput(f"cannot write the token: {why}", path=str(path),
                           field="--http-token-file") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput("cannot write the token: not a regular file", path=str(path),
                               field="--http-token-file")
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.write(fd, (token + "\n").encode())
    except OSError as exc:
        raise InvalidInput(f"cannot write the token: {exc.strerror or exc}", path=str(path),
                           field="--http-token-file") from None
    finally:
        os.close(fd)


@dataclass
class Listener:
    """A bound ``--http`` socket, its address and the bearer token every request must carry."""

    sock: socket.socket
    address: HttpAddress
    token: str


def _split_host(value: str) -> tuple[str, str] | None:
    """``host[:port]`` of a Host header (or an Origin's authority) as (host, port)."""
    m = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]+)(?::([0-9]{1,5}))?", value)
    if m is None:
        return None
    return m.group(1).strip("[]").lower(), m.group(2) or ""


def host_allowed(header: str, address: HttpAddress) -> bool:
    """Whether a request's ``Host`` (or ``Origin`` authority) may name this server.

    DNS rebinding makes a browser send requests to us under a name its page
    controls; so the name must be one no web page can own: ``localhost``, an IP
    address (loopback ones only when we listen on loopback), the name given to
    ``--http``, or, with ``--http-remote``, this machine's own host names. The
    port must be ours.
    """
    parts = _split_host(header)
    if parts is None or parts[1] != str(address.port):
        return False
    name = parts[0]
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        names = {"localhost", address.host.lower()}
        if not address.loopback:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return name in names
    return ip.is_loopback or not address.loopback


def _guarded(app: Any, listener: Listener, on_end: Callable[[], None]) -> Any:
    """The ASGI app behind the checks every request passes first: ``Host`` and ``Origin`` name
    this server (:func:`host_allowed`), and ``Authorization`` carries the bearer token
    (compared in constant time). A DELETE that ended a session calls ``on_end``."""
    Scope = MutableMapping[str, Any]
    token = listener.token.encode()

    async def refuse(send: Callable[[Any], Awaitable[None]], status: int, text: str,
                     extra: list[tuple[bytes, bytes]]) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"), *extra]})
        await send({"type": "http.response.body", "body": text.encode() + b"\n"})

    async def guarded(scope: Scope, receive: Callable[[], Awaitable[Any]],
                      send: Callable[[Any], Awaitable[None]]) -> None:
        if scope.get("type") == "lifespan":
            await app(scope, receive, send)  # the server's own start and stop
            return
        if scope.get("type") != "http":  # a websocket (or any other kind): nothing for it here
            await send({"type": "websocket.close", "code": 1008})
            return
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(bytes(k).lower(), bytes(v))
        host = headers.get(b"host", b"").decode("latin-1")
        origin = headers.get(b"origin", b"").decode("latin-1")
        if not host_allowed(host, listener.address):
            await refuse(send, 421, "this server does not answer to that Host", [])
            return
        if origin and not (origin.startswith("http://")
                           and host_allowed(origin[len("http://"):], listener.address)):
            await refuse(send, 403, "requests from that Origin are refused", [])
            return
        # The scheme's name is case-insensitive (RFC 9110 11.1); the token is compared whole,
        # in constant time.
        scheme, _, given = headers.get(b"authorization", b"").strip().partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), token):
            await refuse(send, 401, "send the server's token: Authorization: Bearer TOKEN",
                         [(b"www-authenticate", b'Bearer realm="rootbench"')])
            return
        status: list[int] = []

        async def sent(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status.append(int(message.get("status", 0)))
            await send(message)

        await app(scope, receive, sent)
        if scope.get("method") == "DELETE" and status and status[0] < 400:
            on_end()

    return guarded


def _serve_http(server: Any, run: EpisodeRun, listener: Listener, stop: _Stop,
                gone: Callable[[], None]) -> None:
    """Serve streamable HTTP on the bound socket until the episode is judged or a signal."""
    import anyio
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    # The Host and Origin checks are ours (_guarded), the same for every address.
    app = server.streamable_http_app(
        streamable_http_path=HTTP_PATH, host=listener.address.host,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    web = uvicorn.Server(uvicorn.Config(_guarded(app, listener, gone), log_level="warning",
                                        lifespan="on", timeout_graceful_shutdown=5))

    async def main() -> None:
        async def stop_when_over() -> None:
            judged_at = None
            while not web.should_exit:
                await anyio.sleep(0.1)
                if run.done.is_set() and judged_at is None:
                    judged_at = time.monotonic()
                # The finish call's answer goes out first; a signal is recorded once uvicorn,
                # which takes the signals while it serves, hands it back after.
                if stop.signal is not None or judged_at and time.monotonic() - judged_at > 1:
                    web.should_exit = True

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_when_over)
            log.info("serving MCP on %s", listener.address.url)
            await web.serve(sockets=[listener.sock])
            tg.cancel_scope.cancel()

    anyio.run(main)
    # uvicorn raised the signals it took, again, once it stopped: into _Stop, still installed.


# --- the episode, whatever the transport does --------------------------------------------------

@dataclass(frozen=True)
class Served:
    """What :func:`serve` ends with: the episode (None only if it never ended, in spite of the
    bounded wait) and the signal that stopped the serving, if one did."""

    episode: Episode | None
    signal: int | None
    run_dir: Path


def serve(scenario: Scenario, opts: RunOptions, runs_dir: Path, *,
          listener: Listener | None = None, hint_level: int = 0,
          play: Play = run_one) -> Served:
    """Serve ``scenario`` to one MCP client over stdio, or over HTTP on ``listener``, until the
    episode is judged; then, or as soon as the client goes, the transport fails or a signal
    comes, the episode is ended and judged (bounded: :data:`JUDGE_WAIT` past its budget)."""
    transport = "http" if listener else "stdio"
    run_dir = new_run_dir(runs_dir, f"mcp-{scenario.id}")
    bridge = McpAgentModel("mcp-client", {"transport": transport})
    run = EpisodeRun(scenario, opts, run_dir, hint_level, bridge, {"transport": transport},
                     play=play)
    server = _server(run, _instructions(scenario, hint_level))
    log.info("run directory: %s", run_dir)
    with _Stop().installed() as stop:
        run.start()

        def gone() -> None:
            bridge.disconnect()

        failed = None
        try:
            if listener is None:
                _serve_stdio(server, run, stop, gone)
            else:
                _serve_http(server, run, listener, stop, gone)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the transport broke: judge
            failed = one_line(f"{type(exc).__name__}: {exc}")
            log.error("the MCP transport failed: %s", failed)
        finally:
            if listener is not None:
                listener.sock.close()
        stopped_by = stop.signal
        if stopped_by is not None:
            why = f"the server was stopped by {signal_name(stopped_by)} before the client called finish"
        elif failed is not None:
            why = f"the MCP transport failed before the client called finish ({failed})"
        else:
            why = "the client disconnected without calling finish"
        bridge.disconnect(why)
        if not run.done.is_set():
            log.info("judging the machine as the client left it (%s)",
                     "stopped" if stopped_by else "client gone")
        # The loop takes the finish after the command it is running (at most command_timeout),
        # then judges; the budget bounds what is left of the loop.
        if not run.done.wait(JUDGE_WAIT + scenario.budget.seconds):
            log.warning("the episode did not end in time; leaving it")
    return Served(run.episode, stopped_by, run_dir)


def run_server(scenario: Scenario, opts: RunOptions, runs_dir: Path, *,
               address: HttpAddress | None, hint_level: int, command: list[str],
               say: Callable[[str], None], token_file: Path | None = None,
               play: Play = run_one) -> int:
    """``rootbench mcp`` once its flags are checked: the exit status (0 once judged pass or
    fail, 1 otherwise); :class:`~runner.app.signals.Interrupted` (130, 143, 129) once judged
    after SIGINT, SIGTERM or SIGHUP stopped the serving.

    Over stdio the first process only hands ``command`` (itself) to :func:`detach`
    and waits. Over HTTP the socket is bound and the token made (and written to
    ``token_file``) before the VM starts; ``say`` shows the user the URL and
    the token, once, on stderr, and a warning when the address is not loopback.
    """
    if address is None and not os.environ.get(DETACHED_ENV):
        return detach(command)  # judging outlives the client: see detach
    listener = None
    if address is not None:
        token = new_token()
        if token_file is not None:
            write_token_file(token_file, token)
        listener = Listener(listen(address), address, token)
        if not address.loopback:
            say(f"rootbench: warning: --http-remote: the root shell at {address.url} can be "
                "reached from other machines; anyone with the token can drive it")
        where = f"the token is in {token_file}" if token_file else f"token {token}"
        say(f"rootbench: MCP at {address.url}; send 'Authorization: Bearer TOKEN' ({where})")
    served = serve(scenario, opts, runs_dir, listener=listener, hint_level=hint_level,
                   play=play)
    if served.signal is not None:
        raise Interrupted(128 + served.signal)
    ep = served.episode
    return 0 if ep is not None and ep.verdict.scored else 1


def detach(command: list[str]) -> int:
    """Run ``command`` (this very one) in a child of its own session, sharing stdin and stdout;
    the child's exit status (128+N if a signal N ended it).

    The SDK's stdio client kills the server's process group soon after
    closing stdin; the child, in another session, is out of that group and
    finishes judging and tearing down. The parent only waits for it, passing
    on SIGINT, SIGTERM and SIGHUP (a Ctrl-C on a terminal reaches only the
    parent's group): the child then ends the episode, judged.
    """
    env = {**os.environ, DETACHED_ENV: "1"}
    child = subprocess.Popen(command, env=env, start_new_session=True)

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    try:
        code = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - code if code < 0 else code


def check_available() -> None:
    """The ``mcp`` extra is installed, or one line saying how to get it."""
    try:
        import mcp.server  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise InvalidInput("the MCP server needs the mcp extra: pip install 'rootbench[mcp]'",
                           field="mcp") from None

