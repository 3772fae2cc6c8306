"""Python agents (--agent FILE.py:Class) on real VMs: the bundled examples pass, fail and replay as
the built-in agents do.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import quick_specs, run_cli

from runner.app.replay import replay_one
from runner.core.cassette import Cassette

WHAT = "the Python agent API"


def _spec(tmp_path: Path, scenario_id: str) -> str:
    """A copy of the bundled spec without the reboot re-check (these test how an agent is run)."""
    return str(quick_specs(tmp_path / "specs", [scenario_id], WHAT) / f"{scenario_id}.yaml")


def _cli_run(tmp_path: Path, spec: str, agent: str, env: dict[str, str] | None = None,
             ) -> tuple[dict[str, Any], Path]:
    """``rootbench run``; its one result and its cassette."""
    r = run_cli("-q", "run", _spec(tmp_path, spec), "--agent", agent, "--runs-dir",
                str(tmp_path / "runs"), "--format", "json", env=env, timeout=600)
    assert r.returncode in (0, 1), r.stderr
    [results] = list((tmp_path / "runs").glob("*/results.json"))
    [episode] = json.loads(results.read_text())["episodes"]
    return episode, Path(episode["cassette"])


@pytest.mark.vm
def test_the_scripted_example_passes_its_scenario_on_a_real_vm_and_replays(
        tmp_path: Path, image: Any, no_new_qemu: None) -> None:
    ep, cassette = _cli_run(tmp_path, "dir-missing-exec",
                            "examples/scripted_agent.py:ScriptedAgent")
    assert ep["verdict"] == "pass" and ep["stop"] == "finish", ep["reason"]
    assert ep["agent"] == "python" and ep["model"] == "scripted-example" and ep["commands"] == 3
    assert ep["milestones"] == ["looked at the docs permissions"] and ep["fixed_at"]["turn"] == 2
    head = Cassette.load(cassette).header
    assert head["model"]["source"] == "examples/scripted_agent.py"
    assert len(head["model"]["sha256"]) == 64
    out = replay_one(cassette, offline=True, specs=[tmp_path / "specs"])
    assert out.same and out.episode is not None and out.episode.commands == 3, out


@pytest.mark.vm
def test_the_scripted_example_fails_another_scenario_on_a_real_vm(
        tmp_path: Path, image: Any, no_new_qemu: None) -> None:
    ep, cassette = _cli_run(tmp_path, "permission-403", "examples/scripted_agent.py:ScriptedAgent")
    # Its first command finds no /srv/docs there: it stops, and the machine is still broken.
    assert ep["verdict"] == "fail" and ep["stop"] == "finish" and ep["commands"] == 1, ep
    assert replay_one(cassette, offline=True, specs=[tmp_path / "specs"]).same


LOUD_AGENT = '''\
import os
import subprocess

print("loud at import")


class Loud:
    def solve(self, task, shell):
        print("loud in solve")
        os.write(1, b"loud on descriptor 1\\n")
        subprocess.run(["echo", "loud child"], check=True)
        shell.run("chmod 755 /srv/docs")
        shell.finish("gave /srv/docs its x bits back")
'''


@pytest.mark.vm
def test_what_a_python_agent_prints_leaves_format_json_one_document(
        tmp_path: Path, image: Any, no_new_qemu: None) -> None:
    """Its prints landed in the middle of the JSON on stdout (issue #46): they go to stderr."""
    (tmp_path / "loud.py").write_text(LOUD_AGENT)
    r = run_cli("-q", "run", _spec(tmp_path, "dir-missing-exec"), "--agent",
                f"{tmp_path / 'loud.py'}:Loud", "--runs-dir", str(tmp_path / "runs"),
                "--format", "json", timeout=600)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)  # one JSON document, nothing around it
    assert "loud" not in r.stdout
    for line in ("loud at import", "loud in solve", "loud on descriptor 1", "loud child"):
        assert line in r.stderr, r.stderr


class _ChatServer:
    """A real OpenAI-compatible server on loopback answering with a fixed script of tool calls."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls = list(calls)
        self.requests: list[dict[str, Any]] = []


def _chat_handler(state: _ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            state.requests.append(body)
            name, args = state.calls.pop(0) if state.calls else ("finish", {"summary": "?"})
            call = {"id": f"c{len(state.requests)}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)}}
            data = json.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "tool_calls": [call]}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def chat_server(calls: list[tuple[str, dict[str, Any]]]) -> Iterator[tuple[str, _ChatServer]]:
    state = _ChatServer(calls)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _chat_handler(state))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", state
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.vm
def test_the_openai_example_against_a_loopback_server_on_a_real_vm_replays_offline(
        tmp_path: Path, image: Any, no_new_qemu: None) -> None:
    script = [("run_command", {"command": "ls -ld /srv/docs"}),
              ("run_command", {"command": "chmod 755 /srv/docs"}),
              ("finish", {"summary": "gave /srv/docs its x bits back"})]
    with chat_server(script) as (url, server):
        ep, cassette = _cli_run(tmp_path, "dir-missing-exec", "examples/openai_agent.py:OpenAIAgent",
                                env={"OPENAI_BASE_URL": url, "OPENAI_MODEL": "scripted"})
    assert ep["verdict"] == "pass" and ep["commands"] == 2 and ep["model"] == "openai-example", ep
    assert len(server.requests) == 3 and server.requests[0]["model"] == "scripted"
    # The agent's model saw the task, and each command's real output from the VM.
    assert "403 Forbidden" in server.requests[0]["messages"][1]["content"]
    assert server.requests[1]["messages"][-1]["content"].startswith("exit code 0\ndrw-r--r--")
    out = replay_one(cassette, offline=True, specs=[tmp_path / "specs"])  # no agent, no server: the cassette alone
    assert out.same and out.episode is not None and out.episode.commands == 2, out
