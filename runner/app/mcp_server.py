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

Streamable HTTP is a listener that hands out a root shell, so (:mod:`runner.app.mcp_http`)
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
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from runner.app.episodes import RunOptions, run_one
from runner.app.mcp_http import (
    HTTP_PATH,
    HttpAddress,
    Listener,
    guarded_app,
    listen,
    new_token,
    write_token_file,
)
from runner.app.mcp_stdio import StdioIn, StdioOut, wire
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
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
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

def _serve_stdio(server: Any, run: EpisodeRun, stop: _Stop, gone: Callable[[], None]) -> None:
    """Serve the SDK's server on the stdio wire until the client has gone, the episode is
    judged (and its answer out), or a signal came."""
    import anyio
    from mcp.server.stdio import stdio_server

    with wire() as (wire_in, wire_out):
        out = StdioOut(wire_out)
        stdin = StdioIn(wire_in, out, gone)

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
    web = uvicorn.Server(uvicorn.Config(guarded_app(app, listener, gone), log_level="warning",
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

