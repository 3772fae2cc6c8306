"""--executor ray against a real local Ray cluster on this machine, on real VMs.

The fixture starts a Ray head (``ray.init`` with a ``vm`` resource of 2, in
its own temp directory and its own process group) in a subprocess, hands its
address to the bench, and stops it at the end. Workers inherit the head's
TMPDIR, so their VMs' sockets and overlays live where the test can look.

Every cluster a test starts is bound to loopback (``--node-ip-address
127.0.0.1`` with Ray's loopback switch, :data:`KEEP_LOOPBACK`), and the tests
check with ``ss`` that none of its processes, nor the bench's driver, listens
on another address: by default Ray listens on every interface, so a test
cluster was a cluster anyone on the network could join or submit work to.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from conftest import Cli, cli_argv, quick_specs, run_cli_process

from runner.app.executors import CANCEL_GRACE
from runner.app.ray_executor import KEEP_LOOPBACK
from runner.core.paths import repo_root

pytestmark = pytest.mark.vm
PUBLISHED = ["rogue-port-80", "permission-403", "nginx-config-syntax"]
WHAT = "the Ray executor"  # the specs' copies opt out of the reboot re-check (conftest.quick_specs)
HEAD = """
import sys, ray
ctx = ray.init(num_cpus=1, resources={"vm": 2}, _node_ip_address="127.0.0.1",
               _temp_dir=sys.argv[1], include_dashboard=False, logging_level="WARNING")
print(ctx.address_info["gcs_address"], flush=True)
sys.stdin.read()  # until the test closes it
ray.shutdown()
"""


@dataclass
class Cluster:
    address: str
    tmp: Path  # the workers' TMPDIR
    session: int  # the session id of every process of the cluster (its head's pid)


def exposed(sessions: Collection[int], pids: Collection[int] = ()) -> list[str]:
    """The listening sockets (TCP and UDP, from ``ss``) of the processes in these sessions, or
    with these pids, that are bound to anything but loopback: each as ``ss`` shows it."""
    out = subprocess.run(["ss", "-Hltunp"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 7:
            continue
        owners = {int(p) for p in re.findall(r"pid=(\d+)", fields[6])}
        mine = set()
        for pid in owners:
            with contextlib.suppress(ProcessLookupError):
                if pid in pids or os.getsid(pid) in sessions:
                    mine.add(pid)
        if not mine:
            continue
        host = fields[4].rpartition(":")[0].strip("[]").split("%")[0]
        host = host.removeprefix("::ffff:")
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:  # "*": every address
            loopback = False
        if not loopback:
            found.append(line)
    return found


def _reap_cluster(head: subprocess.Popen[Any], log: IO[str], temp: Path) -> list[str]:
    """Wait for a stopping Ray head (killing its group if it hangs), then kill whatever of this
    cluster is left (only its processes name its temp dir) and remove that dir; the pids that
    were left, for the caller to assert there were none."""
    try:
        head.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=30)
    log.close()
    time.sleep(2)
    left = subprocess.run(["pgrep", "-f", str(temp)], capture_output=True, text=True,
                          timeout=10).stdout.split()
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    shutil.rmtree(temp, ignore_errors=True)
    return left


@pytest.fixture
def ray_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    # Ray's socket paths must fit in 107 bytes: a short folder of our own under /tmp.
    temp = Path(tempfile.mkdtemp(prefix="rbray-", dir="/tmp"))
    work = tmp_path / "worker-tmp"
    work.mkdir()
    # Token authentication (Ray's default for local clusters since 2.59), with a token made for
    # this cluster: the head and every bench the test starts share it through the environment.
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    log = (tmp_path / "head.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", HEAD, str(temp)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log, text=True, cwd=repo_root(),
                            env={**os.environ, **KEEP_LOOPBACK, "TMPDIR": str(work)},
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready, _, _ = select.select([proc.stdout], [], [], 300)
        assert ready, "the Ray head did not start within 300 s"
        address = proc.stdout.readline().strip()
        assert address, (tmp_path / "head.log").read_text()[-2000:]
        assert address.startswith("127.0.0.1:"), address
        assert not exposed({proc.pid}), "the test's Ray cluster listens beyond loopback"
        yield Cluster(address, work, proc.pid)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        left = _reap_cluster(proc, log, temp)
        assert not left, f"Ray processes outlived ray.shutdown(): {left}"


def test_ray_runs_the_published_scenarios_as_the_local_executor_does(
        cli: Cli, ray_cluster: Cluster, tmp_path: Path) -> None:
    specs = quick_specs(tmp_path / "specs", PUBLISHED, WHAT)
    bench = ("bench", str(specs), "--agent", "oracle", "--format", "json", "--only", *PUBLISHED)
    local = cli(*bench, "--runs-dir", str(tmp_path / "local"), timeout=1800)
    assert local.returncode == 0, local.stderr[-2000:]
    # A process: a Ray driver (ray.init) is connected to the cluster for as long as it lives.
    ray = run_cli_process(*bench, "--executor", "ray", "--ray-address", ray_cluster.address,
                          "--runs-dir", str(tmp_path / "ray"), timeout=1800)
    assert ray.returncode == 0, ray.stderr[-3000:]
    verdicts = [[(e["scenario"], e["verdict"], e["score"]) for e in json.loads(r.stdout)["episodes"]]
                for r in (local, ray)]
    assert verdicts[0] == verdicts[1] == [(s, "pass", 1.0) for s in PUBLISHED]
    assert "2 vm unit(s) on 1 node(s)" in ray.stderr
    [run_dir] = (tmp_path / "ray").iterdir()  # one run directory, written by the driver
    data = json.loads((run_dir / "results.json").read_text())
    assert data["run"]["jobs"] == 2
    for e in data["episodes"]:  # each cassette came back from its worker into the run directory
        assert Path(e["cassette"]).parent == run_dir / "cassettes" and Path(e["cassette"]).is_file()
    rep = cli("replay", "--offline", str(run_dir / "cassettes"), "--specs", str(specs), timeout=300)
    assert rep.returncode == 0 and "3/3 replayed verdicts equal" in rep.stdout, rep.stdout
    # the workers left no VM running and no socket directory behind
    assert not subprocess.run(["pgrep", "-f", str(ray_cluster.tmp)], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    assert not list(ray_cluster.tmp.glob("rb-*")) and not list(
        ray_cluster.tmp.glob("rootbench-vm-*"))
    assert not exposed({ray_cluster.session})  # its workers too listen on loopback only


def test_a_ray_worker_killed_mid_episode_is_infra_error_and_the_bench_goes_on(
        ray_cluster: Cluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    specs = quick_specs(tmp_path / "specs", ["rogue-port-80", "permission-403"], WHAT)
    # A process: a Ray driver, and the test kills a worker while the bench runs.
    proc = subprocess.Popen(cli_argv("bench", str(specs), "--agent", "oracle", "--executor", "ray",
                                     "--ray-address", ray_cluster.address, "--jobs", "1",
                                     "--runs-dir", str(runs), "--format", "json",
                                     "--only", "rogue-port-80", "permission-403"),
                            cwd=repo_root(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # The first episode's QEMU runs under its Ray worker: kill that worker (SIGKILL) mid-episode.
    victim = None
    deadline = time.monotonic() + 600
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        qemu = subprocess.run(["pgrep", "-f", f"qemu-system.*{ray_cluster.tmp}"],
                              capture_output=True, text=True, timeout=10).stdout.split()
        if qemu:
            victim = int(Path(f"/proc/{qemu[0]}/stat").read_text().split(")")[1].split()[1])
        else:
            time.sleep(0.2)
    assert victim is not None, "no episode started on the cluster"
    # mid-episode: the cluster, its workers and the bench's own Ray driver listen on loopback only
    assert not exposed({ray_cluster.session}, {proc.pid})
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 1, err[-2000:]  # a bench with an infra-error exits 1
    eps = json.loads(out)["episodes"]
    assert [(e["scenario"], e["verdict"]) for e in eps] == [
        ("rogue-port-80", "infra-error"), ("permission-403", "pass")]
    assert "Ray worker was lost" in eps[0]["reason"]
    time.sleep(2)  # the killed worker's QEMU dies with it (PR_SET_PDEATHSIG)
    assert not subprocess.run(["pgrep", "-f", f"qemu-system.*{ray_cluster.tmp}"],
                              capture_output=True, text=True, timeout=10).stdout.strip()


def _qemu_under(tmp: Path) -> list[str]:
    """The pids of the QEMUs whose command line names ``tmp`` (the cluster's workers' TMPDIR)."""
    return subprocess.run(["pgrep", "-f", f"qemu-system.*{tmp}"], capture_output=True, text=True,
                          timeout=10).stdout.split()


def test_sigterm_mid_episode_on_ray_ends_the_bench_and_tears_its_vm_down(
        ray_cluster: Cluster, tmp_path: Path) -> None:
    """SIGTERM to a Ray bench while an episode runs on the cluster: the bench cancels the task
    (whose ``with`` blocks stop its VM), keeps what finished and exits 143 within the
    cancel grace, as a local bench does."""
    proc = subprocess.Popen(cli_argv("bench", "--agent", "oracle", "--executor", "ray",
                                     "--ray-address", ray_cluster.address, "--jobs", "1",
                                     "--runs-dir", str(tmp_path / "runs"),
                                     "--only", "rogue-port-80"),
                            cwd=repo_root(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 600
    while not _qemu_under(ray_cluster.tmp) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert _qemu_under(ray_cluster.tmp), "no episode started on the cluster"
    os.kill(proc.pid, signal.SIGTERM)
    t0 = time.monotonic()
    _out, err = proc.communicate(timeout=CANCEL_GRACE + 60)
    assert time.monotonic() - t0 < CANCEL_GRACE + 30
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("rootbench: interrupted"), err[-2000:]
    end = time.monotonic() + 30
    while _qemu_under(ray_cluster.tmp) and time.monotonic() < end:
        time.sleep(0.5)
    assert not _qemu_under(ray_cluster.tmp), "the episode's VM outlived the interrupted bench"


@pytest.mark.model
def test_a_named_model_is_served_on_its_node_by_a_llama_server_bound_to_loopback(
        ray_cluster: Cluster, tmp_path: Path) -> None:
    # A process: a Ray driver (ray.init) is connected to the cluster for as long as it lives.
    specs = quick_specs(tmp_path / "specs", ["nginx-stopped"], WHAT)
    r = run_cli_process("bench", str(specs), "--executor", "ray", "--ray-address", ray_cluster.address,
                        "--model", "qwen2.5-coder-0.5b", "--protocol", "json", "--max-tokens",
                        "96", "--only", "nginx-stopped", "--runs-dir", str(tmp_path / "runs"),
                        "--format", "json", timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    [ep] = json.loads(r.stdout)["episodes"]
    assert ep["verdict"] in ("pass", "fail") and ep["turns"] >= 1 and ep["tokens_in"] > 0, ep
    header = json.loads(Path(ep["cassette"]).read_text().splitlines()[0])
    assert header["model"]["named_model"] == "qwen2.5-coder-0.5b"
    assert header["model"]["total_slots"] == 2  # the node's two vm units
    # The node's server listened on its loopback only, and is gone with the bench.
    [folder] = ray_cluster.tmp.glob("rootbench-llama-*")
    assert "127.0.0.1" in (folder / "llama-server.log").read_text()
    pid = int((folder / "llama-server.pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline")
    assert not cmdline.exists() or b"llama-server" not in cmdline.read_bytes()
    assert not exposed({ray_cluster.session})


def test_ray_address_auto_finds_the_cluster_ray_start_made(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``--ray-address auto`` resolves as Ray's own tools do: the cluster the last ``ray start``
    recorded in Ray's temp directory (RAY_TMPDIR here, so only this test's cluster is there).

    No VM runs: the bench is refused just after the address is accepted (``--record-mode
    none`` with no recordings), which is the first check that comes after it.
    """
    temp = Path(tempfile.mkdtemp(prefix="rbray-", dir="/tmp"))  # short: Ray's socket paths
    with socket.socket() as s:  # a free port for this head, not the default 6379
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    env = {**os.environ, "RAY_TMPDIR": str(temp)}
    log = (tmp_path / "head.log").open("w")
    # Bound to loopback, as docs/scaling.md starts a local cluster; the bench gets no switch.
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                             "--node-ip-address=127.0.0.1", f"--port={port}",
                             f"--temp-dir={temp / 'ray'}", "--num-cpus=1",
                             "--resources={\"vm\": 1}", "--include-dashboard=false",
                             "--disable-usage-stats"], stdout=log, stderr=log,
                            env={**env, **KEEP_LOOPBACK}, start_new_session=True)
    try:
        recorded = temp / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 300
        while not recorded.is_file() and time.monotonic() < deadline and head.poll() is None:
            time.sleep(0.5)
        assert recorded.is_file(), (tmp_path / "head.log").read_text()[-2000:]
        assert not exposed({head.pid}), "the test's Ray cluster listens beyond loopback"
        empty = tmp_path / "recordings"
        empty.mkdir()
        # A process: Ray resolves auto with its own modules, which keep state once imported.
        r = run_cli_process("bench", "--agent", "oracle", "--executor", "ray", "--ray-address",
                            "auto", "--only", "rogue-port-80", "--record-to", str(empty),
                            "--record-mode", "none", "--runs-dir", str(tmp_path / "runs"),
                            env=env, timeout=300)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 2, r.stderr
        found, refused = lines
        # the address the cluster recorded, as it is: not rewritten to this host's outside one
        assert found == f"[bench] --ray-address auto: 127.0.0.1:{port}", found
        assert refused.startswith("rootbench: --record-mode: --record-mode none needs a "), refused
        assert not (tmp_path / "runs").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops what it started
        left = _reap_cluster(head, log, temp)
        assert not left, f"Ray processes outlived the head: {left}"
