"""What the HTML report's tests share: the committed runs they render, and rendering one."""

from __future__ import annotations

from pathlib import Path

from conftest import Cli

from runner.core.paths import repo_root

RECORDINGS = repo_root() / "recordings"
ORACLE = RECORDINGS / "oracle"
# Three real-model runs recorded before the published specs had hints: a fixed, small set.
LIVE_JSON = RECORDINGS / "archive" / "2026-12-03-before-hints" / "qwen2.5-coder-1.5b-json"


def report_html(cli: Cli, *args: str) -> Path:
    """``rootbench report ... --html``; the path it printed."""
    r = cli("-q", "report", *args, "--html")
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip())
