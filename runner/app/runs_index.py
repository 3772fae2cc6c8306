"""``rootbench view [RUNS_DIR]``: one static page listing every run, with a link to its report.

A user who ran a few benches, a verify and an MCP session has a folder of
run directories named by their start time; finding last week's run of the
1.5B meant opening them one by one. The index (``RUNS_DIR/index.html``) is
one row per run, newest first: when it started, what it was (bench, run,
verify, mcp: the folder's label), the agent and model, how many episodes,
pass@1, the mean repair score and the unsafe-fix rate, each computed by
:mod:`runner.app.stats` from the run's own results as ``report`` would,
whether ``rootbench rejudge`` confirmed its verdicts on fresh VMs (its
``rejudged.json``), and a link to the run's HTML report. A run directory whose results are newer
than its report (or that has none) gets its report written first, so every
link works offline.

What is read is what the user handed over: a damaged results file is a row
that says so, never a crash; a folder's name reaches the page as escaped
text, and is a link only when it is a plain name (letters, digits, ``.``,
``_``, ``-``) of a folder inside RUNS_DIR. The page runs no script (its
Content-Security-Policy allows none).
"""

from __future__ import annotations

import datetime as _dt
import logging
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner import __version__
from runner.app.html_report.render import REPORT_NAME, environment, write_run_report
from runner.app.outputs import atomic_write
from runner.app.rejudge import RECORD_NAME, read_record
from runner.app.runs import load_results
from runner.app.stats import summarize
from runner.core import layout
from runner.core.errors import InvalidInput
from runner.core.paths import contained
from runner.core.text import one_line

log = logging.getLogger("rootbench.view")

INDEX_NAME = "index.html"
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_STAMP = re.compile(r"^(\d{8})-(\d{6})(?:-(.*))?$")
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
       "form-action 'none'")


@dataclass(frozen=True)
class IndexRow:
    """One run as the index shows it; figures are None where the run has none to show."""

    name: str
    started: str  # "2026-12-07 14:50:02" from the folder's stamp, else the folder's mtime
    what: str  # the folder's label: bench, run, verify, mcp, oracle, ...
    agent: str
    models: str
    episodes: int | None
    pass_at_1: float | None
    mean_repair: float | None
    unsafe_rate: float | None
    report: str | None  # the report's href, relative to the index; None: no report to link
    problem: str = ""  # why the run's figures are missing (a damaged results file)
    rejudged: str = "-"  # "8/8 confirmed" from the run's rejudged.json (rootbench rejudge)


def _started(folder: Path) -> tuple[str, str]:
    """(when the run started, its label) from a ``<YYYYmmdd-HHMMSS>-<label>`` folder name; a
    folder named otherwise started at its modification time and is labelled by its name."""
    m = _STAMP.match(folder.name)
    if m:
        try:
            when = _dt.datetime.strptime(m.group(1) + m.group(2), "%Y%m%d%H%M%S")
            return when.strftime("%Y-%m-%d %H:%M:%S"), m.group(3) or ""
        except ValueError:
            pass
    when = _dt.datetime.fromtimestamp(folder.stat().st_mtime)
    return when.strftime("%Y-%m-%d %H:%M:%S"), folder.name


def _href(folder: Path, root: Path) -> str | None:
    """The report's link, or None when there is none or the name is not a plain one inside root."""
    report = folder / REPORT_NAME
    if not _PLAIN_NAME.match(folder.name) or not report.is_file() or contained(report, root) is None:
        return None
    return urllib.parse.quote(folder.name) + "/" + REPORT_NAME


def run_folders(runs_dir: Path) -> list[Path]:
    """The run directories in ``runs_dir``: each folder that holds a results file or a report."""
    out = []
    for p in sorted(runs_dir.iterdir()):
        try:
            if p.is_dir() and not p.is_symlink() and \
                    ((p / layout.RESULTS).is_file() or (p / REPORT_NAME).is_file()):
                out.append(p)
        except OSError:
            continue
    return out


def index_row(folder: Path, root: Path) -> IndexRow:
    """One run directory read as a row: its results, summarised as ``report`` would."""
    started, label = _started(folder)
    if not (folder / layout.RESULTS).is_file():  # a verify's report, with no results file
        return IndexRow(folder.name, started, label, "-", "-", None, None, None, None,
                        _href(folder, root))
    try:
        info, episodes = load_results(folder)
    except InvalidInput as exc:
        return IndexRow(folder.name, started, label, "?", "?", None, None, None, None,
                        _href(folder, root),
                        problem=one_line(str(exc).replace(str(folder), folder.name), 300))
    raw = info.get("agent")
    agent = raw if isinstance(raw, dict) else {}
    kinds = sorted({ep.agent.value for ep in episodes}) or [str(agent.get("kind") or "?")]
    models = sorted({ep.model for ep in episodes if ep.model}) or ["-"]
    overall = summarize(episodes).overall if episodes else None
    record = read_record(folder / RECORD_NAME)
    return IndexRow(folder.name, started, label, ", ".join(kinds), ", ".join(models),
                    len(episodes), overall.pass_at_1 if overall else None,
                    overall.mean_repair if overall else None,
                    overall.unsafe_rate if overall else None, _href(folder, root),
                    rejudged=f"{record[0]}/{record[1]} confirmed" if record else "-")


def _report_is_stale(folder: Path) -> bool:
    results, report = folder / layout.RESULTS, folder / REPORT_NAME
    if not results.is_file():
        return False
    return not report.is_file() or report.stat().st_mtime < results.stat().st_mtime


def write_index(runs_dir: Path | str, *, reports: bool = True,
                progress: Callable[[str], None] = log.info) -> Path:
    """Write ``RUNS_DIR/index.html`` (first each missing or stale run report, unless not
    ``reports``) and return its path. A folder that is not there is InvalidInput."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise InvalidInput("no such directory: give the folder your runs are in (default runs/)",
                           path=str(runs_dir))
    root = runs_dir.resolve()
    folders = run_folders(runs_dir)
    stale = [f for f in folders if reports and _report_is_stale(f)]
    for i, folder in enumerate(stale, 1):
        progress(f"report {i}/{len(stale)}: {folder.name}")
        try:
            write_run_report(folder)
        except InvalidInput as exc:  # a damaged run: its row says so
            log.warning("%s: no report: %s", folder.name, one_line(str(exc), 200))
    rows = sorted((index_row(f, root) for f in folders), key=lambda r: r.started, reverse=True)
    page = environment().get_template("index.html.j2").render(
        title=f"rootbench runs: {runs_dir.name or runs_dir}", csp=CSP, rows=rows,
        generated=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        version=__version__)
    out = runs_dir / INDEX_NAME
    atomic_write(out, page)
    return out
