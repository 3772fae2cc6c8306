"""The executors without a VM: real child processes, real exits, real deadlines; bad scale flags.

Jobs here are standard-library functions (a child process imports them by
name), so every case runs the real ``python -m runner.app.executors`` child.
``--executor ray`` against a Ray head that never answers is a real listener on
loopback that accepts and says nothing, and a real ``rootbench`` process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Cli, cli_argv, run_cli_process

from runner.app.agents import AgentChoice
from runner.app.executors import (
    Executor,
    InProcess,
    ProcessPool,
    WorkerLost,
    auto_jobs,
    host_cores,
)
from runner.app.plan import matrix
from runner.core.outcomes import AgentKind
from runner.core.paths import repo_root

ORACLE = repo_root() / "recordings" / "oracle"


def _all(pool: Executor, deadline: float = 60) -> dict[object, object]:
    """Every job's value (or error) by key, waiting at most ``deadline`` seconds."""
    out: dict[object, object] = {}
    end = time.monotonic() + deadline
    while pool.busy and time.monotonic() < end:
        done = pool.next_done(1.0)
        if done is not None:
            out[done.key] = done.error if done.error is not None else done.value
    assert not pool.busy, "jobs still running at the deadline"
    return out


def test_a_pool_runs_each_job_in_a_child_of_its_own_at_most_slots_at_once() -> None:
    with ProcessPool(2) as pool:
        for i in range(3):
            pool.submit(i, os.getpid, (), timeout=60)
        assert pool.busy == 3 and not pool.free()
        pids = _all(pool)
    assert len(set(pids.values())) == 3 and os.getpid() not in pids.values()


def test_a_job_that_raises_comes_back_as_its_exception() -> None:
    with ProcessPool(2) as pool:
        pool.submit("bad", int, ("not a number",), timeout=60)
        pool.submit("good", int, ("42",), timeout=60)
        out = _all(pool)
    assert out["good"] == 42
    assert isinstance(out["bad"], ValueError) and "not a number" in str(out["bad"])


def test_a_worker_that_dies_or_overruns_is_lost_not_a_crash() -> None:
    with ProcessPool(2) as pool:
        pool.submit("dies", os.abort, (), timeout=60)  # SIGABRT: no result ever written
        pool.submit("hangs", time.sleep, (600,), timeout=1)
        out = _all(pool, deadline=120)
    assert isinstance(out["dies"], WorkerLost) and "signal 6" in str(out["dies"])
    assert isinstance(out["hangs"], WorkerLost) and "did not end within 1s" in str(out["hangs"])


def test_in_process_runs_the_job_in_the_driver() -> None:
    pool = InProcess()
    pool.submit("me", os.getpid, (), timeout=60)
    assert _all(pool) == {"me": os.getpid()}


def test_auto_jobs_says_what_limited_it() -> None:
    jobs, why = auto_jobs()
    assert 1 <= jobs <= host_cores() and why.startswith(f"{jobs} (") and "limited by" in why
    assert auto_jobs(server_slots=1) == (1, auto_jobs(server_slots=1)[1])
    assert "limited by" in auto_jobs(reserve_mib=1 << 30)[1]  # no memory left: still one
    assert auto_jobs(reserve_mib=1 << 30)[0] == 1


def test_matrix_labels_arms_only_when_there_are_several() -> None:
    a, b = AgentChoice(model="qwen2.5-coder-0.5b"), AgentChoice(model="qwen2.5-coder-1.5b")
    [one] = matrix([a], ["json"], [0])
    assert one.label is None and one.protocol == "json"
    arms = matrix([a, b], ["json", "text", "json"], [0])
    assert [x.label for x in arms] == ["qwen2.5-coder-0.5b-json", "qwen2.5-coder-0.5b-text",
                                       "qwen2.5-coder-1.5b-json", "qwen2.5-coder-1.5b-text"]
    assert [x.label for x in matrix([AgentChoice(kind=AgentKind.ORACLE)], ["json"], [0, 2])] == [
        "oracle-json-h0", "oracle-json-h2"]


@pytest.mark.parametrize(("argv", "flag"), [
    (["--jobs", "0"], "--jobs"), (["--jobs", "abc"], "--jobs"), (["--jobs", "65"], "--jobs"),
    (["--executor", "ray"], "--ray-address"),
    (["--executor", "ray", "--ray-address", "127.0.0.1:1"], "--ray-address"),
    (["--executor", "ray", "--ray-address", "ray://x:1"], "--ray-address"),
    (["--ray-address", "127.0.0.1:1"], "--ray-address"),
    (["--ray-timeout", "5"], "--ray-timeout"),
    (["--executor", "ray", "--ray-address", "127.0.0.1:1", "--ray-timeout", "nan"], "--ray-timeout"),
    (["--executor", "ray", "--ray-address", "127.0.0.1:1", "--ray-timeout", "0"], "--ray-timeout"),
])
def test_bad_scale_flags_are_one_line_exit_2_before_any_vm(cli: Cli, tmp_path: Path,
                                                           argv: list[str], flag: str) -> None:
    env = {"TMPDIR": str(tmp_path)}
    r = cli("bench", "--agent", "oracle", "--only", "rogue-port-80", "--runs-dir",
            str(tmp_path / "runs"), *argv, env=env)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("rootbench: ") and flag in line and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("rb-*"))


def test_verify_refuses_a_bad_jobs_value(cli: Cli) -> None:
    r = cli("verify", "--jobs", "none", "specs/rogue-port-80.yaml")
    assert r.returncode == 2 and "--jobs" in r.stderr and "Traceback" not in r.stderr


def test_executor_ray_without_ray_installed_is_one_line(cli: Cli, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # ray blocked from import for this call: what a plain `pip install rootbench` has
    monkeypatch.setitem(sys.modules, "ray", None)
    r = cli("bench", "--agent", "oracle", "--executor", "ray", "--ray-address", "127.0.0.1:1",
            "--runs-dir", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("rootbench: --executor: Ray is not installed: "
                                "pip install 'rootbench[ray]'")


def test_jobs_auto_says_what_it_chose_and_replays_in_the_driver(cli: Cli, tmp_path: Path) -> None:
    r = cli("bench", "--agent", "oracle", "--jobs", "auto", "--only", "rogue-port-80",
            "permission-403", "--record-to", str(ORACLE), "--record-mode", "once",
            "--runs-dir", str(tmp_path), "--format", "json")
    assert r.returncode == 0, r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if "--jobs auto: " in ln]
    assert "cores" in line and "limited by" in line
    doc = json.loads(r.stdout)
    assert [(e["scenario"], e["verdict"]) for e in doc["episodes"]] == [
        ("rogue-port-80", "pass"), ("permission-403", "pass")]


def test_resume_of_a_matrix_needs_the_same_arms(tmp_path: Path) -> None:
    from runner.app.bench import run_bench
    from runner.app.episodes import RunOptions
    from runner.core.cassette import RecordMode
    from runner.core.errors import InvalidInput
    from runner.core.selection import pick_ids
    from runner.core.spec import load_specs

    [s] = pick_ids(load_specs([repo_root() / "specs"]), ["rogue-port-80"])
    # Without hints, so that the h1 arm runs at level 0 and replays the level-0 cassette: with the
    # hints rogue-port-80 has now, that arm found no cassette and ran a real VM in a unit test.
    s = dataclasses.replace(s, hints=())
    oracle = AgentChoice(kind=AgentKind.ORACLE)
    record = tmp_path / "rec"
    for arm in ("oracle-tools-h0", "oracle-tools-h1", "oracle-tools", "oracle-json"):
        # the committed oracle cassette (protocol tools) under each arm's folder: nothing runs live
        (record / arm).mkdir(parents=True)
        (record / arm / "rogue-port-80.jsonl").write_bytes((ORACLE / "rogue-port-80.jsonl").read_bytes())
    run = tmp_path / "run"
    arms = matrix([oracle], ["tools"], [0, 1])  # no hints: both arms at level 0
    eps = run_bench([s], oracle, RunOptions(), run, arms=arms, record_to=record,
                    record_mode=RecordMode.ONCE)
    assert [(e.arm, e.verdict.value) for e in eps] == [("oracle-tools-h0", "pass"),
                                                       ("oracle-tools-h1", "pass")]
    with pytest.raises(InvalidInput, match="resume it with the same"):
        run_bench([s], oracle, RunOptions(), run, resume=True)
    again = run_bench([s], oracle, RunOptions(), run, resume=True, arms=arms)
    assert [e.arm for e in again] == ["oracle-tools-h0", "oracle-tools-h1"]
    # a run.json whose arms lost their labels (edited by hand) is refused in words, not a TypeError
    info = json.loads((run / "run.json").read_text(encoding="utf-8"))
    info["arms"] = [{"protocol": "tools"}, {"label": 7}]
    (run / "run.json").write_text(json.dumps(info), encoding="utf-8")
    with pytest.raises(InvalidInput, match="a bench of None, 7; resume it with the same"):
        run_bench([s], oracle, RunOptions(), run, resume=True, arms=arms)
    # a recorded cassette of another protocol is refused, never passed off as this arm's
    with pytest.raises(InvalidInput, match="speaks protocol tools, this run asks for json"):
        run_bench([s], oracle, RunOptions(), tmp_path / "json",
                  arms=matrix([oracle], ["tools", "json"], [0]), record_to=record,
                  record_mode=RecordMode.ONCE)


# --- --executor ray against an address that never answers -------------------------------------

class SilentHead:
    """A TCP port on loopback that accepts every connection and never says a word: a Ray head
    that hangs (or something else entirely on its port). It counts the connections that
    opened with gRPC's HTTP/2 preface: Ray's own dials, not the pre-check's bare connect."""

    PREFACE = b"PRI * HTTP/2.0"

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))  # loopback only: a dial of any other address misses it
        self.sock.listen(64)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []  # held open, read, never answered
        self.grpc_dials = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed at the end of the test
                return
            self.accepted.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        first = b""
        try:
            while len(first) < len(self.PREFACE):
                chunk = conn.recv(64)
                if not chunk:
                    return
                first += chunk
        except OSError:
            return
        if first.startswith(self.PREFACE):
            with self._lock:
                self.grpc_dials += 1

    def wait_for_dial(self, timeout: float) -> bool:
        """Whether a gRPC client (Ray) dialled this port within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while not self.grpc_dials and time.monotonic() < end:
            time.sleep(0.1)
        return self.grpc_dials > 0

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@pytest.fixture
def silent_head() -> Iterator[SilentHead]:
    head = SilentHead()
    try:
        yield head
    finally:
        head.close()


def _ray_bench(address: str, runs: Path, *extra: str) -> list[str]:
    return ["bench", "--agent", "oracle", "--executor", "ray", "--ray-address", address,
            "--only", "rogue-port-80", "--runs-dir", str(runs), *extra]


def test_a_ray_head_that_never_answers_is_one_infra_line_at_the_deadline(
        silent_head: SilentHead, tmp_path: Path) -> None:
    """Joining has a deadline: Ray's own connect retries for about 13 minutes (20 tries of
    ~40 s each) and printed its warnings all the while; now one line, exit 1, no run directory.
    The line says which address Ray itself dialled: the one given (it used to be rewritten to
    this host's outside address, where this loopback-only listener is not)."""
    t0 = time.monotonic()
    # A process: a Ray driver that could not connect leaves its connect thread behind.
    r = run_cli_process(*_ray_bench(silent_head.address, tmp_path / "runs", "--ray-timeout", "8"),
                        env={"RAY_ADDRESS": None}, timeout=90)
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"rootbench: infrastructure error: the Ray cluster at "
                           f"{silent_head.address} did not answer within 8 s"), line
    # Ray's own warning, kept from the screen, names the address it dialled: the one given
    assert silent_head.address in line.partition("(Ray's last word: ")[2], line
    assert took < 40, took  # Ray's import and a driver's start, then the 8 s
    assert silent_head.grpc_dials >= 1  # Ray dialled the listener itself
    assert not (tmp_path / "runs").exists()  # no run directory for a bench that never began


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_joining_ray_ends_the_bench_at_once(
        silent_head: SilentHead, tmp_path: Path, signum: int, code: int) -> None:
    """SIGTERM or Ctrl-C while Ray dials a head that never answers ends rootbench within
    seconds, as interrupted (a SIGTERM went unheard while Ray's connect held the main thread)."""
    proc = subprocess.Popen(cli_argv(*_ray_bench(silent_head.address, tmp_path / "runs")),
                            cwd=repo_root(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True,
                            env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    try:
        assert silent_head.wait_for_dial(timeout=60), "Ray never dialled the address given"
        time.sleep(1.0)
        os.kill(proc.pid, signum)
        t0 = time.monotonic()
        _out, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1].startswith("rootbench: interrupted"), err
    assert not (tmp_path / "runs").exists()
