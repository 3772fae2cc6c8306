"""rootbench in Inspect AI: the ``rootbench`` task and sandbox, driven by Inspect's mock model.

The mock model replays the oracle's commands as ``bash`` tool calls (pass)
or does nothing (fail), each on a real VM; the cassette replays offline, and
the log opens in ``inspect view`` (a real viewer process on loopback).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from runner.app.episodes import RunOptions
from runner.app.inspect_ext import (
    InspectBridge,
    RootbenchSandbox,
    _shell,
    _write_command,
    rootbench,
)
from runner.app.mcp_server import EpisodeRun
from runner.core.agent_input import MAX_COMMAND_CHARS, MAX_WRITE_FILE_BYTES, bounded_command
from runner.core.errors import AgentInputError
from runner.core.paths import repo_root
from runner.core.spec import load_spec


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


def test_a_command_list_gets_its_input_and_environment_whole() -> None:
    """``bash -c 'a && b'`` with an input: the input went to ``a`` alone and ``b`` read the
    shell's /dev/null, so write_file wrote empty files and said it had succeeded."""
    assert _shell(["bash", "-c", "mkdir -p d && cat > f"], b"hi", None, None) == \
        "printf %s aGk= | base64 -d | (mkdir -p d && cat > f\n)"
    assert _shell(["bash", "-c", "a; b # note"], None, "/tmp", {"X": "1"}) == \
        "cd /tmp && (export X=1\na; b # note\n)"


@pytest.mark.parametrize("contents", [b"", b"\x00\xffbinary\n", "caf\u00e9\n" * 1000,
                                      bytes(range(256)) * 64])
def test_write_files_command_writes_the_file_in_a_real_shell(tmp_path: Path,
                                                             contents: str | bytes) -> None:
    target = tmp_path / "new dir" / "it's a file"
    subprocess.run(["bash", "-c", _write_command(str(target), contents)], check=True,
                   stdin=subprocess.DEVNULL, timeout=30)  # the agent's shell reads /dev/null
    want = contents.encode() if isinstance(contents, str) else contents
    assert target.read_bytes() == want


def test_write_file_takes_what_fits_one_command_and_refuses_more_in_one_line() -> None:
    longest_path = "/" + "/".join(["d" * 250] * 16)  # 4,016 characters: near PATH_MAX
    command = _write_command(longest_path, b"x" * MAX_WRITE_FILE_BYTES)
    assert bounded_command(command) == command  # the agent's edge lets it through
    for path, size in [("/etc/big", MAX_WRITE_FILE_BYTES + 1),
                       ("/tmp/" + "'" * 3000, MAX_WRITE_FILE_BYTES)]:  # quoted: 15,000 long
        with pytest.raises(AgentInputError, match=f"at most {MAX_WRITE_FILE_BYTES:,}") as caught:
            _write_command(path, b"x" * size)
        assert "\n" not in str(caught.value) and "write it in parts" in str(caught.value)


@pytest.mark.parametrize(("name", "value", "says"), [
    ("hints", "abc", "-T hints: a whole number from 0 up, not 'abc'"),
    ("hints", -1, "-T hints: a whole number from 0 up, not -1"),
    ("hints", 1.5, "-T hints: a whole number from 0 up, not 1.5"),
    ("epochs", 0, "-T epochs: a whole number from 1 up, not 0"),
    ("epochs", "two", "-T epochs: a whole number from 1 up, not 'two'"),
])
def test_a_bad_task_parameter_is_one_line_naming_it(name: str, value: object, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        # What Inspect passes from -T is whatever YAML made of it, whatever the hints say.
        rootbench(scenarios="dir-missing-exec", **{name: value})  # type: ignore[arg-type]
    assert str(caught.value) == says and type(caught.value) is ValueError


def test_a_command_the_solver_may_not_send_is_an_error_result_not_an_exception(
        tmp_path: Path) -> None:
    """The sandbox's exec answers the solver with the one-line reason, and nothing runs (the
    episode is made but never started: the refusal comes before the bridge waits)."""
    scenario = load_spec(repo_root() / "specs" / "dir-missing-exec.yaml")
    run = EpisodeRun(scenario, RunOptions(), tmp_path, 0, InspectBridge("inspect"), {})
    box = RootbenchSandbox(run)
    for cmd, says in [(["bash", "-c", "echo \ud800"], "lone surrogate"),
                      (["bash", "-c", "x" * (MAX_COMMAND_CHARS + 1)], "at most")]:
        result = anyio.run(box.exec, cmd)
        assert not result.success and result.returncode == 1 and says in result.stderr, result
