"""rootbench mcp on real VMs: the MCP SDK's own client over stdio and streamable HTTP (with the
server's token), and a client that goes away mid-command. The hostile cases, without a VM, are in
tests/unit/test_mcp.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from conftest import cli_argv, quick_specs
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from runner.app.replay import replay_one
from runner.core.cassette import Cassette
from runner.core.paths import repo_root
from runner.core.spec import load_spec

SPEC = "specs/dir-missing-exec.yaml"

ROOT = repo_root()


def _quick(tmp_path: Path) -> Path:
    """The folder of a copy of SPEC without the reboot re-check, for a run that passes."""
    return quick_specs(tmp_path / "specs", [Path(SPEC).stem], "an MCP client's episode")


def _params(runs: Path, *extra: str, spec: str = SPEC) -> StdioServerParameters:
    # A process: the MCP SDK's stdio client starts the server and speaks to it over its stdin/stdout.
    command, *args = cli_argv("mcp", spec, "--runs-dir", str(runs), *extra)
    return StdioServerParameters(command=command, args=args, cwd=str(ROOT))


def _results(runs: Path, within: float = 240.0) -> dict[str, Any]:
    """The one episode of the run directory, once results.json is there."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = list(runs.glob("*/results.json"))
        if found:
            [episode] = json.loads(found[0].read_text())["episodes"]
            return episode
        time.sleep(0.5)
    raise AssertionError(f"no results.json under {runs} after {within}s")


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@pytest.mark.vm
def test_the_oracle_through_the_sdk_client_over_stdio_passes_and_replays(
        tmp_path: Path, image: Any) -> None:
    runs, specs = tmp_path / "runs", _quick(tmp_path)
    solution = list(load_spec(ROOT / SPEC).solution)

    async def client() -> tuple[str, list[str], list[str], str, str]:
        # finish answers once judged (under rules 3 a pass is judged to its reboot re-check,
        # which this copy of the spec opts out of)
        spec = str(specs / Path(SPEC).name)
        async with Client(_params(runs, spec=spec), read_timeout_seconds=900) as c:
            tools = sorted(t.name for t in (await c.list_tools()).tools)
            prompt = await c.get_prompt("task")
            outputs = [_text(await c.call_tool("run_command", {"command": cmd}))
                       for cmd in solution]
            verdict = _text(await c.call_tool("finish", {"summary": "chmod 755 /srv/docs"}))
            late = await c.call_tool("run_command", {"command": "true"})
            assert late.is_error
            return (c.instructions or "", tools, outputs, verdict,
                    json.dumps(prompt.model_dump(mode="json")) + _text(late))

    instructions, tools, outputs, verdict, rest = anyio.run(client)
    assert tools == ["finish", "run_command"]
    assert instructions.startswith("Our team documentation site on port 8080")
    assert "403 Forbidden" in rest and "the episode is over: the agent finished" in rest
    assert outputs == ["exit code 0"] * len(solution)
    assert json.loads(verdict)["verdict"] == "pass"
    ep = _results(runs)
    assert ep["verdict"] == "pass" and ep["agent"] == "mcp" and ep["commands"] == len(solution)
    cassette = Path(ep["cassette"])
    assert Cassette.load(cassette).header["model"] == {"kind": "mcp", "name": "mcp-client",
                                                       "transport": "stdio"}
    out = replay_one(cassette, offline=True, specs=[specs])  # no client, no VM: the cassette alone
    assert out.same and out.episode is not None and out.episode.commands == len(solution), out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.vm
def test_nothing_then_finish_over_streamable_http_fails(tmp_path: Path, image: Any) -> None:
    runs, port, token_file = tmp_path / "runs", _free_port(), tmp_path / "token"
    # A process: the server listens while this test is its HTTP client.
    server = subprocess.Popen(cli_argv("mcp", SPEC, "--http", f"127.0.0.1:{port}", "--runs-dir",
                                       str(runs), "--http-token-file", str(token_file)), cwd=ROOT,
                              stdin=subprocess.DEVNULL, stderr=(tmp_path / "server.log").open("w"))
    try:
        deadline = time.monotonic() + 60
        while True:  # wait for the server to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "never listened"
                time.sleep(0.3)

        url, token = f"http://127.0.0.1:{port}/mcp", token_file.read_text().strip()
        assert httpx2.post(url, json={}, timeout=30).status_code == 401  # no token, no shell

        async def client() -> str:
            transport = streamable_http_client(url, http_client=httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {token}"},
                timeout=httpx2.Timeout(30, read=300)))
            async with Client(transport, read_timeout_seconds=300) as c:
                return _text(await c.call_tool("finish", {"summary": "did nothing"}))

        verdict = json.loads(anyio.run(client))
        assert verdict["verdict"] == "fail" and verdict["score"] < 1, verdict
        assert server.wait(timeout=120) == 0  # judged: the HTTP server stops by itself
    finally:
        if server.poll() is None:  # SIGTERM: the server judges first (slow under TCG)
            server.terminate()
            try:
                server.wait(timeout=300)
            except subprocess.TimeoutExpired:
                server.kill()
    ep = _results(runs, within=5)
    assert ep["verdict"] == "fail" and ep["commands"] == 0 and ep["stop"] == "finish"
    assert replay_one(Path(ep["cassette"]), offline=True).same


def _qemu_of(parent: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(parent), "-f", "qemu-system"], capture_output=True,
                         text=True, timeout=10)
    return {int(p) for p in out.stdout.split()}


def _episode_holder(runs: Path, spec: str) -> int | None:
    """The detached child that holds the episode (its command line names our runs dir)."""
    out = subprocess.run(["pgrep", "-f", f"runner mcp {spec} --runs-dir {runs}"],
                         capture_output=True, text=True, timeout=10)
    for pid in map(int, out.stdout.split()):
        env = Path(f"/proc/{pid}/environ")
        try:
            if b"ROOTBENCH_MCP_DETACHED=1" in env.read_bytes():
                return pid
        except OSError:
            continue
    return None


@pytest.mark.vm
def test_a_client_that_disconnects_mid_command_is_judged_and_leaves_no_vm(
        tmp_path: Path, image: Any) -> None:
    runs = tmp_path / "runs"
    spec = str(_quick(tmp_path) / Path(SPEC).name)
    seen: dict[str, Any] = {}

    async def client() -> None:
        async with Client(_params(runs, spec=spec), read_timeout_seconds=300) as c:
            await c.call_tool("run_command", {"command": "chmod 711 /srv/docs"})
            seen["holder"] = holder = _episode_holder(runs, spec)
            seen["qemu"] = _qemu_of(holder) if holder else set()
            with anyio.move_on_after(3):  # gone while `sleep 8` runs in the guest
                await c.call_tool("run_command", {"command": "sleep 8; echo late"})
        # leaving the block closes the server's stdin, then kills its process group

    t0 = time.monotonic()
    anyio.run(client)
    assert seen["holder"] and seen["qemu"], seen
    # A passing run is judged to its end (the state diff; the spec's copy opts out of the reboot).
    ep = _results(runs, within=900)
    # Honest: judged on the machine as the client left it (711: traversable, so the site is
    # fixed even though the client never said so), not counted as an infrastructure failure.
    assert ep["verdict"] == "pass" and ep["stop"] == "finish" and ep["commands"] == 2, ep
    events = Cassette.load(Path(ep["cassette"])).events
    last = [e for e in events if e["type"] == "model"][-1]["reply"]["message"]
    assert "the client disconnected" in last["tool_calls"][0]["function"]["arguments"]
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{p}").exists() for p in seen["qemu"] | {seen["holder"]}):
        assert time.monotonic() < deadline, "the episode's process or its VM is still there"
        time.sleep(0.5)
    assert time.monotonic() - t0 < 1000
