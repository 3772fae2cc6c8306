"""How a model acts: native tool calls, schema-constrained JSON, or a fenced bash block.

Small local models rarely fill OpenAI ``tool_calls`` (measured: neither
Qwen2.5-Coder model does through llama-server's ``--jinja``), so a harness that only speaks tool calls measures the
chat template, not sysadmin skill. Each protocol here owns its system
prompt, the request fields it adds, the parser of replies and the shape of
the observation sent back. Parsers never raise: every reply becomes
commands, a finish, or a :class:`Violation` the model is told about.
"""

from __future__ import annotations

import abc
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from runner.core.guest import CommandResult
from runner.core.model import ChatRequest, Model
from runner.core.registry import Registry


@dataclass(frozen=True)
class RunCommand:
    command: str
    timeout: float | None = None
    call_id: str | None = None


@dataclass(frozen=True)
class Finish:
    summary: str
    call_id: str | None = None


@dataclass(frozen=True)
class Violation:
    reason: str  # one short line, shown to the model
    call_id: str | None = None


Action = RunCommand | Finish | Violation


@dataclass(frozen=True)
class BudgetLeft:
    turns: int
    seconds: float


# The one default system prompt; a scenario's `system_prompt` replaces this part.
BASE_PROMPT = (
    "You are an experienced Linux system administrator with a root shell on a Debian 12 "
    "server. Find the cause of the user's problem and fix it properly, keeping everything "
    "else working. Commands run non-interactively with a timeout: never start editors, "
    "pagers or anything that waits for input (use sed, tee, cat <<'EOF', and `--no-pager`). "
    "The server has no internet access, so nothing new can be installed. Do not guess which "
    "software it runs: look (`systemctl --failed`, `ss -ltnp`, the service's status and logs). "
    "You act only by running commands: investigate first, fix the cause, check that the fix "
    "works, and only then finish."
)


def _budget_line(left: BudgetLeft) -> str:
    return f"You have {left.turns} turns and {int(left.seconds)} seconds left."


def _result_text(result: CommandResult, output: str) -> str:
    if result.timed_out:
        head = "the command timed out and was killed"
    else:
        head = f"exit code {result.exit_code}"
    return f"{head}\n{output}" if output else f"{head}\n(no output)"


class Protocol(abc.ABC):
    name: ClassVar[str]
    instructions: ClassVar[str]

    def system_prompt(self, task_prompt: str | None, budget: BudgetLeft) -> str:
        return f"{task_prompt or BASE_PROMPT}\n\n{self.instructions}\n\n{_budget_line(budget)}"

    @abc.abstractmethod
    def decorate(self, request: ChatRequest) -> ChatRequest:
        """Add what this protocol needs to the request (tools, response_format)."""

    @abc.abstractmethod
    def parse(self, message: dict[str, Any]) -> list[Action]:
        """The reply as actions; never raises, never empty."""

    def observation(self, action: RunCommand, result: CommandResult, output: str,
                    left: BudgetLeft) -> dict[str, Any]:
        return {"role": "user", "content": f"{_result_text(result, output)}\n[{_budget_line(left)}]"}

    def correction(self, violation: Violation, left: BudgetLeft) -> dict[str, Any]:
        return {"role": "user",
                "content": f"Error: {violation.reason} {self.reminder} [{_budget_line(left)}]"}

    reminder: ClassVar[str] = ""


# --- shared parsing helpers -------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)


def _content(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _json_objects(text: str, limit: int = 20) -> list[Any]:
    """Every JSON value that starts at a ``{`` in ``text`` (tolerates fences and prose)."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    i = text.find("{")
    while i != -1 and len(found) < limit:
        try:
            value, end = decoder.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError):
            i = text.find("{", i + 1)
            continue
        found.append(value)
        i = text.find("{", end)
    return found


def _timeout(value: Any) -> float | None:
    """A model's timeout in seconds, or None (the scenario's own) for one that is not a finite
    positive number: JSON's ``1e400`` is infinity, which no cassette event can hold."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return seconds if 0 < seconds < math.inf else None


# --- native tool calls ------------------------------------------------------------------------

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "run_command",
        "description": "Run a shell command as root on the server and see its exit code and output.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The shell command."},
            "timeout": {"type": "number", "description": "Seconds before it is killed."}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "finish",
        "description": "Call when the problem is fixed (or you give up), with a short summary.",
        "parameters": {"type": "object", "properties": {
            "summary": {"type": "string", "description": "What was wrong and what you did."}},
            "required": ["summary"]}}},
]

_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _call_to_action(name: Any, arguments: Any, call_id: str | None) -> Action:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return Violation(f"the arguments of {str(name)[:40]!r} are not valid JSON", call_id)
    if not isinstance(arguments, dict):
        return Violation(f"the arguments of {str(name)[:40]!r} must be a JSON object", call_id)
    if name == "run_command":
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return Violation("run_command needs a non-empty 'command' string", call_id)
        return RunCommand(command, _timeout(arguments.get("timeout")), call_id)
    if name == "finish":
        summary = arguments.get("summary")
        return Finish(summary if isinstance(summary, str) else "", call_id)
    return Violation(f"unknown tool {str(name)[:40]!r}; the tools are run_command and finish",
                     call_id)


class ToolsProtocol(Protocol):
    name = "tools"
    instructions = ("Act only through the tools: call run_command to run one shell command, "
                    "and call finish with a short summary when the problem is fixed.")
    reminder = "Call the run_command or finish tool."

    def decorate(self, request: ChatRequest) -> ChatRequest:
        return replace(request, tools=TOOLS)

    def parse(self, message: dict[str, Any]) -> list[Action]:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        actions: list[Action] = []
        if isinstance(calls, list) and calls:
            for call in calls[:8]:
                fn = call.get("function") if isinstance(call, dict) else None
                call_id = call.get("id") if isinstance(call, dict) else None
                call_id = call_id if isinstance(call_id, str) else None
                if not isinstance(fn, dict):
                    actions.append(Violation("a tool call without a function", call_id))
                    continue
                actions.append(_call_to_action(fn.get("name"), fn.get("arguments"), call_id))
            return actions
        return self._from_content(_content(message))

    def _from_content(self, text: str) -> list[Action]:
        """Calls small models write into the text: ``<tool_call>{...}</tool_call>`` or bare JSON."""
        candidates = [m.group(1) for m in _TOOL_CALL_TAG.finditer(text)] or [text]
        for chunk in candidates:
            for obj in _json_objects(chunk):
                if isinstance(obj, dict) and "name" in obj:
                    args = obj.get("arguments", obj.get("parameters", {}))
                    return [_call_to_action(obj.get("name"), args, None)]
        if not text.strip():
            return [Violation("the reply was empty")]
        return [Violation("no tool call in the reply")]

    def observation(self, action: RunCommand, result: CommandResult, output: str,
                    left: BudgetLeft) -> dict[str, Any]:
        msg = super().observation(action, result, output, left)
        if action.call_id:
            return {"role": "tool", "tool_call_id": action.call_id, "content": msg["content"]}
        return msg

    def correction(self, violation: Violation, left: BudgetLeft) -> dict[str, Any]:
        msg = super().correction(violation, left)
        if violation.call_id:
            return {"role": "tool", "tool_call_id": violation.call_id, "content": msg["content"]}
        return msg


# --- schema-constrained JSON actions ----------------------------------------------------------

ACTION_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "object", "properties": {"thought": {"type": "string", "maxLength": 400},
                                          "command": {"type": "string", "minLength": 1}},
         "required": ["thought", "command"], "additionalProperties": False},
        {"type": "object", "properties": {"thought": {"type": "string", "maxLength": 400},
                                          "finish": {"type": "string", "maxLength": 400}},
         "required": ["thought", "finish"], "additionalProperties": False},
    ]
}


class JsonProtocol(Protocol):
    name = "json"
    instructions = (
        'Reply with exactly one JSON object and nothing else. To run one shell command: '
        '{"thought": "why", "command": "the command"}. When the problem is fixed: '
        '{"thought": "why", "finish": "what was wrong and what you did"}.')
    reminder = 'Reply with one JSON object: {"thought": ..., "command": ...} or {"thought": ..., "finish": ...}.'

    def decorate(self, request: ChatRequest) -> ChatRequest:
        return replace(request, response_format={
            "type": "json_schema", "json_schema": {"name": "action", "schema": ACTION_SCHEMA}})

    def parse(self, message: dict[str, Any]) -> list[Action]:
        text = _content(message)
        if not text.strip():
            return [Violation("the reply was empty")]
        for obj in _json_objects(text):
            if not isinstance(obj, dict):
                continue
            command = obj.get("command")
            if isinstance(command, str) and command.strip():
                return [RunCommand(command)]
            if "finish" in obj:
                summary = obj.get("finish")
                return [Finish(summary if isinstance(summary, str) else json.dumps(summary))]
            if "command" in obj:
                return [Violation("'command' must be a non-empty string")]
        return [Violation("the reply is not a JSON action object")]


# --- one fenced bash block per reply ----------------------------------------------------------

_DONE = re.compile(r"^\s*(?:\*\*)?DONE(?:\*\*)?\b:?\s*(.*)$", re.M)
_SHELL_LANGS = {"", "bash", "sh", "shell", "console", "zsh"}


class TextProtocol(Protocol):
    name = "text"
    instructions = ("Each reply: one shell command in a single ```bash fenced block; you will see "
                    "its output. When the problem is fixed, reply with a line `DONE: <summary>` "
                    "and no code block.")
    reminder = "Reply with exactly one ```bash block, or a line starting with DONE:."

    def decorate(self, request: ChatRequest) -> ChatRequest:
        return request

    def parse(self, message: dict[str, Any]) -> list[Action]:
        text = _content(message)
        blocks = [body.strip() for lang, body in _FENCE.findall(text)
                  if lang.lower() in _SHELL_LANGS and body.strip()]
        if len(blocks) == 1:
            return [RunCommand(blocks[0])]
        if len(blocks) > 1:
            return [Violation(f"the reply has {len(blocks)} code blocks; send exactly one")]
        done = _DONE.search(text)
        if done:
            return [Finish(done.group(1).strip())]
        if not text.strip():
            return [Violation("the reply was empty")]
        return [Violation("no ```bash block and no DONE line in the reply")]


PROTOCOLS: Registry[type[Protocol]] = Registry(
    "protocol", "--protocol", {p.name: p for p in (ToolsProtocol, JsonProtocol, TextProtocol)},
    also=("auto",))
CHOICES = ("auto", *PROTOCOLS)


def get_protocol(name: str) -> Protocol:
    """A fresh protocol by its name (not ``auto``: :func:`choose_protocol` decides that)."""
    return PROTOCOLS.get_or_refuse(name)()


def choose_protocol(model: Model, requested: str = "auto") -> tuple[Protocol, str]:
    """The protocol to use with ``model`` and, for the cassette, why it was chosen."""
    if requested != "auto":
        return get_protocol(requested), f"--protocol {requested}"
    if model.accepts_response_format():
        return JsonProtocol(), "auto: the server honours response_format JSON schemas"
    if model.template_supports_tools() and model.makes_native_tool_calls():
        return ToolsProtocol(), "auto: the chat template supports tools and a probe call was native"
    return TextProtocol(), "auto: no response_format and no native tool calls; fenced bash text"
