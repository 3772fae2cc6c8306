"""No path of the machine that ran a bench, or of the one reporting on it, in what is shown to
others: the HTML report and report's JSON name cassettes relative to the run directory (or by
file name), whatever the verdict lines recorded (``/work/main/runs/...``) and however the
folders were named on the command line (absolute here). No VM: a run directory is made from
archived cassettes with the writer the bench uses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import Cli

from runner.app.runs import episodes_from_recordings, write_results
from runner.core.cassette import Cassette
from runner.core.paths import repo_root

ARCHIVE = repo_root() / "recordings" / "archive" / "2026-12-04-before-validity" / \
    "qwen2.5-coder-1.5b-json"
NAMES = ["ssh-stopped.r0.jsonl", "rogue-port-80.r0.jsonl"]


def _run_dir(tmp_path: Path) -> tuple[Path, list[str]]:
    """A run directory as a bench leaves it: cassettes/ and results.json whose episodes keep the
    cassette paths the recording machine wrote. Returns it and those recorded paths."""
    run = tmp_path / "runs" / "20261204-130103-qwen2.5-coder-1.5b"
    (run / "cassettes").mkdir(parents=True)
    for name in NAMES:
        shutil.copy2(ARCHIVE / name, run / "cassettes" / name)
    episodes, _ = episodes_from_recordings(run / "cassettes")
    recorded = [str((Cassette.load(ARCHIVE / n).verdict or {})["cassette"]) for n in NAMES]
    for ep, path in zip(episodes, recorded, strict=True):
        ep.cassette = path  # as the bench wrote it
    write_results(run, {"agent": {"kind": "model", "model": "qwen2.5-coder-1.5b"}}, episodes)
    assert all(p.startswith("/work/main/runs/") for p in recorded)
    assert recorded[0] in (run / "results.json").read_text()
    return run, recorded


def _leaks(text: str, tmp_path: Path, recorded: list[str]) -> list[str]:
    local = [str(tmp_path), str(repo_root()), *(str(Path(p).parent) for p in recorded)]
    return [p for p in local if p in text]


def test_the_html_report_names_cassettes_relative_to_the_run_directory(cli: Cli,
                                                                       tmp_path: Path) -> None:
    run, recorded = _run_dir(tmp_path)
    out = tmp_path / "r.html"
    r = cli("report", str(run), "--html", "--out", str(out), cwd=repo_root())
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "cassette: cassettes/ssh-stopped.r0.jsonl" in html
    assert _leaks(html, tmp_path, recorded) == []
    # Loose cassettes and a recordings folder, named absolutely: by file name.
    loose = tmp_path / "loose.html"
    r = cli("report", str(ARCHIVE / NAMES[0]), str(ARCHIVE), "--html", "--out", str(loose),
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    html = loose.read_text()
    assert "cassette: ssh-stopped.r0.jsonl" in html
    assert _leaks(html, tmp_path, recorded) == []


def test_report_json_names_cassettes_relative_to_the_run_directory(cli: Cli,
                                                                   tmp_path: Path) -> None:
    run, recorded = _run_dir(tmp_path)
    r = cli("report", str(run), "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    shown = [ep["cassette"] for ep in json.loads(r.stdout)["episodes"]]
    assert shown == [f"cassettes/{n}" for n in NAMES]
    assert _leaks(r.stdout, tmp_path, recorded) == []


def test_the_html_report_of_a_recordings_folder_goes_to_the_working_directory(
        cli: Cli, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    shutil.copy2(ARCHIVE / NAMES[0], rec / NAMES[0])
    work = tmp_path / "work"
    work.mkdir()
    r = cli("report", str(rec), "--html", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "report.html" and (work / "report.html").is_file()
    assert sorted(p.name for p in rec.iterdir()) == [NAMES[0]]  # nothing written among them
