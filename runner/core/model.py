"""Model backends: where the agent's next message comes from.

Every backend answers a :class:`ChatRequest` with a :class:`ModelReply` whose
``message`` is an OpenAI-style assistant message. The oracle and noop agents
are backends too, so the loop, parsing and scoring are the same code for a
real model, a scripted fix, and a replayed cassette.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.core.outcomes import AgentKind


@dataclass(frozen=True)
class ChatRequest:
    """One chat-completion request, before backend-specific fields are added."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None
    tool_choice: str | None = None

    def payload(self) -> dict[str, Any]:
        """The protocol-relevant request fields (what a replay must match)."""
        body: dict[str, Any] = {"messages": self.messages}
        if self.tools is not None:
            body["tools"] = self.tools
        if self.response_format is not None:
            body["response_format"] = self.response_format
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        return body


@dataclass
class ModelReply:
    """The assistant message plus what it cost."""

    message: dict[str, Any]
    raw: dict[str, Any] = field(default_factory=dict)  # full response JSON, for the cassette
    usage: dict[str, Any] = field(default_factory=dict)  # prompt_tokens, completion_tokens, cached_tokens, prompt_ms, predicted_ms
    duration: float = 0.0
    attempts: list[dict[str, Any]] = field(default_factory=list)  # failed tries before this one


class Model(abc.ABC):
    """A source of assistant messages."""

    name: str = "model"
    agent: AgentKind = AgentKind.MODEL

    @abc.abstractmethod
    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        """Answer ``request`` within ``timeout`` seconds.

        Raises, and nothing else: :class:`~runner.core.errors.ModelServerError`
        when the server failed in a way retrying did not fix (its ``attempts``
        list the tries; ``out_of_time`` when the call used all its time);
        :class:`~runner.core.errors.ContextExhausted` when the conversation
        outgrew the model's context (the run is then judged as it stands); for a
        replayed model, :class:`~runner.core.errors.ReplayMismatch` when the run
        asks for a reply the cassette does not hold. Whatever the reply says,
        however malformed, is the protocol's to read, never an exception here."""

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this model's behaviour, for the cassette header."""
        return {"kind": self.agent.value, "name": self.name}

    # Capabilities: what the server can do, asked once (choose_protocol reads them).
    def template_supports_tools(self) -> bool | None:
        """Whether the server's chat template handles tools; None when unknown."""
        return None

    def accepts_response_format(self) -> bool | None:
        """Whether replies can be constrained by a JSON schema; None when unknown."""
        return None

    def makes_native_tool_calls(self) -> bool | None:
        """Whether a small request offering tools came back with a native ``tool_calls`` entry."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release whatever the backend holds."""

    def decided(self, decision: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """What the loop made of one action of this model's last reply (``turn``, ``action``
        and its details, see :class:`~runner.core.outcomes.Decided`), as it acts on it.

        Most models have no use for it. The recorder writes it to the cassette, so
        viewers read what the loop did instead of parsing the reply again; the
        replayer checks it against the recording.
        """


SPOKEN = ("tools", "json", "text")  # the protocols a scripted agent can answer in


def _tool_call(index: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


class ScriptedModel(Model):
    """Answers with fixed commands, one per turn, then ``finish``, in the protocol it speaks.

    The oracle agent (a scenario's ``solution``) and the noop agent (no
    commands at all) are both this, so ``verify`` exercises the real loop.
    ``speaks`` is the action protocol's name: ``tools`` (native tool calls,
    the default), ``json`` (a JSON action object) or ``text`` (a fenced bash
    block, then a ``DONE:`` line); so a bench over several protocols with the
    oracle exercises each protocol's parser, not only the tools one.
    """

    def __init__(self, agent: AgentKind, commands: list[str], summary: str,
                 speaks: str = "tools") -> None:
        if speaks not in SPOKEN:
            raise ValueError(f"a scripted agent speaks {', '.join(SPOKEN)}, not {speaks!r}")
        self.agent = agent
        self.speaks = speaks
        self.name = agent.value
        self._commands = list(commands)
        self._summary = summary
        self._turn = 0

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        turn = self._turn
        self._turn += 1
        command = self._commands[turn] if turn < len(self._commands) else None
        message: dict[str, Any]
        if self.speaks == "tools":
            call = (_tool_call(turn, "run_command", {"command": command}) if command is not None
                    else _tool_call(turn, "finish", {"summary": self._summary}))
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif self.speaks == "json":
            action = ({"thought": "the next step of the script", "command": command}
                      if command is not None else {"thought": "done", "finish": self._summary})
            message = {"role": "assistant", "content": json.dumps(action)}
        else:
            message = {"role": "assistant",
                       "content": f"```bash\n{command}\n```" if command is not None
                       else f"DONE: {self._summary}"}
        return ModelReply(message=message, raw={"choices": [{"message": message}]})

    def fingerprint(self) -> dict[str, Any]:
        # The commands' hash lets verify tell a recording of these very commands from one of
        # a shortcut since edited, when the spec changed elsewhere (runner.app.verify).
        return {"kind": self.agent.value, "name": self.name, "commands": len(self._commands),
                "commands_sha256": commands_digest(self._commands)}


def commands_digest(commands: Sequence[str]) -> str:
    """sha256 of a scripted agent's commands, in order (its fingerprint's ``commands_sha256``)."""
    return hashlib.sha256(json.dumps(list(commands), ensure_ascii=False).encode(
        "utf-8", "surrogatepass")).hexdigest()


def oracle(solution: list[str], speaks: str = "tools") -> ScriptedModel:
    """The reference fix as an agent."""
    return ScriptedModel(AgentKind.ORACLE, solution, "applied the reference solution", speaks)


def noop(speaks: str = "tools") -> ScriptedModel:
    """An agent that does nothing: a valid scenario must fail it."""
    return ScriptedModel(AgentKind.NOOP, [], "did nothing", speaks)


def scripted(shortcut: str, commands: list[str], speaks: str = "tools") -> ScriptedModel:
    """One of a scenario's shortcuts as an agent: a valid scenario must fail it.

    It says it is done as a model that believed its fix would (the summary
    names the shortcut, which the cassette keeps for the reader).
    """
    return ScriptedModel(AgentKind.SCRIPTED, commands, f"applied the shortcut {shortcut!r}", speaks)
