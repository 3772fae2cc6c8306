"""Action protocols: each parser never raises and always yields an action."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.core.guest import CommandResult
from runner.core.model import ChatRequest
from runner.core.protocol import (
    BudgetLeft,
    Finish,
    JsonProtocol,
    Protocol,
    RunCommand,
    TextProtocol,
    ToolsProtocol,
    Violation,
    get_protocol,
)
from runner.core.spec import Scenario

ALL = [ToolsProtocol(), JsonProtocol(), TextProtocol()]


def _msg(content: object = None, tool_calls: object = None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        m["tool_calls"] = tool_calls
    return m


def _call(name: str, arguments: object, cid: str = "c1") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- tools ------------------------------------------------------------------------------------

def test_native_tool_call() -> None:
    acts = ToolsProtocol().parse(_msg(None, [_call("run_command", json.dumps({"command": "ls", "timeout": 5}))]))
    assert acts == [RunCommand("ls", 5.0, "c1")]


@pytest.mark.parametrize("arguments", [
    '{"command": "ls", "timeout": 1e400}', '{"command": "ls", "timeout": NaN}',
    '{"command": "ls", "timeout": -Infinity}', '{"command": "ls", "timeout": 1' + "0" * 400 + "}"])
def test_a_timeout_that_is_not_a_finite_number_is_the_scenarios_own(arguments: str) -> None:
    """JSON's 1e400 is infinity: it reached the decision event, which could not be written, and
    the episode was infra-error (issue #46)."""
    assert ToolsProtocol().parse(_msg(None, [_call("run_command", arguments)])) == [
        RunCommand("ls", None, "c1")]


@pytest.mark.parametrize("arguments,fragment", [
    ("{not json", "not valid JSON"),
    ('"a string"', "must be a JSON object"),
    ("{}", "needs a non-empty 'command'"),
])
def test_bad_native_arguments_are_violations(arguments: str, fragment: str) -> None:
    [act] = ToolsProtocol().parse(_msg(None, [_call("run_command", arguments)]))
    assert isinstance(act, Violation) and fragment in act.reason and act.call_id == "c1"


def test_unknown_tool_is_a_violation() -> None:
    [act] = ToolsProtocol().parse(_msg(None, [_call("delete_everything", "{}")]))
    assert isinstance(act, Violation) and "unknown tool" in act.reason


@pytest.mark.parametrize("content", [
    '<tool_call>{"name": "run_command", "arguments": {"command": "ss -ltnp"}}</tool_call>',
    'Sure! {"name": "run_command", "arguments": {"command": "ss -ltnp"}} done',
    '```json\n{"name": "run_command", "arguments": {"command": "ss -ltnp"}}\n```',
])
def test_calls_written_into_content(content: str) -> None:
    assert ToolsProtocol().parse(_msg(content)) == [RunCommand("ss -ltnp")]


def test_finish_in_content_and_no_call() -> None:
    assert ToolsProtocol().parse(_msg('{"name": "finish", "arguments": {"summary": "ok"}}')) == [Finish("ok")]
    [act] = ToolsProtocol().parse(_msg("I think nginx is broken."))
    assert isinstance(act, Violation)
    [act] = ToolsProtocol().parse(_msg(""))
    assert isinstance(act, Violation) and "empty" in act.reason


def test_tool_observation_answers_the_call() -> None:
    p = ToolsProtocol()
    obs = p.observation(RunCommand("ls", None, "c9"), CommandResult(0, "a\n", 0.1), "a\n",
                        BudgetLeft(3, 100))
    assert obs["role"] == "tool" and obs["tool_call_id"] == "c9"
    assert "exit code 0" in obs["content"] and "3 turns" in obs["content"]
    obs = p.observation(RunCommand("sleep 9"), CommandResult(None, "", 5, timed_out=True), "",
                        BudgetLeft(1, 10))
    assert obs["role"] == "user" and "timed out" in obs["content"]


# --- json -------------------------------------------------------------------------------------

@pytest.mark.parametrize("content,expected", [
    ('{"thought": "look", "command": "systemctl status nginx"}', RunCommand("systemctl status nginx")),
    ('```json\n{"thought": "x", "command": "ls"}\n```\nextra', RunCommand("ls")),
    ('{"thought": "fixed", "finish": "killed the rogue server"}', Finish("killed the rogue server")),
])
def test_json_actions(content: str, expected: object) -> None:
    assert JsonProtocol().parse(_msg(content)) == [expected]


def test_json_request_is_schema_constrained() -> None:
    req = JsonProtocol().decorate(ChatRequest(messages=[{"role": "user", "content": "hi"}]))
    assert req.tools is None
    assert req.response_format and req.response_format["type"] == "json_schema"
    assert "oneOf" in req.response_format["json_schema"]["schema"]


@pytest.mark.parametrize("content", ["no json here", '{"thought": "hmm"}', '{"command": ""}', "[1,2]"])
def test_json_violations(content: str) -> None:
    [act] = JsonProtocol().parse(_msg(content))
    assert isinstance(act, Violation)


# --- text -------------------------------------------------------------------------------------

def test_text_protocol() -> None:
    p = TextProtocol()
    assert p.parse(_msg("Let me look.\n```bash\nss -ltnp\n```")) == [RunCommand("ss -ltnp")]
    assert p.parse(_msg("DONE: killed the rogue server")) == [Finish("killed the rogue server")]
    [act] = p.parse(_msg("```bash\nls\n```\n```bash\npwd\n```"))
    assert isinstance(act, Violation) and "2 code blocks" in act.reason
    [act] = p.parse(_msg("just words"))
    assert isinstance(act, Violation)
    assert p.decorate(ChatRequest(messages=[])).tools is None


# --- properties ---------------------------------------------------------------------------------

_json_like = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                          max_leaves=10)
_messages = st.one_of(
    st.builds(_msg, st.text(max_size=300)),
    st.builds(_msg, st.none(), st.lists(st.builds(_call, st.text(max_size=12), st.text(max_size=40)), max_size=3)),
    st.builds(_msg, _json_like, _json_like),
    _json_like,
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(ALL), _messages)
def test_parsers_never_raise_and_always_act(protocol: Protocol, message: Any) -> None:
    actions = protocol.parse(message)
    assert actions and all(isinstance(a, RunCommand | Finish | Violation) for a in actions)
    for a in actions:
        if isinstance(a, RunCommand):
            assert a.command.strip()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60).filter(lambda s: s.strip() and "```" not in s))
def test_text_roundtrip(command: str) -> None:
    [act] = TextProtocol().parse(_msg(f"```bash\n{command}\n```"))
    assert act == RunCommand(command.strip())


# --- system prompts -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tools", "json", "text"])
def test_system_prompt_renders_for_a_scenario(name: str) -> None:
    s = Scenario(id="x", title="x", image="debian-12-nginx", task="site down")
    prompt = get_protocol(name).system_prompt(s.system_prompt, BudgetLeft(s.budget.turns, s.budget.seconds))
    assert "root shell" in prompt and "10 turns" in prompt and "600 seconds" in prompt
    assert len(prompt) < 1500
    custom = get_protocol(name).system_prompt("You are a cat.", BudgetLeft(2, 5))
    assert custom.startswith("You are a cat.") and "2 turns" in custom
