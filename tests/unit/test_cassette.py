"""Cassettes: written as things happen, read back exactly, secrets never stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.core.cassette import _SECRET_KEYS, Cassette, CassetteWriter, find_cassettes
from runner.core.errors import InvalidInput, ReplayMismatch
from runner.core.model import ChatRequest
from runner.core.replay import ReplayModel

_keys = st.text(max_size=10).filter(lambda k: k.lower() not in _SECRET_KEYS)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(_keys, c, max_size=4),
    max_leaves=25)
# Model replies carry whatever the server sent (``raw``): any JSON must come back exactly.
_events = st.lists(st.dictionaries(_keys, _values, max_size=4).map(
    lambda d: {"type": "model", "turn": 1, "request": {"digest": "d"},
               "reply": {"message": {"role": "assistant", "content": ""}, "raw": d}}), max_size=10)

SCENARIO = {"id": "t", "title": "t", "image": "debian-12-nginx", "task": "fix it",
            "budget": {"turns": 10, "seconds": 600, "command_timeout": 30, "output_limit": 4000},
            "probes": [], "invariants": []}


def _header() -> dict[str, Any]:
    return {"type": "header", "format": 1, "scenario": SCENARIO,
            "model": {"kind": "oracle", "name": "oracle"}}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_events)
def test_round_trip(tmp_path: Path, events: list[dict[str, Any]]) -> None:
    path = tmp_path / "c.jsonl"
    with CassetteWriter(path) as w:
        w.write(_header())
        for e in events:
            w.write(e)
    back = Cassette.load(path)
    assert back.events == [_header(), *events]


def test_partial_cassette_is_a_readable_prefix(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    w = CassetteWriter(path)
    w.write(_header())
    w.write({"type": "guest", "op": "alive", "input": {}, "result": {"alive": True}})
    # the process "crashes" here: nothing closed, yet both events are on disk
    assert not path.exists()
    lines = w.partial.read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["header", "guest"]
    w.close()
    assert path.exists() and not w.partial.exists()
    assert Cassette.load(path).verdict is None


def test_secrets_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-very-secret-1234")
    path = tmp_path / "c.jsonl"
    with CassetteWriter(path) as w:
        w.write({**_header(), "headers": {"Authorization": "Bearer sk-test-very-secret-1234"}})
        w.write({"type": "model", "echo": "the key is sk-test-very-secret-1234"})
    text = path.read_text()
    assert "sk-test-very-secret-1234" not in text and "Bearer" not in text


@pytest.mark.parametrize("content", ["", "not json\n", '{"no": "type"}\n', '[1]\n'])
def test_bad_cassettes_are_invalid_input(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(InvalidInput) as info:
        Cassette.load(path)
    assert str(path) in str(info.value)


def test_find_cassettes_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such file"):
        find_cassettes([tmp_path / "missing"])
    with pytest.raises(InvalidInput, match="no cassettes"):
        find_cassettes([tmp_path])


def test_replay_mismatch_names_turn_and_message(tmp_path: Path) -> None:
    from runner.core.model import oracle
    from runner.core.recording import RecordingModel

    path = tmp_path / "c.jsonl"
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "fix it"}]
    with CassetteWriter(path) as w:
        w.write(_header())
        rec = RecordingModel(oracle(["ls"]), w)
        rec.complete(ChatRequest(messages=msgs), 5)
        rec.complete(ChatRequest(messages=[*msgs, {"role": "user", "content": "out"}]), 5)
    replay = ReplayModel(Cassette.load(path))
    replay.complete(ChatRequest(messages=msgs), 5)
    with pytest.raises(ReplayMismatch, match=r"turn 2: .*message 2 \(user\) differs"):
        replay.complete(ChatRequest(messages=[*msgs, {"role": "user", "content": "different"}]), 5)
    lenient = ReplayModel(Cassette.load(path), lenient=True)
    lenient.complete(ChatRequest(messages=msgs), 5)
    reply = lenient.complete(ChatRequest(messages=[*msgs, {"role": "user", "content": "different"}]), 5)
    assert reply.message["tool_calls"][0]["function"]["name"] == "finish"
    assert lenient.mismatches and "turn 2" in lenient.mismatches[0]


def _committed_events() -> list[dict[str, Any]]:
    from runner.core.paths import repo_root
    events: list[dict[str, Any]] = []
    for p in sorted(find_cassettes([repo_root() / "recordings"]))[:40]:
        events += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return events


_COMMITTED = _committed_events()


def _mutate(event: object, path: list[int], value: object, delete: bool) -> object:
    """``event`` with the value at the end of ``path`` (as far as it leads) replaced or deleted."""
    if not path or not isinstance(event, dict | list) or not event:
        return value
    if isinstance(event, dict):
        key = sorted(event)[path[0] % len(event)]
        out = dict(event)
        if delete and len(path) == 1:
            del out[key]
        else:
            out[key] = _mutate(event[key], path[1:], value, delete)
        return out
    i = path[0] % len(event)
    return [*event[:i], _mutate(event[i], path[1:], value, delete), *event[i + 1:]]


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 10**6), st.lists(st.integers(0, 50), min_size=1, max_size=4), _values, st.booleans())
def test_the_compiled_validator_agrees_with_jsonschema(pick: int, path: list[int], value: object,
                                                       delete: bool) -> None:
    """A committed event with one field changed or removed: both validators say the same.

    The compiled one (jsonschema-rs) decides on load; if it let through what the schema
    forbids, replay would be handed an event it cannot rebuild.
    """
    from runner.core.cassette import _fast_validator, _validator
    fast = _fast_validator()
    assert fast is not None, "jsonschema-rs is a dependency; it must be installed"
    event = _mutate(_COMMITTED[pick % len(_COMMITTED)], path, value, delete)
    assert fast.is_valid(event) == _validator().is_valid(event), event
