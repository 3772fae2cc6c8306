"""The closing hostile sweep of issue #46 (round three): new variants of each kind of attack the
issue found, against the rules docs/reliability.md now states. No VM, no model: files under
``tmp_path``, the CLI in-process, and the real ``rootbench mcp`` on the flag guest (a process).

Each test named for a finding failed before its fix; the others hold variants that already
ended in one line or an answer, so a later change cannot undo them unseen.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli

from runner.app.compare import compare_runs, render_comparisons
from runner.app.mcp_http import parse_http
from runner.app.mcp_stdio import screen_message
from runner.app.ray_executor import reachable
from runner.app.runs import write_results
from runner.core.agent_input import MAX_COMMAND_CHARS, bounded_command, bounded_timeout
from runner.core.cassette import find_cassettes
from runner.core.episode import Episode
from runner.core.errors import AgentInputError, InvalidInput
from runner.core.outcomes import AgentKind, Verdict
from runner.core.paths import contained, repo_root, resolve_in_root

ROOT = repo_root()
ORACLE = ROOT / "recordings" / "oracle"
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


# --- paths a recipe names: resolved inside the root ------------------------------------------

def test_a_path_or_link_target_with_two_leading_slashes_resolves_inside_the_root(
        tmp_path: Path) -> None:
    """POSIX lets a path start with ``//`` and Linux reads it as ``/``. resolve_in_root took the
    ``//`` for a component, joined it to the root (which made the host's own ``/``), looked the
    rest up on the host and then refused the result: ``populate_from: //srv/data``, or a link
    ``srv -> //data``, named nothing in the image."""
    root, host = tmp_path / "root", tmp_path / "host"
    (root / "run" / "data").mkdir(parents=True)
    (host / "data").mkdir(parents=True)
    assert resolve_in_root(root, "//run/data") == root / "run" / "data"
    assert resolve_in_root(root, "//run//data//") == root / "run" / "data"
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("//run")  # an absolute link, spelt with two slashes
    assert resolve_in_root(root, "/var/run/data") == root / "run" / "data"
    (root / "srv").symlink_to("//" + str(host).lstrip("/"))  # the host's folder, as the image sees it
    found = resolve_in_root(root, "/srv/data")
    assert found == root / str(host).lstrip("/") / "data"
    assert found is not None and contained(found, root) == found


def test_new_symlink_shapes_in_a_recipe_path_never_leave_the_root(tmp_path: Path) -> None:
    """Variants the sweep tried (all held): ``/..``, a relative link climbing 50 levels, a chain of
    links ending outside, a planted ``/proc/self -> /``, ``/dev/fd`` through it, a link to a
    file used as a folder, a name too long, a NUL."""
    root, host = tmp_path / "root", tmp_path / "host"
    (root / "run" / "data").mkdir(parents=True)
    (host / "data").mkdir(parents=True)
    (root / "dotdot").symlink_to("/..")
    (root / "deep").symlink_to("/" + "../" * 50 + str(host).lstrip("/"))
    (root / "chain1").symlink_to("chain2")
    (root / "chain2").symlink_to(str(host))
    (root / "proc").mkdir()
    (root / "proc" / "self").symlink_to("/")
    (root / "dev").mkdir()
    (root / "dev" / "fd").symlink_to("/proc/self/fd")
    (root / "f").write_text("x")
    (root / "tofile").symlink_to("/f")
    for name in ("/dotdot", "/deep/data", "/chain1/data", f"/proc/self/{host}/data", "/dev/fd/..",
                 "/tofile/x", "/" + "a" * 5000, "/run/\0", "run/data/../../.."):
        found = resolve_in_root(root, name)
        assert found is None or contained(found, root) == found, name
    assert sorted(p.name for p in host.iterdir()) == ["data"]


# --- input from an agent: bounded before any work ------------------------------------------------

def test_a_timeout_too_long_to_print_is_refused_as_agent_input() -> None:
    """A Python agent's ``shell.run(cmd, timeout=-10**5000)``: the refusal's message printed the
    integer, which Python will not turn into text past 4,300 digits, so the agent got a bare
    ValueError about integer conversion instead of the one-line refusal."""
    with pytest.raises(AgentInputError, match="above zero"):
        bounded_timeout(-10 ** 5000)
    with pytest.raises(AgentInputError, match="above zero"):
        bounded_timeout(-(2 ** 2000))
    assert bounded_timeout(10 ** 5000) == 3600.0
    assert bounded_timeout(5e-324) == 5e-324  # tiny but positive: the loop's floor of 1 s applies
    for bad in (-0.0, float("nan"), float("-inf"), True, "10", [1]):
        with pytest.raises(AgentInputError):
            bounded_timeout(bad)


def test_a_string_subclass_cannot_talk_its_way_past_the_command_bounds() -> None:
    """A ``str`` subclass answers ``len``, ``strip`` and ``encode`` itself: one that said 1 got a
    1 MB command with a NUL past every bound. The command is now taken as the plain string it
    holds, and that is what is checked, recorded and run."""

    class Liar(str):
        def __len__(self) -> int:
            return 1

        def strip(self, chars: str | None = None) -> str:
            return "x"

        def __contains__(self, key: object) -> bool:
            return False

    with pytest.raises(AgentInputError, match="characters long"):
        bounded_command(Liar("a" * (MAX_COMMAND_CHARS + 1)))
    with pytest.raises(AgentInputError, match="NUL"):
        bounded_command(Liar("echo \0"))
    kept = bounded_command(Liar("echo hi"))
    assert kept == "echo hi" and type(kept) is str


# --- the MCP server: every message gets an answer ------------------------------------------------

_INVALID = {
    b'42': None, b'"hello"': None, b'null': None,
    b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}': None,
    b'{"jsonrpc":"2.0","id":true,"method":"ping"}': None,
    b'{"jsonrpc":"2.0","id":{},"method":"ping"}': None,
    b'{"jsonrpc":"2.0","id":null,"method":"ping"}': None,
    b'{"jsonrpc":"1.0","id":2,"method":"ping"}': 2,
    b'{"jsonrpc":"2.0","id":3}': 3,
    b'{"jsonrpc":"2.0","id":"a","method":5}': "a",
    b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"run_command","arguments":'
    b'{"command":"id","x":' + b"[" * 900 + b"]" * 900 + b'}}}': 4,
}


def test_a_message_the_sdk_would_drop_unanswered_gets_an_invalid_request_error() -> None:
    """Over stdio the SDK answers nothing to a message that is not a JSON-RPC request it can read:
    a number or a string, an id that is a float, a bool, an object or null (it took those for
    notifications), a wrong ``jsonrpc``, no ``method``, or nesting deeper than its own parser
    takes (900 levels pass Python's). The client then waited for ever. Each now gets -32600,
    with the message's id when it has a usable one."""
    for line, msg_id in _INVALID.items():
        text, reply = screen_message(line)
        assert text is None and reply is not None, line[:60]
        error = json.loads(reply)
        assert error["error"]["code"] == -32600 and error["id"] == msg_id, (line[:60], error)
        assert "\n" not in error["error"]["message"] and len(error["error"]["message"]) < 300
    for good in (b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
                 b'{"jsonrpc":"2.0","id":"x","method":"ping","params":{}}',
                 b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
                 b'{"jsonrpc":"2.0","id":7,"result":{}}',
                 b'{"jsonrpc":"2.0","id":8,"error":{"code":-1,"message":"no"}}',
                 b'{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"no"}}',
                 b'{"jsonrpc":"2.0","id":%d,"method":"ping"}' % 10 ** 30):
        assert screen_message(good) == (good.decode(), None), good


def _reply(proc: subprocess.Popen[bytes], buffer: list[bytes], within: float = 30.0) -> Any:
    assert proc.stdout is not None
    deadline = time.monotonic() + within
    while b"\n" not in buffer[0]:
        left = deadline - time.monotonic()
        assert left > 0 and select.select([proc.stdout], [], [], left)[0], "no reply in time"
        chunk = os.read(proc.stdout.fileno(), 65536)
        assert chunk, "the server closed its stdout"
        buffer[0] += chunk
    line, buffer[0] = buffer[0].split(b"\n", 1)
    return json.loads(line)


def test_the_stdio_server_answers_invalid_requests_and_still_judges(tmp_path: Path) -> None:
    # A process: the real `rootbench mcp` over stdio on the flag guest (tests/flag_mcp.py).
    spec = tmp_path / "flags.yaml"
    spec.write_text(FLAGS)
    proc = subprocess.Popen([sys.executable, str(FLAG_MCP), str(spec), str(tmp_path / "runs")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=(tmp_path / "server.log").open("w"), cwd=ROOT)
    assert proc.stdin is not None
    buffer = [b""]

    def send(line: bytes) -> None:
        assert proc.stdin is not None
        proc.stdin.write(line + b"\n")
        proc.stdin.flush()

    try:
        send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "sweep", "version": "0"}}}).encode())
        assert _reply(proc, buffer)["id"] == 0
        send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        for line, msg_id in _INVALID.items():
            send(line)
            got = _reply(proc, buffer)
            assert got["error"]["code"] == -32600 and got["id"] == msg_id, (line[:60], got)
        send(json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "finish", "arguments": {"summary": "nothing"}}}).encode())
        got = _reply(proc, buffer, within=90)
        assert got["id"] == 9 and json.loads(got["result"]["content"][0]["text"])["verdict"] == "fail"
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert "Traceback" not in (tmp_path / "server.log").read_text()
    [results] = (tmp_path / "runs").glob("*/results.json")
    [episode] = json.loads(results.read_text())["episodes"]
    assert episode["stop"] == "finish" and episode["commands"] == 0


@pytest.mark.parametrize("value", ["[::1]:0", "localhost:99999", "0:80", "::", "/tmp/mcp.sock",
                                   "unix:/tmp/mcp.sock", "[::ffff:127.0.0.1]:8765", "[::]:8765",
                                   "127.0.0.1:8765:1", "a" * 300 + ":8765", "\u0668\u0667\u0666\u0665"])
def test_http_addresses_of_the_sweep_are_one_line(value: str) -> None:
    """``--http`` oddities (all held): a port of 0 or past 65535, the wildcard in either
    spelling, a unix socket path, an IPv4-mapped loopback, a label too long, Unicode digits."""
    with pytest.raises(InvalidInput) as err:
        parse_http(value)
    assert err.value.field == "--http" and "\n" not in str(err.value)


# --- Ray: a bad address is bad input ---------------------------------------------------------------

def test_a_ray_address_with_a_long_label_or_a_long_port_is_one_line(cli: Cli) -> None:
    """``--ray-address`` with a host label over 63 characters (the IDNA codec's UnicodeError) or a
    port of 5,000 digits (Python will not read an integer that long) crashed: "unexpected error
    ... please report this", exit 1 and a crash log, for what is bad input."""
    for address in ("a" * 300 + ":6379", "127.0.0.1:" + "0" * 5000 + "1", "127.0.0.1:\u0666\u0663\u0667\u0669",
                    "127.0.0.1:65536", "127.0.0.1:6379\n"):
        with pytest.raises(InvalidInput) as err:
            reachable(address)
        assert err.value.field == "--ray-address" and "\n" not in str(err.value)
        assert len(str(err.value)) < 300
    r = cli("-q", "bench", "--agent", "noop", "--executor", "ray", "--ray-address",
            "a" * 300 + ":6379", "specs/dir-missing-exec.yaml", timeout=60)
    assert r.returncode == 2 and "please report" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# --- run folders: what they hold stays theirs --------------------------------------------------

def _oracle_cassette() -> Path:
    return next(p for p in sorted(ORACLE.glob("*.jsonl")) if p.name.count(".") == 1)


def test_a_cassette_linked_from_outside_the_folder_is_neither_exported_nor_replayed(
        cli: Cli, tmp_path: Path) -> None:
    """A run or recordings folder may hold a symlink whose target lies outside it (a contributed
    folder: git keeps links). ``export`` followed it and put that outside cassette, of another
    run of the user's, in the Harbor trial folder made to be shared; ``replay`` read it.
    A file found in a folder is now one of the folder's only if its real path is inside it."""
    source = _oracle_cassette()
    secret = tmp_path / "elsewhere" / f"secret-{source.name}"
    secret.parent.mkdir()
    secret.write_text(source.read_text().replace('"task": "', '"task": "TOP-SECRET ', 1))
    folder = tmp_path / "contributed"
    folder.mkdir()
    shutil.copy(source, folder / source.name)
    stem = source.name.removesuffix(".jsonl")
    (folder / f"{stem}.r1.jsonl").symlink_to(secret)
    inside = folder / "sub"
    inside.mkdir()
    (inside / f"{stem}.r2.jsonl").symlink_to(Path("..") / source.name)  # a link inside: fine

    unreadable: list[tuple[Path, str]] = []
    found = find_cassettes([folder], unreadable=unreadable)
    assert found == [folder / source.name, inside / f"{stem}.r2.jsonl"]
    assert [p for p, _why in unreadable] == [folder / f"{stem}.r1.jsonl"]
    assert "outside" in unreadable[0][1]
    with pytest.raises(InvalidInput, match="outside"):
        find_cassettes([folder])
    assert find_cassettes([folder / f"{stem}.r1.jsonl"]) == [folder / f"{stem}.r1.jsonl"]  # named

    out = tmp_path / "export"
    r = cli("-q", "export", "--format", "atif", str(folder), "--out", str(out))
    assert r.returncode == 2 and "outside" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not any("TOP-SECRET" in p.read_text() for p in out.rglob("*") if p.is_file())
    r = cli("-q", "replay", "--offline", str(folder), timeout=120)
    assert r.returncode == 2 and "TOP-SECRET" not in r.stdout + r.stderr
    assert re.search(rf"{stem}\.r1\.jsonl .*unreadable", r.stdout), r.stdout


EVIL = ("evil\n<!-- results:end -->\n\x1b[31mred\x1b]0;t\x07 \u202egnp.exe\u2028x\x85y\r"
        "-->|[a](javascript:alert(1))<script>alert(1)</script>")


def _run(folder: Path, model: str, protocol: str, scenario: str) -> Path:
    eps = [Episode(scenario=scenario, agent=AgentKind.MODEL, model=model, protocol=protocol,
                   round=0, verdict=Verdict.PASS, reason="ok", score=1.0)]
    folder.mkdir()
    write_results(folder, {"agent": {"kind": "model", "model": model}}, eps)
    return folder


@pytest.mark.parametrize("fmt", ["github", "plain"])
def test_compare_shows_names_from_recordings_as_one_escaped_line(tmp_path: Path, fmt: str) -> None:
    """``report`` was mended (#46 item 8) but ``compare`` still printed a run's model and protocol
    names and its scenario ids as they were recorded: newlines added lines (and made a
    ``<!-- results:end -->`` line of its own), ``|`` added cells to its github tables, HTML and
    U+2028 went through. Now one line each, and escaped for Markdown in a github one."""
    plain = render_comparisons(compare_runs([_run(tmp_path / "a", "m", "tools", "s1"),
                                             _run(tmp_path / "b", "n", "json", "s1")]), fmt)
    evil = render_comparisons(compare_runs([_run(tmp_path / "c", EVIL, EVIL, "s1\n| x |"),
                                            _run(tmp_path / "d", "n", "json", "s1\n| x |")]), fmt)
    assert len(evil.splitlines()) == len(plain.splitlines()), evil
    assert "\x1b" not in evil and "\u202e" not in evil and "\u2028" not in evil and "\x85" not in evil
    assert not any(line.strip() == "<!-- results:end -->" for line in evil.splitlines())
    if fmt == "github":
        assert re.search(r"(?<!\\)<(script|!--)", evil) is None, evil
        for line in evil.splitlines():
            if line.startswith("|"):
                assert len(re.findall(r"(?<!\\)\|", line)) in {
                    len(re.findall(r"(?<!\\)\|", ln)) for ln in plain.splitlines()
                    if ln.startswith("|")}, line


# --- nothing outside rootbench's own folders changes -------------------------------------------

def test_the_html_report_writes_nothing_in_home_outside_rootbenchs_cache(tmp_path: Path) -> None:
    # A process: matplotlib picks its folders when it is first imported, so only a process of
    # its own shows where a report's plots leave their caches.
    """``report --html`` drew its plots with matplotlib, which made ``~/.config/matplotlib`` and
    wrote its font list to ``~/.cache/matplotlib``: folders of the user's that are not
    rootbench's. Its config and cache now live in rootbench's cache folder."""
    home = tmp_path / "home"
    home.mkdir()
    run = _run(tmp_path / "run", "m", "tools", "s1")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "ROOTBENCH_CACHE")}
    done = subprocess.run([sys.executable, "-m", "runner", "-q", "report", str(run), "--html",
                           "--out", str(tmp_path / "r.html")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**env, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert "<img" in (tmp_path / "r.html").read_text(encoding="utf-8")  # the plots were drawn
    made = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert all(m == ".cache" or m.startswith(".cache/rootbench") for m in made), made


def test_the_http_guard_takes_the_bearer_scheme_in_any_case_and_lets_no_websocket_through() -> None:
    """RFC 9110: an auth scheme's name is case-insensitive, so `bearer TOKEN` is the token; a
    websocket (or any scope but HTTP and the server's own lifespan) never reaches the app."""
    import anyio

    from runner.app.mcp_http import Listener, guarded_app, parse_http

    address = parse_http("127.0.0.1:8765")
    reached: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(scope["type"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    guard = guarded_app(app, Listener(None, address, "s3cret"), lambda: None)  # type: ignore[arg-type]

    async def ask(scope: dict[str, Any]) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await guard(scope, receive, send)
        return sent

    def http(auth: bytes) -> dict[str, Any]:
        return {"type": "http", "method": "POST", "path": "/mcp",
                "headers": [(b"host", b"127.0.0.1:8765"), (b"authorization", auth)]}

    for auth, status in ((b"Bearer s3cret", 200), (b"bearer s3cret", 200), (b"BEARER  s3cret", 200),
                         (b"Bearer wrong", 401), (b"Basic s3cret", 401), (b"s3cret", 401)):
        sent = anyio.run(ask, http(auth))
        assert sent[0]["status"] == status, (auth, sent)
    socket_scope = {"type": "websocket", "path": "/mcp", "headers": [
        (b"host", b"127.0.0.1:8765"), (b"authorization", b"Bearer s3cret")]}
    assert anyio.run(ask, socket_scope) == [{"type": "websocket.close", "code": 1008}]
    assert reached == ["http", "http", "http"]  # the three good tokens, no websocket
