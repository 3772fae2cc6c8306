"""The application layer without a VM: benches served from recordings, results order, output hygiene."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import Cli, cli_argv

from runner.app.agents import AgentChoice
from runner.app.bench import run_bench
from runner.app.episodes import RunOptions
from runner.app.runs import new_run_dir, slug
from runner.core.cassette import CassetteWriter, RecordMode
from runner.core.outcomes import AgentKind, Verdict
from runner.core.paths import repo_root
from runner.core.selection import pick_ids
from runner.core.spec import Scenario, load_specs

ORACLE = repo_root() / "recordings" / "oracle"
IDS = ["rogue-port-80", "permission-403"]


def _scenarios() -> list[Scenario]:
    return pick_ids(load_specs([repo_root() / "specs"]), IDS)


def test_writer_keeps_partial_when_the_run_fails(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    with pytest.raises(RuntimeError), CassetteWriter(path) as writer:
        writer.write({"type": "header"})
        raise RuntimeError("the run broke")
    assert not path.exists(), "an unfinished run must not look like a complete cassette"
    assert (tmp_path / "c.jsonl.partial").read_text().startswith('{"type": "header"')
    with CassetteWriter(path) as writer:
        writer.write({"type": "header"})
    assert path.exists()


def test_record_mode_once_replays_what_it_has_and_needs_no_vm(tmp_path: Path) -> None:
    record_to = tmp_path / "rec"
    shutil.copytree(ORACLE, record_to)
    run_dir = tmp_path / "run"
    eps = run_bench(_scenarios(), AgentChoice(kind=AgentKind.ORACLE), RunOptions(), run_dir,
                    record_to=record_to, record_mode=RecordMode.ONCE)
    assert [(e.scenario, e.verdict) for e in eps] == [(i, Verdict.PASS) for i in IDS]
    results = json.loads((run_dir / "results.json").read_text())
    assert [e["verdict"] for e in results["episodes"]] == ["pass", "pass"]
    assert sorted(p.name for p in (run_dir / "cassettes").iterdir()) == sorted(
        f"{i}.r0.jsonl" for i in IDS)


def test_record_mode_none_refuses_before_running_anything(tmp_path: Path) -> None:
    from runner.core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="missing: rogue-port-80"):
        run_bench(_scenarios(), AgentChoice(kind=AgentKind.ORACLE), RunOptions(), tmp_path / "run",
                  record_to=tmp_path / "empty", record_mode=RecordMode.NONE)
    assert not (tmp_path / "run" / "cassettes").exists()


def test_resume_keeps_unknown_results_and_lists_them_last(tmp_path: Path) -> None:
    record_to = tmp_path / "rec"
    shutil.copytree(ORACLE, record_to)
    run_dir = tmp_path / "run"
    run_bench(_scenarios()[:1], AgentChoice(kind=AgentKind.ORACLE), RunOptions(), run_dir,
              record_to=record_to, record_mode=RecordMode.ONCE)
    data = json.loads((run_dir / "results.json").read_text())
    gone = dict(data["episodes"][0], scenario="aaa-no-longer-a-spec")
    data["episodes"].insert(0, gone)
    (run_dir / "results.json").write_text(json.dumps(data))
    eps = run_bench(_scenarios(), AgentChoice(kind=AgentKind.ORACLE), RunOptions(), run_dir,
                    resume=True, record_to=record_to, record_mode=RecordMode.ONCE)
    assert [e.scenario for e in eps] == [*IDS, "aaa-no-longer-a-spec"]


def test_run_folders_are_slugs_inside_runs_dir(tmp_path: Path) -> None:
    assert slug("x/../../y") == "x-y"
    assert slug("qwen2.5-coder-1.5b") == "qwen2.5-coder-1.5b"
    assert slug("../..") == "run"
    d = new_run_dir(tmp_path / "runs", "x/../../y")
    assert d.parent == tmp_path / "runs" and "/" not in d.name and ".." not in d.name


def test_format_json_is_one_document_on_stdout(cli: Cli, tmp_path: Path) -> None:
    r = cli("bench", "--agent", "oracle", "--only", *IDS, "--record-to", str(ORACLE),
            "--record-mode", "once", "--runs-dir", str(tmp_path), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # the whole of stdout, nothing after it
    assert [e["verdict"] for e in doc["episodes"]] == ["pass", "pass"]
    assert "results: " in r.stderr and "[bench]" in r.stderr
    last = r.stderr.strip().splitlines()[-1]  # a bench ends by naming the report a person opens
    assert last.startswith("[bench] report: ") and Path(last.split(": ", 1)[1]).is_file(), last


def test_quiet_silences_progress(cli: Cli, tmp_path: Path) -> None:
    r = cli("-q", "bench", "--agent", "oracle", "--only", IDS[0], "--record-to", str(ORACLE),
            "--record-mode", "once", "--runs-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "[bench]" not in r.stderr and "| rogue-port-80" in r.stdout


def test_a_closed_pipe_is_not_a_traceback() -> None:
    # A process: the reader of its stdout pipe goes away, which only a real pipe between processes shows.
    proc = subprocess.Popen(cli_argv("replay", "--offline", str(repo_root() / "recordings")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=repo_root())
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line: like `| head -0`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipe" not in err, err
