"""``rootbench mcp SPEC``: one scenario served to an outside agent as an MCP server.

The sandbox is restored and the fault injected as for any run; an MCP client
(Claude Code, an IDE, any agent framework, the SDK's own client) then acts
through two tools, ``run_command`` and ``finish``, and reads the task from the
server's instructions or the ``task`` prompt. It is the same inversion as the
Python agent API (:mod:`runner.core.agent_api`): the client's tool calls are
the bridge model's replies, so budgets, forbidden commands, fix tracking,
milestones, judging, the cassette and replay are the bundled loop's code.

The episode ends, and the machine is judged, on ``finish``, when the budget
runs out, or when the client disconnects (stdio: its stdin closes; streamable
HTTP: it ends its session with a DELETE, which a stateless protocol version has
no occasion to send, so such a client is ended by the budget). The cassette and ``results.json`` go to a run
directory as for ``rootbench run``, and the VM is torn down.

Built on the official ``mcp`` SDK (``pip install 'rootbench[mcp]'``), imported
only here and only when the command runs.

Over stdio, the SDK's client stops a server by closing its stdin and, two
seconds later, killing its whole process group: far too soon to judge a
machine under TCG. So the stdio server runs the episode in a child process of
its own session (:func:`detach`), which keeps reading the same stdin and
writing the same stdout, and finishes judging and tearing down after the
client has gone.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from runner.app.episodes import RunOptions, run_one
from runner.app.runs import new_run_dir, write_results
from runner.core import layout
from runner.core.agent_api import BridgeModel, EpisodeOver
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.outcomes import AgentKind
from runner.core.protocol import get_protocol
from runner.core.spec import Scenario, task_text

log = logging.getLogger("rootbench.mcp")
DETACHED_ENV = "ROOTBENCH_MCP_DETACHED"  # set in the child that holds the episode (stdio)
JUDGE_WAIT = 900.0  # seconds: the most judging and tearing down may take after the loop ends


class McpAgentModel(BridgeModel):
    """The bridge whose agent is an MCP client: it is there already, nothing to start."""

    agent = AgentKind.MCP

    def disconnect(self) -> None:
        """The client is gone: end the loop now (a finish nobody called), so it is judged."""
        self.abandon("the client disconnected without calling finish")


def _instructions(scenario: Scenario, hint_level: int) -> str:
    b = scenario.budget
    return (f"{task_text(scenario, hint_level).strip()}\n\n"
            "You have a root shell on the server through the tool run_command (one shell "
            "command; you get its exit code and output). Call finish with a short summary when "
            f"the problem is fixed: the server is then judged. Budget: {b.turns} commands, "
            f"{int(b.seconds)} seconds, {int(b.command_timeout)} s per command.")


class EpisodeRun:
    """One episode on its own thread: the loop waits in ``bridge`` for an outside agent's actions.

    Shared by the MCP server and the Inspect sandbox: the cassette goes to
    ``run_dir/cassettes`` and the verdict to ``run_dir/results.json``.
    """

    def __init__(self, scenario: Scenario, opts: RunOptions, run_dir: Path, hint_level: int,
                 bridge: BridgeModel, agent_info: dict[str, Any]) -> None:
        self.scenario = scenario
        self.run_dir = run_dir
        self.bridge = bridge
        self.episode: Episode | None = None
        self.done = threading.Event()
        self.cassette = layout.cassette_path(run_dir, scenario.id, 0, hint_level)
        self._info = {"agent": {"kind": bridge.agent.value, **agent_info},
                      "options": {"accel": opts.accel, "transport": opts.transport,
                                  "hints": hint_level, "track_fix": opts.track_fix},
                      "scenarios": [scenario.path]}
        self._thread = threading.Thread(target=self._main, args=(opts, hint_level),
                                        name="episode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _main(self, opts: RunOptions, hint_level: int) -> None:
        try:
            self.episode = run_one(self.scenario, self.bridge, get_protocol("tools"),
                                   f"an outside agent's actions ({self.bridge.agent})", opts,
                                   self.cassette,
                                   hint_level=hint_level)
            write_results(self.run_dir, self._info, [self.episode])
            ep = self.episode
            log.info("%s: %s (%s) in %.1fs; results: %s", ep.scenario, ep.verdict, ep.reason,
                     ep.seconds, self.run_dir / layout.RESULTS)
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


def _server(run: EpisodeRun, instructions: str) -> Any:
    """The MCP server: the two tools and the task prompt, all on the bridge."""
    import anyio
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("rootbench", instructions=instructions,
                       description="A broken Linux server to fix, judged by rootbench.",
                       log_level="WARNING")

    @server.tool()
    async def run_command(command: str, timeout: float | None = None) -> str:
        """Run a shell command as root on the server; returns its exit code and output."""
        try:
            code, output = await anyio.to_thread.run_sync(
                run.bridge.submit_run, command, timeout, abandon_on_cancel=True)
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
        except EpisodeOver as exc:
            raise ToolError(str(exc)) from None
        await anyio.to_thread.run_sync(run.done.wait, JUDGE_WAIT, abandon_on_cancel=True)
        return run.verdict_line()

    @server.prompt()
    def task() -> str:
        """The task: what the user says is wrong with the server."""
        return instructions

    return server


def _ends_session_on_delete(app: Any, on_end: Callable[[], None]) -> Any:
    """The ASGI app, calling ``on_end`` once a client ends its session (HTTP DELETE)."""
    Scope = MutableMapping[str, Any]

    async def wrapped(scope: Scope, receive: Callable[[], Awaitable[Any]],
                      send: Callable[[Any], Awaitable[None]]) -> None:
        await app(scope, receive, send)
        if scope.get("type") == "http" and scope.get("method") == "DELETE":
            on_end()

    return wrapped


def serve(scenario: Scenario, opts: RunOptions, runs_dir: Path, *, transport: str = "stdio",
          host: str = "127.0.0.1", port: int = 8000, hint_level: int = 0) -> Episode | None:
    """Serve ``scenario`` to one MCP client until the episode is judged (and, over stdio, until
    the client has gone); the episode, or None when it never ended."""
    import anyio

    run_dir = new_run_dir(runs_dir, f"mcp-{scenario.id}")
    bridge = McpAgentModel("mcp-client", {"transport": transport})
    run = EpisodeRun(scenario, opts, run_dir, hint_level, bridge, {"transport": transport})
    server = _server(run, _instructions(scenario, hint_level))
    log.info("run directory: %s", run_dir)
    run.start()
    if transport == "stdio":
        anyio.run(server.run_stdio_async)
        log.info("the client has gone")
        bridge.disconnect()
    else:
        import uvicorn

        app = _ends_session_on_delete(server.streamable_http_app(host=host),
                                      bridge.disconnect)
        web = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                            lifespan="on"))

        async def main() -> None:
            async def stop_when_judged() -> None:
                await anyio.to_thread.run_sync(run.done.wait, abandon_on_cancel=True)
                await anyio.sleep(1.0)  # the finish call's answer goes out first
                web.should_exit = True

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_when_judged)
                log.info("serving MCP on http://%s:%d/mcp", host, port)
                await web.serve()
                tg.cancel_scope.cancel()

        anyio.run(main)
        bridge.disconnect()  # stopped from outside (Ctrl-C) before the end: judge it now
    if not run.done.wait(JUDGE_WAIT + scenario.budget.seconds):
        log.warning("the episode did not end in time; leaving it")
        return None
    return run.episode


def detach(argv: list[str]) -> int:
    """Run this very command again in a child of its own session, sharing stdin and stdout.

    The SDK's stdio client kills the server's process group soon after
    closing stdin; the child, in another session, is out of that group and
    finishes judging and tearing down. The parent only waits for it.
    """
    env = {**os.environ, DETACHED_ENV: "1"}
    child = subprocess.Popen([sys.executable, "-m", "runner", *argv], env=env,
                             start_new_session=True)
    try:
        return child.wait()
    except KeyboardInterrupt:
        return 130


def check_available() -> None:
    """The ``mcp`` extra is installed, or one line saying how to get it."""
    try:
        import mcp.server  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise InvalidInput("the MCP server needs the mcp extra: pip install 'rootbench[mcp]'",
                           field="mcp") from None


def parse_http(value: str) -> tuple[str, int]:
    """``--http [HOST:]PORT`` as (host, port); loopback unless a host is given."""
    host, _, port = value.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 < number < 65536:
        raise InvalidInput(f"not [HOST:]PORT with a port from 1 to 65535: {value!r}",
                           field="--http")
    return host or "127.0.0.1", number
