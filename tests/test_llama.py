"""The real model path: llama-server built from PyPI serving a real Qwen2.5-Coder GGUF."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.backends.llama import (
    LlamaServer,
    ensure_llama_server,
    fetch_model,
    join_parts,
    llama_fingerprint,
)
from runner.backends.openai import OpenAIModel
from runner.core.errors import InfraError
from runner.core.model import ChatRequest
from runner.core.protocol import BudgetLeft, Finish, JsonProtocol, RunCommand, choose_protocol

MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LlamaServer, Path, Path]]:
    binary = ensure_llama_server()
    gguf = fetch_model(MODEL)
    with LlamaServer(binary, gguf, tmp_path_factory.mktemp("llama") / "server.log") as s:
        yield s, binary, gguf


@pytest.mark.model
def test_server_health_props_and_fingerprint(server: tuple[LlamaServer, Path, Path]) -> None:
    s, binary, gguf = server
    assert s.alive()
    fp = llama_fingerprint(s, binary, gguf)
    assert fp["model_sha256"].startswith("1d9614638d18") and fp["total_slots"] == 1
    assert len(fp["server_sha256"]) == 64 and fp["chat_template_sha256"]


@pytest.mark.model
def test_json_actions_parse_and_the_prompt_cache_is_reused(server: tuple[LlamaServer, Path, Path]) -> None:
    s, _binary, _gguf = server
    model = OpenAIModel(s.endpoint, MODEL, max_tokens=120)
    protocol, why = choose_protocol(model)
    assert protocol.name == "json", why
    p = JsonProtocol()
    msgs = [{"role": "system", "content": p.system_prompt(None, BudgetLeft(10, 600))},
            {"role": "user", "content": "Users report the website on this server is down."}]
    first = model.complete(p.decorate(ChatRequest(messages=msgs)), 300)
    # The JSON-schema response_format constrains each reply to one action object: a command
    # to run or a finish, never something the protocol has to turn into a Violation.
    assert isinstance(json.loads(first.message["content"]), dict), first.message
    [action] = p.parse(first.message)
    assert isinstance(action, (RunCommand, Finish)), (action, first.message)
    msgs += [{"role": "assistant", "content": first.message["content"]},
             {"role": "user", "content": "exit code 3\nnginx.service: inactive (dead)"}]
    second = model.complete(p.decorate(ChatRequest(messages=msgs)), 300)
    [action] = p.parse(second.message)
    assert isinstance(action, (RunCommand, Finish)), (action, second.message)
    assert second.usage["cached_tokens"] > 0
    assert second.usage["prompt_evaluated"] < second.usage["prompt_tokens"]


@pytest.mark.model
def test_stop_leaves_no_process(server: tuple[LlamaServer, Path, Path], tmp_path: Path) -> None:
    _s, binary, gguf = server
    with LlamaServer(binary, gguf, tmp_path / "l.log", ctx_size=1024) as s2:
        proc = s2.proc
        assert proc is not None and s2.alive()
    assert proc.poll() is not None


def test_join_rejects_a_wrong_hash_and_keeps_nothing(tmp_path: Path) -> None:
    parts = []
    for i in range(3):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(bytes([i]) * 1000)
        parts.append(p)
    dest = tmp_path / "model.gguf"
    with pytest.raises(InfraError, match="expected 3000 bytes"):
        join_parts(parts, 3000, "0" * 64, dest)
    assert not dest.exists() and not list(tmp_path.glob("*.partial"))
    import hashlib

    good = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
    assert join_parts(parts, 3000, good, dest).read_bytes()[1000:1001] == b"\x01"
