"""The OpenAI backend against a real loopback server that misbehaves in every known way."""

from __future__ import annotations

import json
import time

import pytest
from badserver import bad_server

from runner.backends.openai import OpenAIModel
from runner.core.errors import ContextExhausted, ModelServerError
from runner.core.model import ChatRequest
from runner.core.protocol import ToolsProtocol, Violation

KEY = "sk-rootbench-test-secret-9876"
REQ = ChatRequest(messages=[{"role": "user", "content": "hi"}])


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def _model(endpoint: str, retries: int = 3) -> OpenAIModel:
    return OpenAIModel(endpoint, "test-model", retries=retries)


def _assert_no_key(*things: object) -> None:
    for t in things:
        assert KEY not in json.dumps(t, default=str)


def test_ok_reply_records_sampling_and_uses_the_key() -> None:
    with bad_server(["ok"]) as (url, state):
        m = _model(url)
        reply = m.complete(REQ, 10)
    assert reply.message["content"].startswith("{")
    assert reply.usage == {"prompt_tokens": 10, "completion_tokens": 3}
    sent = state.requests[0]
    assert sent["temperature"] == 0.0 and sent["seed"] == 0 and sent["max_tokens"] == 512
    assert state.headers[0]["Authorization"] == f"Bearer {KEY}"
    _assert_no_key(m.fingerprint(), reply.raw, reply.attempts)


@pytest.mark.parametrize("first", ["500", "429", "503", "reset"])
def test_transient_failures_are_retried(first: str) -> None:
    with bad_server([first, "ok"]) as (url, state):
        reply = _model(url).complete(REQ, 20)
    # The failed request reached the server and was counted, a reset one included; one retry.
    assert len(state.requests) == 2 and state.connections == 2
    assert len(reply.attempts) == 1
    assert reply.attempts[0].get("status") == (int(first) if first != "reset" else None)
    _assert_no_key(reply.attempts)


def test_persistent_500_ends_in_one_clear_line() -> None:
    with bad_server(["500"]) as (url, state):
        t0 = time.monotonic()
        with pytest.raises(ModelServerError) as info:
            _model(url, retries=2).complete(REQ, 20)
    assert time.monotonic() - t0 < 15
    assert len(state.requests) == 3
    assert "\n" not in str(info.value) and "HTTP 500" in str(info.value)
    assert len(info.value.attempts) == 3
    _assert_no_key(str(info.value), info.value.attempts)


@pytest.mark.parametrize("behaviour,fragment", [
    ("invalid-json", "not JSON"), ("no-choices", "no choices"), ("huge", "larger than 2 MB"),
])
def test_garbage_is_a_model_server_error(behaviour: str, fragment: str) -> None:
    with bad_server([behaviour]) as (url, _state):
        with pytest.raises(ModelServerError) as info:
            _model(url).complete(REQ, 20)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_stall_past_the_deadline_is_bounded() -> None:
    with bad_server(["stall"]) as (url, _state):
        t0 = time.monotonic()
        with pytest.raises(ModelServerError, match="failed"):
            _model(url).complete(REQ, 3)
        assert time.monotonic() - t0 < 6


@pytest.mark.parametrize("behaviour", ["bad-arguments", "unknown-tool", "empty"])
def test_bad_messages_go_back_to_the_model(behaviour: str) -> None:
    with bad_server([behaviour]) as (url, _state):
        reply = _model(url).complete(REQ, 10)
    [action] = ToolsProtocol().parse(reply.message)
    assert isinstance(action, Violation)


def test_context_overflow_is_the_agents_limit_not_a_server_fault() -> None:
    with bad_server(["context-full", "ok"]) as (url, state):
        with pytest.raises(ContextExhausted, match="outgrew the model's context") as info:
            _model(url).complete(REQ, 10)
    assert len(state.requests) == 1  # not retried: the same prompt would overflow again
    assert "\n" not in str(info.value)


