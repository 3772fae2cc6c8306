"""The code examples of docs/agents.md, run as printed there against real VMs (issue #49).

Each example is taken from the page itself, so a doc cannot drift from the code: the
Python agent, the command that runs it, the MCP SDK client and the offline Inspect
evaluation. They run in a folder of their own whose ``specs/`` holds copies of the bundled
specs they name, without the reboot re-check (an example of how to reach the sandbox is
not a test of lasting fixes), and with ``rootbench`` on the PATH as a user's install has it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import quick_specs

from runner.core.paths import repo_root

pytestmark = pytest.mark.vm

DOC = repo_root() / "docs" / "agents.md"
WHAT = "a documentation example"


def _blocks(language: str) -> list[str]:
    """The page's fenced blocks in ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.M | re.S)


def _block(language: str, marker: str) -> str:
    """The one block of ``language`` that holds ``marker``."""
    [block] = [b for b in _blocks(language) if marker in b]
    return block


def _env(folder: Path) -> dict[str, str]:
    """This environment with the venv's ``rootbench`` first on the PATH and the folder's specs."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "ROOTBENCH_SPECS": str(folder / "specs")}


def _run(argv: list[str], folder: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=folder, env=_env(folder), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _episode(folder: Path) -> dict[str, Any]:
    [results] = list((folder / "runs").glob("*/results.json"))
    [episode] = json.loads(results.read_text())["episodes"]
    return dict(episode)


def test_the_python_agent_example_runs_with_the_command_the_page_gives(tmp_path: Path) -> None:
    source = _block("python", "# my_agent.py")
    (tmp_path / "my_agent.py").write_text(source)
    [command] = [ln for ln in _block("sh", "--agent my_agent.py:MyAgent").splitlines()
                 if ln.startswith("rootbench run ")]
    scenario = command.split()[2]  # specs/nginx-stopped.yaml
    quick_specs(tmp_path / "specs", [Path(scenario).stem], WHAT)
    r = _run(["sh", "-c", command], tmp_path)
    # The example looks and finishes without fixing anything: a judged fail (a run that ends
    # judged exits 0), not a crash.
    assert r.returncode == 0, r.stderr[-2000:]
    ep = _episode(tmp_path)
    assert ep["verdict"] == "fail" and ep["stop"] == "finish" and ep["commands"] == 1, ep
    assert ep["model"] == "my-agent" and ep["agent"] == "python", ep


def test_the_mcp_client_example_passes_its_scenario(tmp_path: Path) -> None:
    source = _block("python", "StdioServerParameters")
    spec = re.search(r'"mcp", "([^"]+\.yaml)"', source)
    assert spec is not None, source
    quick_specs(tmp_path / "specs", [Path(spec.group(1)).stem], WHAT)
    (tmp_path / "client.py").write_text(source)
    r = _run([sys.executable, "client.py"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Our team documentation site on port 8080"), lines
    assert lines[-1].startswith("{") and json.loads(lines[-1])["verdict"] == "pass", lines[-1]
    assert "drw-r--r--" in r.stdout  # the `ls -ld` it printed: the fault, before its fix
    assert _episode(tmp_path)["verdict"] == "pass"


def test_the_inspect_example_passes_offline(tmp_path: Path) -> None:
    source = _block("python", "from inspect_ai import eval")
    scenario = re.search(r'rootbench\(scenarios="([^"]+)"\)', source)
    assert scenario is not None, source
    quick_specs(tmp_path / "specs", [scenario.group(1)], WHAT)
    (tmp_path / "evaluate.py").write_text(source)
    r = _run([sys.executable, "evaluate.py"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    # Inspect's Score, printed: the verdict C with the graded score 1.0, the answer pass.
    assert "'verdict': 'C'" in r.stdout and "'score': 1.0" in r.stdout and "answer='pass'" in r.stdout, \
        r.stdout[-2000:]
    assert _episode(tmp_path)["verdict"] == "pass"
