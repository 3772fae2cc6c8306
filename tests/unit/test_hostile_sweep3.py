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
from runner.app.mcp_server import parse_http, screen_message
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
