"""A scripted agent: a fixed list of commands, no model. The smallest thing --agent can run.

    rootbench run specs/dir-missing-exec.yaml --agent examples/scripted_agent.py:ScriptedAgent

It fixes ``dir-missing-exec`` (its commands are that scenario's fix) and so
fails every other scenario: a useful control, and the API in 30 lines.
"""

from __future__ import annotations

from runner.core.agent_api import Shell


class ScriptedAgent:
    """Runs ``commands`` in order, stops early if one fails, then finishes."""

    name = "scripted-example"
    commands = [
        "stat -c '%a %U %n' /srv/docs /srv/docs/index.html",  # look before touching
        "chmod 755 /srv/docs",
        "curl -s -o /dev/null -w '%{http_code}\\n' http://localhost:8080/",
    ]

    def __init__(self) -> None:
        self.transcript: list[tuple[str, int | None, str]] = []  # an agent may keep any state

    def solve(self, task: str, shell: Shell) -> str:
        for command in self.commands:
            code, output = shell.run(command, timeout=20)
            self.transcript.append((command, code, output))
            if code != 0:
                shell.finish(f"stopped: {command!r} exited {code}")
                return "stopped"
        shell.finish("restored the execute bits of /srv/docs")
        return "done"
