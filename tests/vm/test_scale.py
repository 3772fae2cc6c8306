"""Scale on one host, on real VMs: --jobs N episodes at once, Ctrl-C during them, a model x protocol matrix.

Each bench runs the real command (in this process; for Ctrl-C, as a process of its own) with a
private TMPDIR, where every VM's overlay and socket directory and every job's folder lives:
"nothing left behind" is that directory empty and no process naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import Cli, CliResult, cli_argv, first_finished_episode, quick_specs, run_cli

from runner.core.paths import repo_root

pytestmark = pytest.mark.vm
# Quick scenarios: none waits out a re-check pause, and their copies (quick_specs) opt out of the
# reboot re-check (tested in test_lasting.py; here it made the benches minutes longer).
FOUR = ["permission-403", "nginx-stopped", "site-config-renamed", "hosts-name-typo"]
WHAT = "scale on one host (--jobs, Ctrl-C, a matrix)"
SIX = [*FOUR, "rogue-port-80", "nginx-config-syntax"]  # every scenario a bench here runs


def _env(tmp: Path) -> dict[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    return {"TMPDIR": str(tmp)}


def _bench(tmp_path: Path, name: str, *args: str) -> tuple[CliResult, Path]:
    runs = tmp_path / name
    specs = quick_specs(tmp_path / "specs", SIX, WHAT)
    r = run_cli("bench", str(specs), "--agent", "oracle", "--runs-dir", str(runs), "--format", "json", *args,
                env=_env(tmp_path / f"{name}-tmp"), timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    [run_dir] = runs.iterdir()
    return r, run_dir


def _nothing_left(tmp: Path) -> None:
    assert not list(tmp.iterdir()), f"left behind: {sorted(p.name for p in tmp.iterdir())}"
    found = subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True, timeout=10)
    assert not found.stdout.strip(), f"processes still naming {tmp}: {found.stdout}"


def test_jobs_2_gives_the_verdicts_of_jobs_1_with_episodes_overlapping(tmp_path: Path) -> None:
    one, _ = _bench(tmp_path, "one", "--jobs", "1", "--only", *FOUR)
    two, run_dir = _bench(tmp_path, "two", "--jobs", "2", "--only", *FOUR)
    verdicts = [[(e["scenario"], e["verdict"], e["score"]) for e in json.loads(r.stdout)["episodes"]]
                for r in (one, two)]
    assert verdicts[0] == verdicts[1] == [(s, "pass", 1.0) for s in FOUR]
    eps = json.loads((run_dir / "results.json").read_text())["episodes"]
    spans = sorted((e["started"], e["ended"]) for e in eps)
    # Two episodes at once, really: some episode started before the one before it had ended.
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)), spans
    assert "2 episodes at once" in two.stderr
    assert sorted(p.name for p in (run_dir / "cassettes").iterdir()) == sorted(
        f"{s}.r0.jsonl" for s in FOUR)  # a bench of one arm keeps today's layout
    for name in ("one-tmp", "two-tmp"):
        _nothing_left(tmp_path / name)


def test_ctrl_c_during_a_jobs_2_bench_tears_down_and_keeps_the_finished(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    runs = tmp_path / "runs"
    # A process: Ctrl-C goes to its whole process group and its exit status is 130.
    specs = quick_specs(tmp_path / "specs", SIX, WHAT)
    proc = subprocess.Popen(cli_argv("bench", str(specs), "--agent", "oracle", "--jobs", "2", "--runs-dir",
                                     str(runs), "--format", "plain", "--only", *SIX),
                            cwd=repo_root(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **_env(tmp)}, start_new_session=True)
    results = first_finished_episode(runs, proc, time.monotonic() + 600)
    assert results is not None, "no episode finished"
    time.sleep(2)  # the next episodes' VMs are up now
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    _out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-1500:]
    assert "interrupted; everything torn down" in err
    eps = json.loads(results.read_text())["episodes"]
    assert eps and len(eps) < 6 and {e["verdict"] for e in eps} == {"pass"}
    for e in eps:  # each kept result has its whole cassette
        assert Path(e["cassette"]).is_file(), e["cassette"]
    _nothing_left(tmp)


def test_a_matrix_of_two_protocols_is_one_run_directory_whose_report_shows_both(
        cli: Cli, tmp_path: Path) -> None:
    ids = ["permission-403", "nginx-stopped"]
    r, run_dir = _bench(tmp_path, "matrix", "--protocol", "json", "--protocol", "text",
                        "--jobs", "2", "--only", *ids)
    eps = json.loads(r.stdout)["episodes"]
    assert [(e["arm"], e["protocol"], e["scenario"], e["verdict"]) for e in eps] == [
        (f"oracle-{p}", p, s, "pass") for p in ("json", "text") for s in ids]
    for p in ("json", "text"):
        assert sorted(x.name for x in (run_dir / "cassettes" / f"oracle-{p}").iterdir()) == sorted(
            f"{s}.r0.jsonl" for s in ids)
    # `report`: the table leads with model and protocol; the HTML has a run per arm
    table = cli("report", str(run_dir), "--format", "plain")
    assert table.returncode == 0, table.stderr
    rows = [ln.split()[:4] for ln in table.stdout.splitlines()[1:5]]
    assert rows == [["oracle", p, s, "pass"] for p in ("json", "text") for s in ids]
    page = (run_dir / "report.html").read_text()
    assert f"{run_dir.name} · oracle-json" in page and f"{run_dir.name} · oracle-text" in page
    # the cassettes replay offline, each in its own protocol
    rep = cli("replay", "--offline", str(run_dir / "cassettes"), "--specs", str(tmp_path / "specs"),
              timeout=300)
    assert rep.returncode == 0 and "4/4 replayed verdicts equal" in rep.stdout, rep.stdout
    # --resume of the matrix finds every arm's episodes done and runs nothing
    again = cli("bench", str(tmp_path / "specs"), "--agent", "oracle", "--protocol", "json", "--protocol", "text",
                "--only", *ids, "--resume", str(run_dir), env=_env(tmp_path / "resume-tmp"),
                timeout=300)
    assert again.returncode == 0 and "1/4" not in again.stderr, again.stderr[-1500:]
    _nothing_left(tmp_path / "matrix-tmp")
