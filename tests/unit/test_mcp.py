"""``rootbench mcp``: the official MCP SDK's own client drives a real VM through the server.

Over stdio (the client launches the server) with the oracle's commands: a
pass; over streamable HTTP with nothing but ``finish``: a fail; and a stdio
client that goes away in the middle of a command: the machine is still
judged (by the server's detached child), and its VM is gone.
"""

from __future__ import annotations

from pathlib import Path

from conftest import Cli

SPEC = "specs/dir-missing-exec.yaml"


def test_a_bad_spec_or_address_is_one_line_and_exit_2(cli: Cli, tmp_path: Path) -> None:
    for args, says in ((["specs/nope.yaml"], "nope.yaml"),
                       ([SPEC, "--http", "localhost:http"], "--http: not [HOST:]PORT")):
        r = cli("mcp", *args, timeout=60)
        assert r.returncode == 2 and says in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


