"""``rootbench mcp`` without a VM: its checks of the command line, and the real server, transports
and signals on the flag guest (``tests/flag_mcp.py``, a process: what a client that goes away, a
signal and an exit status do is only seen on a process of its own).

Hostile clients (issue #46): a stdio client that dies with a call pending, SIGTERM to the
episode's process, a lone surrogate, a batch, an endless line; an HTTP request without the
token, with a foreign Host or Origin, or a DELETE from a stranger; ``--http`` on another
machine's address, a URL, an unknown host, a busy port. Every one ends in one line (exit 2)
before any VM, an error reply, or a judged episode with its cassette complete.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from conftest import Cli
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from runner.app.mcp_http import HttpAddress, host_allowed, parse_http, write_token_file
from runner.app.mcp_stdio import MAX_MESSAGE_BYTES, screen_message
from runner.core.cassette import Cassette
from runner.core.errors import InvalidInput
from runner.core.paths import repo_root

SPEC = "specs/dir-missing-exec.yaml"
ROOT = repo_root()
FLAG_MCP = ROOT / "tests" / "flag_mcp.py"
FLAGS = """\
id: flags
title: Two flags must be set
image: debian-12-nginx
task: Set the flags a and b.
setup: [rm -f a b]
probes:
  - name: flag a
    command: {run: test -e a}
  - name: flag b
    command: {run: test -e b}
solution: [touch a, touch b]
"""
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flags(tmp_path: Path) -> Path:
    spec = tmp_path / "flags.yaml"
    spec.write_text(FLAGS)
    return spec


def _server_argv(tmp_path: Path, *extra: str) -> list[str]:
    # A process: the flag-guest MCP server (rootbench mcp with the flag guest for a VM).
    return [sys.executable, str(FLAG_MCP), str(_flags(tmp_path)), str(tmp_path / "runs"), *extra]


def _episode(runs: Path, within: float = 60.0) -> dict[str, Any]:
    """The one episode of the run directory under ``runs``, once results.json is there."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = list(runs.glob("*/results.json"))
        if found:
            [episode] = json.loads(found[0].read_text())["episodes"]
            return dict(episode)
        time.sleep(0.2)
    raise AssertionError(f"no results.json under {runs} after {within}s")


def _complete_cassette(runs: Path, ep: dict[str, Any]) -> Cassette:
    """The episode's cassette: complete (no .partial left anywhere), with its verdict."""
    assert not list(runs.rglob("*.partial")), list(runs.rglob("*"))
    cassette = Cassette.load(Path(ep["cassette"]))
    assert cassette.events[-1]["type"] == "verdict"
    return cassette


def _last_finish(cassette: Cassette) -> str:
    last = [e for e in cassette.events if e["type"] == "model"][-1]["reply"]["message"]
    call = last["tool_calls"][0]["function"]
    assert call["name"] == "finish"
    return str(json.loads(call["arguments"])["summary"])


class Wire:
    """A raw JSON-lines client on the stdio server: what the SDK's client would not send."""

    def __init__(self, argv: list[str], stderr: Path) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr.open("w"), cwd=ROOT)
        self._buffer = b""

    def send(self, message: dict[str, Any] | str | bytes) -> None:
        assert self.proc.stdin is not None
        data = message if isinstance(message, bytes) else (
            message if isinstance(message, str) else json.dumps(message)).encode()
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def reply(self, within: float = 60.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + within
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([fd], [], [], left)[0], "no reply in time"
            chunk = os.read(fd, 65536)
            assert chunk, "the server closed its stdout"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def start(self) -> None:
        self.send(INIT)
        assert self.reply()["id"] == 0
        self.send(INITIALIZED)

    def call(self, msg_id: int, tool: str, **arguments: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call",
                   "params": {"name": tool, "arguments": arguments}})

    def holder(self) -> int:
        """The detached child that holds the episode."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                             text=True, timeout=10)
        [pid] = map(int, out.stdout.split())
        return pid

    def vanish(self) -> None:
        """The client dies: both its ends of the pipes close at once."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.stdout.close()


# --- the command line: one line, exit 2, before any VM --------------------------------------------

def test_a_bad_spec_address_or_flag_is_one_line_and_exit_2_before_any_vm(
        cli: Cli, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        link = tmp_path / "token-link"
        link.symlink_to(tmp_path / "elsewhere")
        runs = tmp_path / "runs"
        for args, says in (
                (["specs/nope.yaml"], "nope.yaml"),
                ([SPEC, "--http", "localhost:http"], "--http: not [HOST:]PORT"),
                ([SPEC, "--http", "http://127.0.0.1:8765"], "--http: give HOST:PORT or PORT, "
                                                            "not a URL"),
                ([SPEC, "--http", "::1:8765"], "an IPv6 host in brackets"),
                ([SPEC, "--http", "0.0.0.0:8765"], "--http: 0.0.0.0 is not a loopback address"),
                ([SPEC, "--http", "no-such-host.invalid:8765"], "--http: cannot resolve the host"),
                ([SPEC, "--http", f"127.0.0.1:{taken}"], f"--http: cannot listen on "
                                                         f"127.0.0.1:{taken}: Address already"),
                ([SPEC, "--http-remote"], "--http-remote: needs --http"),
                ([SPEC, "--http", "127.0.0.1:1", "--http-token-file", str(link)],
                 "--http-token-file: cannot write the token: a symbolic link")):
            r = cli("mcp", *args, "--runs-dir", str(runs), timeout=60)
            assert r.returncode == 2 and says in r.stderr, (args, r.stderr)
            assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not runs.exists()  # nothing started: no run directory, so no VM
    assert not (tmp_path / "elsewhere").exists()


def test_http_addresses_are_parsed_resolved_and_loopback_unless_remote() -> None:
    a = parse_http("8765")
    assert (a.host, a.port, a.loopback, a.url) == ("127.0.0.1", 8765, True,
                                                   "http://127.0.0.1:8765/mcp")
    v6 = parse_http("[::1]:8765")
    assert v6.loopback and v6.url == "http://[::1]:8765/mcp"
    local = parse_http("localhost:8765")
    assert local.loopback and local.family == socket.AF_INET  # what clients try first
    anywhere = parse_http("0.0.0.0:8765", remote=True)
    assert not anywhere.loopback
    with pytest.raises(InvalidInput, match="--http-remote"):
        parse_http("0.0.0.0:8765")


def test_only_names_no_web_page_can_own_may_be_the_host() -> None:
    """DNS rebinding: a page's own name pointed at 127.0.0.1 must not reach the shell."""
    here = HttpAddress("127.0.0.1", 8765, socket.AF_INET, ("127.0.0.1", 8765), True)
    assert all(host_allowed(h, here) for h in ("127.0.0.1:8765", "localhost:8765",
                                               "[::1]:8765", "LOCALHOST:8765"))
    assert not any(host_allowed(h, here) for h in (
        "evil.example:8765", "127.0.0.1:8766", "127.0.0.1", "10.0.0.5:8765", "",
        f"{socket.gethostname()}:8765", "localhost.evil.example:8765", "[::1"))
    remote = HttpAddress("0.0.0.0", 8765, socket.AF_INET, ("0.0.0.0", 8765), False)
    assert all(host_allowed(h, remote) for h in ("10.0.0.5:8765", "127.0.0.1:8765",
                                                 f"{socket.gethostname()}:8765"))
    assert not host_allowed("evil.example:8765", remote)


def test_the_token_file_is_the_owners_alone_and_never_a_link_or_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old and longer than the token, to be cut\n")
    path.chmod(0o644)
    write_token_file(path, "t0k3n")
    assert path.read_text() == "t0k3n\n" and path.stat().st_mode & 0o777 == 0o600
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InvalidInput, match="--http-token-file"):
        write_token_file(fifo, "t0k3n")  # refused at once, not blocked waiting for a reader


def test_what_the_sdk_would_drop_in_silence_gets_a_json_rpc_error() -> None:
    def error(line: bytes) -> dict[str, Any]:
        text, reply = screen_message(line)
        assert text is None and reply is not None
        return dict(json.loads(reply))

    surrogate = error(rb'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":'
                      rb'"run_command","arguments":{"command":"echo \ud800"}}}')
    assert surrogate["id"] == 5 and surrogate["error"]["code"] == -32602
    assert "lone surrogate (U+D800)" in surrogate["error"]["message"]
    batch = error(b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]')
    assert batch["id"] is None and "batches are not supported" in batch["error"]["message"]
    assert error(b'{"jsonrpc": ')["error"]["code"] == -32700
    assert error(b'{"id": 3, "x": "\xff"}')["error"]["code"] == -32700  # not UTF-8
    assert error(rb'{"id": "\udc00", "method": "ping"}')["id"] is None  # the id itself is bad
    assert screen_message(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')[0] is not None
    assert screen_message(b"\n") == (None, None)


# --- stdio: the flag-guest server as a process ----------------------------------------------------

def test_a_stdio_client_that_dies_with_a_call_pending_is_judged_and_nothing_lingers(
        tmp_path: Path) -> None:
    """Before: the late reply hit a broken pipe, "unexpected error (ExceptionGroup ...)", only a
    .partial cassette, nothing judged."""
    wire = Wire(_server_argv(tmp_path), tmp_path / "server.log")
    try:
        wire.start()
        wire.call(1, "run_command", command="touch a")
        assert wire.reply()["result"]["content"][0]["text"] == "exit code 0"
        holder = wire.holder()
        wire.call(2, "run_command", command="sleep 4")
        time.sleep(1.0)
        wire.vanish()  # gone while the command runs: its reply will find no reader
        assert wire.proc.wait(timeout=90) == 0  # judged: pass or fail, not an error
    finally:
        wire.proc.kill()
    log = (tmp_path / "server.log").read_text()
    assert "unexpected error" not in log and "Traceback" not in log, log
    ep = _episode(tmp_path / "runs")
    assert ep["verdict"] == "fail" and ep["stop"] == "finish" and ep["commands"] == 2, ep
    assert "the client disconnected" in _last_finish(_complete_cassette(tmp_path / "runs", ep))
    deadline = time.monotonic() + 30
    while Path(f"/proc/{holder}").exists():  # the episode's process is gone too
        assert time.monotonic() < deadline, "the episode's process is still there"
        time.sleep(0.2)


@pytest.mark.parametrize(("who", "sig", "code"), [("child", signal.SIGTERM, 143),
                                                  ("parent", signal.SIGINT, 130)])
def test_a_signal_ends_the_stdio_episode_judged_with_a_documented_status(
        tmp_path: Path, who: str, sig: int, code: int) -> None:
    """SIGTERM to the episode's child (before: the episode lost, the parent exited 241), or a
    Ctrl-C that reaches only the parent (which passes it on): judged, then 143 or 130."""
    wire = Wire(_server_argv(tmp_path), tmp_path / "server.log")
    try:
        wire.start()
        wire.call(1, "run_command", command="touch a")
        assert wire.reply()["result"]["content"][0]["text"] == "exit code 0"
        os.kill(wire.holder() if who == "child" else wire.proc.pid, sig)
        assert wire.proc.wait(timeout=90) == code
    finally:
        wire.proc.kill()
    ep = _episode(tmp_path / "runs")
    assert ep["verdict"] == "fail" and ep["commands"] == 1, ep
    summary = _last_finish(_complete_cassette(tmp_path / "runs", ep))
    assert f"stopped by {signal.Signals(sig).name}" in summary
    assert f"interrupted (exit {code})" in (tmp_path / "server.log").read_text()


def test_stdio_answers_a_lone_surrogate_a_batch_and_an_endless_line_then_goes_on(
        tmp_path: Path) -> None:
    wire = Wire(_server_argv(tmp_path), tmp_path / "server.log")
    try:
        wire.start()
        wire.send(r'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":'
                  r'"run_command","arguments":{"command":"echo \ud800"}}}')
        assert wire.reply()["error"]["code"] == -32602
        wire.send('[{"jsonrpc":"2.0","id":6,"method":"ping"}]')
        assert "batches" in wire.reply()["error"]["message"]
        wire.send(b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":"'
                  + b"y" * (MAX_MESSAGE_BYTES + 10) + b'"}}')
        assert "longer than" in wire.reply()["error"]["message"]
        wire.call(8, "finish", summary="nothing")
        got = wire.reply()
        assert got["id"] == 8 and json.loads(got["result"]["content"][0]["text"])["verdict"] == \
            "fail"
        wire.proc.stdin.close()  # type: ignore[union-attr]  # opened with PIPE
        assert wire.proc.wait(timeout=60) == 0
    finally:
        wire.proc.kill()
    ep = _episode(tmp_path / "runs")
    assert ep["commands"] == 0 and ep["stop"] == "finish"
    _complete_cassette(tmp_path / "runs", ep)


def test_the_sdk_stdio_client_drives_the_flag_server_to_a_pass(tmp_path: Path) -> None:
    command, *args = _server_argv(tmp_path)

    async def client() -> str:
        async with Client(StdioServerParameters(command=command, args=args, cwd=str(ROOT)),
                          read_timeout_seconds=60) as c:
            for flag in ("a", "b"):
                assert not (await c.call_tool("run_command", {"command": f"touch {flag}"})
                            ).is_error
            result = await c.call_tool("finish", {"summary": "both set"})
            return "".join(getattr(x, "text", "") for x in result.content)

    assert json.loads(anyio.run(client))["verdict"] == "pass"
    ep = _episode(tmp_path / "runs")
    assert ep["verdict"] == "pass" and ep["agent"] == "mcp"
    _complete_cassette(tmp_path / "runs", ep)


# --- streamable HTTP -----------------------------------------------------------------------------

def _http_server(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], int, str]:
    """The flag-guest server on HTTP; its process, port and the one stderr line with the URL."""
    port = _free_port()
    proc = subprocess.Popen(_server_argv(tmp_path, "--http", f"{extra[0] if extra else '127.0.0.1'}"
                                         f":{port}", *extra[1:]),
                            cwd=ROOT, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    while True:  # the server says where it is (and warns first, on another machine's address)
        line = proc.stderr.readline()
        assert line, f"the server ended: {lines}"
        lines.append(line)
        if "MCP at http://" in line:
            return proc, port, "".join(lines)


def _rest(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    return proc.stderr.read()


def test_http_needs_the_token_and_refuses_foreign_hosts_and_origins(tmp_path: Path) -> None:
    """Before: no authentication; a request with a foreign Host and Origin ran commands, and a
    stranger's DELETE ended the episode."""
    proc, port, said = _http_server(tmp_path)
    try:
        token = re.search(r"\(token (\S+)\)", said)
        assert token, said
        url = f"http://127.0.0.1:{port}/mcp"
        body = json.dumps(INIT)
        plain = {"content-type": "application/json",
                 "accept": "application/json, text/event-stream"}
        good = {**plain, "authorization": f"Bearer {token[1]}"}
        for headers, status in (
                (plain, 401), ({**plain, "authorization": "Bearer wrong"}, 401),
                ({**plain, "authorization": f"bearer {token[1]}x"}, 401),
                ({**good, "host": f"evil.example:{port}"}, 421),
                ({**good, "origin": "http://evil.example"}, 403),
                ({**good, "origin": f"http://evil.example:{port}"}, 403)):
            r = httpx2.post(url, content=body, headers=headers, timeout=30)
            assert r.status_code == status, (headers, r.status_code, r.text)
        assert httpx2.delete(url, headers=plain, timeout=30).status_code == 401
        assert httpx2.post(url, content=body, headers={**good, "origin": f"http://localhost:{port}"},
                           timeout=30).status_code == 200

        async def client() -> str:
            transport = streamable_http_client(url, http_client=httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {token[1]}"},
                timeout=httpx2.Timeout(30, read=300)))
            async with Client(transport, read_timeout_seconds=60) as c:
                await c.call_tool("run_command", {"command": "touch a"})
                result = await c.call_tool("finish", {"summary": "one of two"})
                return "".join(getattr(x, "text", "") for x in result.content)

        assert json.loads(anyio.run(client))["verdict"] == "fail"
        assert proc.wait(timeout=60) == 0  # judged: the HTTP server stops by itself
    finally:
        proc.kill()
    ep = _episode(tmp_path / "runs")
    assert ep["commands"] == 1 and ep["stop"] == "finish" and "one of two" in _last_finish(
        _complete_cassette(tmp_path / "runs", ep))


def test_http_on_another_machines_address_warns_and_the_token_may_go_to_a_file(
        tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    proc, port, said = _http_server(tmp_path, "0.0.0.0", "--http-remote", "--http-token-file",
                                    str(token_file))
    try:
        token = token_file.read_text().strip()
        assert token_file.stat().st_mode & 0o777 == 0o600 and token not in said
        [warning] = [line for line in said.splitlines() if "warning" in line]
        assert "--http-remote" in warning and "other machines" in warning
        url = f"http://127.0.0.1:{port}/mcp"
        headers = {"content-type": "application/json",
                   "accept": "application/json, text/event-stream"}
        assert httpx2.post(url, content=json.dumps(INIT), timeout=30,
                           headers={**headers, "host": f"evil.example:{port}",
                                    "origin": "http://evil.example"}).status_code == 421
        assert httpx2.post(url, content=json.dumps(INIT), headers=headers,
                           timeout=30).status_code == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 143  # judged first, then the status of a SIGTERM
    finally:
        proc.kill()
    assert "interrupted (exit 143)" in _rest(proc)
    ep = _episode(tmp_path / "runs")
    assert ep["commands"] == 0 and "stopped by SIGTERM" in _last_finish(
        _complete_cassette(tmp_path / "runs", ep))
