"""rootbench for Inspect AI: a ``rootbench`` sandbox and a ``rootbench`` task over the scenarios.

Installed with ``pip install 'rootbench[inspect]'``, which registers this
module under Inspect's ``inspect_ai`` entry-point group, so Inspect finds
the sandbox by name and the task as ``runner/rootbench``:

    inspect eval runner/rootbench --model openai/gpt-4o-mini -T scenarios=nginx-stopped

Each sample gets a VM restored from the golden snapshot with the scenario's
fault injected (``sample_init``); the solver's ``exec`` calls (Inspect's
``bash()`` tool, ``read_file``, ``write_file``) are the episode's agent
commands, driven through the same bridge as the Python agent API
(:mod:`runner.core.agent_api`), so rootbench's budgets, forbidden commands,
fix tracking and milestones apply and a cassette is written that replays
without Inspect. The scorer ends the episode and returns rootbench's verdict
(score, milestones and flags as metadata); ``sample_cleanup`` makes sure the
VM is judged and torn down even when the solver failed.

Only this module imports Inspect; nothing else in rootbench needs it.
"""

from __future__ import annotations

import base64
import shlex
import sys
from pathlib import Path
from typing import Any, Literal, overload

import anyio
from inspect_ai import Task, task
from inspect_ai._util.package import get_installed_package_name
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, mean, scorer, stderr
from inspect_ai.solver import TaskState, generate, system_message, use_tools
from inspect_ai.tool import bash
from inspect_ai.util import ExecResult, SandboxEnvironment, sandbox, sandboxenv
from inspect_ai.util._sandbox.environment import RootAccess

from runner.app.episodes import RunOptions
from runner.app.mcp_server import JUDGE_WAIT, EpisodeRun
from runner.app.runs import new_run_dir
from runner.core.agent_api import BridgeModel, EpisodeOver
from runner.core.agent_input import MAX_COMMAND_CHARS, MAX_WRITE_FILE_BYTES
from runner.core.errors import AgentInputError, InvalidInput
from runner.core.outcomes import AgentKind
from runner.core.paths import default_spec_dirs
from runner.core.protocol import BASE_PROMPT
from runner.core.selection import pick_ids
from runner.core.spec import load_spec, load_specs, task_text
from runner.core.text import one_line

NAME = "rootbench"


class InspectBridge(BridgeModel):
    """The bridge whose agent is an Inspect solver (nothing to start: it calls exec)."""

    agent = AgentKind.INSPECT


def _shell(cmd: list[str], input: str | bytes | None, cwd: str | None,
           env: dict[str, str] | None) -> str:
    r"""Inspect's argv as one command for the agent's shell (``bash -c X`` is X itself).

    X may be a list of commands (``a && b``, ``a; b``): before an environment, an
    input or a working directory is put around it, it is grouped in a subshell
    (``( X\n)``; the newline ends a trailing comment), or the input would reach
    only its first command and the rest would read the shell's /dev/null.
    Parentheses, not braces: the forbidden-command check splits at them and so
    still sees every command inside.
    """
    if len(cmd) >= 3 and cmd[0] == "bash" and cmd[-2] == "-c" and set(cmd[1:-2]) <= {"--login"}:
        command, grouped = cmd[-1], False
    else:
        command, grouped = shlex.join(cmd), True  # one simple command: nothing to group
    if env:
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        command = f"{assignments} {command}" if grouped else f"(export {assignments}\n{command}\n)"
        grouped = True
    if input is not None:
        data = input.encode() if isinstance(input, str) else input
        body = command if grouped else f"({command}\n)"
        command = f"printf %s {shlex.quote(base64.b64encode(data).decode())} | base64 -d | {body}"
        grouped = True
    if cwd:
        command = f"cd {shlex.quote(cwd)} && " + (command if grouped else f"({command}\n)")
    return command


def _write_command(file: str, contents: str | bytes) -> str:
    """The command that writes ``contents`` to ``file``: the file travels base64-encoded on the
    command line, so it may hold at most :data:`~runner.core.agent_input.MAX_WRITE_FILE_BYTES`
    bytes (a command is at most :data:`~runner.core.agent_input.MAX_COMMAND_CHARS` characters);
    a larger one is an :class:`AgentInputError` naming the limit, before anything runs."""
    data = contents.encode() if isinstance(contents, str) else contents
    too_long = AgentInputError(
        f"cannot write {one_line(file, 100)}: {len(data):,} bytes; rootbench's write_file takes "
        f"at most {MAX_WRITE_FILE_BYTES:,} (the file travels base64-encoded in one command of "
        f"at most {MAX_COMMAND_CHARS:,} characters): write it in parts")
    if len(data) > MAX_WRITE_FILE_BYTES:
        raise too_long
    path = shlex.quote(file)
    command = _shell(["bash", "-c", f"mkdir -p \"$(dirname {path})\" && cat > {path}"], data,
                     None, None)
    if len(command) > MAX_COMMAND_CHARS:  # a path of many quotes, quoted, is five times as long
        raise too_long
    return command


@sandboxenv(name=NAME)
class RootbenchSandbox(SandboxEnvironment):
    """A rootbench VM with a scenario's fault injected; every exec is an agent command."""

    def __init__(self, run: EpisodeRun) -> None:
        super().__init__()
        self.run = run
        # Inspect probes a new sandbox for root with a command of its own; through the agent's
        # channel that probe would be an agent command, in the cassette and the turn budget.
        # The answer is known (the agent's shell is root), and Inspect adopts a recorded one.
        self._root_access = RootAccess("usable", "rootbench: the agent's shell is root")

    @classmethod
    async def sample_init(cls, task_name: str, config: Any,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        spec = metadata.get("rootbench_spec")
        if not spec:
            raise ValueError("a rootbench sample needs metadata rootbench_spec (a spec file)")
        scenario = load_spec(spec)
        hints = min(int(metadata.get("rootbench_hints", 0)), len(scenario.hints))
        opts = RunOptions(accel=str(metadata.get("rootbench_accel", "auto")), protocol="tools",
                          hints=hints)
        runs = Path(str(metadata.get("rootbench_runs_dir", "runs")))
        run = EpisodeRun(scenario, opts, new_run_dir(runs, f"inspect-{scenario.id}"), hints,
                         InspectBridge("inspect", {"task": task_name}), {"task": task_name})
        run.start()
        return {"default": cls(run)}

    async def exec(self, cmd: list[str], input: str | bytes | None = None,
                   cwd: str | None = None, env: dict[str, str] | None = None,
                   user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        command = _shell(cmd, input, cwd, env)
        if user not in (None, "root"):
            command = f"runuser -u {shlex.quote(user)} -- bash -c {shlex.quote(command)}"
        try:
            code, output = await anyio.to_thread.run_sync(
                self.run.bridge.submit_run, command, timeout or None, abandon_on_cancel=True)
        except (EpisodeOver, AgentInputError) as exc:  # the solver is told, and goes on
            return ExecResult(False, 1, "", str(exc))
        if code is None:
            raise TimeoutError(f"the command timed out: {output[-200:]}")
        return ExecResult(code == 0, code, output, "")

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write ``contents`` to ``file`` through the agent's shell (see :func:`_write_command`:
        at most :data:`~runner.core.agent_input.MAX_WRITE_FILE_BYTES` bytes)."""
        result = await self.exec(["bash", "-c", _write_command(file, contents)])
        if not result.success:
            raise PermissionError(f"cannot write {file}: {result.stdout or result.stderr}")

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        result = await self.exec(["bash", "-c", f"base64 -w0 {shlex.quote(file)}"])
        if not result.success:
            raise FileNotFoundError(f"cannot read {file}: {result.stdout or result.stderr}")
        # The agent's channel caps output and may add a note after it: the data is the first line.
        if "\n[output truncated" in result.stdout:
            raise RuntimeError(f"{file} is larger than the scenario's output limit")
        try:
            data = base64.b64decode(result.stdout.split("\n", 1)[0].strip(), validate=True)
        except ValueError:
            raise RuntimeError(f"{file}: the shell did not return it whole") from None
        return data.decode("utf-8", "replace") if text else data

    async def judge(self) -> None:
        """End the episode (if the solver has not) and wait for the verdict."""
        self.run.bridge.abandon("the Inspect solver ended")
        await anyio.to_thread.run_sync(self.run.done.wait, JUDGE_WAIT, abandon_on_cancel=True)

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: Any,
                             environments: dict[str, SandboxEnvironment],
                             interrupted: bool) -> None:
        for env in environments.values():
            if isinstance(env, RootbenchSandbox):
                await env.judge()  # judged (if the scorer did not) and the VM torn down


@scorer(metrics={"verdict": [accuracy(), stderr()], "score": [mean()]})
def verdict() -> Any:
    """rootbench's verdict: ``C`` for pass, ``I`` otherwise, with the graded score beside it."""

    async def score(state: TaskState, target: Target) -> Score:
        box = sandbox().as_type(RootbenchSandbox)
        await box.judge()
        ep = box.run.episode
        if ep is None:
            return Score(value={"verdict": INCORRECT, "score": 0.0},
                         explanation="the episode ended without a verdict")
        return Score(value={"verdict": CORRECT if ep.verdict.value == "pass" else INCORRECT,
                            "score": ep.score or 0.0},
                     answer=ep.verdict.value, explanation=ep.reason,
                     metadata={"verdict": ep.verdict.value, "score": ep.score,
                               "milestones": ep.milestones, "flags": [f.value for f in ep.flags],
                               "stop": ep.stop.value, "commands": ep.commands,
                               "cassette": str(box.run.cassette)})

    return score


# Inspect names an extension's task "<top-level package>/<name>" when the package is installed,
# and plain "<name>" when it cannot tell (an editable install under another distribution name, as
# rootbench's is: the package is `runner`). Named so it is `runner/rootbench` either way, which is
# also the entry point's name, so `inspect eval runner/rootbench` finds it.
TASK = "rootbench" if get_installed_package_name(sys.modules[__name__]) else "runner/rootbench"


def _whole_number(value: object, name: str, least: int) -> int:
    """A ``-T`` value that must be a whole number: Inspect hands over whatever YAML made of the
    text (``-T hints=abc`` is the string "abc"), so a wrong one is one line naming it, not a
    TypeError from deep inside."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"-T {name}: a whole number from {least} up, not {value!r}")
    return value


@task(name=TASK)
def rootbench(scenarios: str | None = None, specs: str | None = None, hints: int = 0,
              epochs: int = 1, accel: str = "auto", runs_dir: str = "runs") -> Task:
    """rootbench's scenarios as an Inspect task.

    ``scenarios``: comma-separated scenario ids or globs (default: all); ``specs``: a
    spec folder (default: ``$ROOTBENCH_SPECS``, else the bundled scenarios); ``hints``: the first K
    hints appended to each task; ``epochs``: runs per scenario.
    """
    hints = _whole_number(hints, "hints", 0)
    epochs = _whole_number(epochs, "epochs", 1)
    folders = [Path(specs)] if specs else default_spec_dirs()
    found = load_specs(folders)
    if scenarios:
        try:
            found = pick_ids(found, [s.strip() for s in scenarios.split(",") if s.strip()])
        except InvalidInput as exc:
            raise ValueError(f"-T scenarios: {exc.detail}") from None
    samples = [Sample(id=s.id, input=task_text(s, min(hints, len(s.hints))),
                      metadata={"rootbench_spec": str(s.path), "rootbench_hints": hints,
                                "rootbench_accel": accel, "rootbench_runs_dir": runs_dir,
                                "title": s.title},
                      sandbox=NAME)
               for s in found]
    return Task(dataset=samples,
                solver=[system_message(BASE_PROMPT),
                        use_tools(bash(timeout=60)), generate()],
                scorer=verdict(), epochs=epochs, sandbox=NAME,
                metadata={"harness": "rootbench", "specs": [str(f) for f in folders]})
