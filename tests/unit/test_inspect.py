"""rootbench in Inspect AI: the ``rootbench`` task and sandbox, driven by Inspect's mock model.

The mock model replays the oracle's commands as ``bash`` tool calls (pass)
or does nothing (fail), each on a real VM; the cassette replays offline, and
the log opens in ``inspect view`` (a real viewer process on loopback).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runner.app.inspect_ext import _shell


def test_inspect_argv_becomes_one_shell_command() -> None:
    assert _shell(["bash", "--login", "-c", "ls /srv | wc -l"], None, None, None) == \
        "ls /srv | wc -l"
    assert _shell(["cat", "a b"], b"hi", "/tmp", {"X": "1 2"}) == \
        "cd /tmp && printf %s aGk= | base64 -d | X='1 2' cat 'a b'"


def test_inspect_finds_the_task_and_sandbox_through_the_entry_point(tmp_path: Path) -> None:
    r = subprocess.run([str(Path(sys.executable).parent / "inspect"), "eval", "runner/rootbench",
                        "--model", "mockllm/model", "-T", "scenarios=no-such-scenario",
                        "--log-dir", str(tmp_path), "--display", "plain"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode != 0
    assert "-T scenarios: no scenario with id 'no-such-scenario'" in r.stdout + r.stderr


