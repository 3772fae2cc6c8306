"""``rootbench report``: the tables of run directories, or one HTML file of runs and cassettes.

Every path is checked before anything is read or rendered (:func:`check_paths`):
each run directory has a results file (else what is there instead is named),
and the HTML file can be written where it goes. A table needs a run
directory or a recordings folder (a folder of cassettes); a loose cassette
has only the HTML report. The HTML report of one run directory goes into
it, never into committed recordings.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Sequence
from pathlib import Path

from runner.app import html_report
from runner.app.outputs import check_file_target
from runner.app.report import pass_at, render_table
from runner.app.runs import is_recordings, load_episodes, recorded_cassettes, results_file
from runner.core.episode import Episode
from runner.core.errors import InvalidInput


def check_paths(paths: Sequence[Path]) -> None:
    """Each path there and readable; each folder a run directory or a folder of cassettes."""
    for path in paths:
        try:
            is_dir = stat.S_ISDIR(path.stat().st_mode)
        except FileNotFoundError:
            raise InvalidInput("no such file or directory", path=str(path)) from None
        except OSError as exc:
            raise InvalidInput(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
        if is_dir and not is_recordings(path):
            results_file(path, "a run directory or a folder of cassettes")


def table_and_statistics(episodes: list[Episode], fmt: str) -> str:
    """A run's table; for text, the statistics under it when some scenario ran more than once
    (rounds or hint levels), as ``bench`` printed them (JSON has them in the document)."""
    table = render_table(episodes, fmt, ladder=any(ep.hint_level for ep in episodes))
    once = len({(ep.scenario, ep.round, ep.hint_level) for ep in episodes}) == len(
        {ep.scenario for ep in episodes})
    if fmt == "json" or once:
        return table
    return f"{table}\n\n{pass_at(episodes, fmt)}"


def tables(paths: Sequence[Path], fmt: str, out: str | None) -> str:
    """Each run's table, side by side under its path (one JSON document of them all); ``out``
    (``--out``) is where an HTML report goes, so without ``--html`` it is refused."""
    if out:
        raise InvalidInput("--out is where the HTML report goes: add --html", field="--out")
    loose = [p for p in paths if not p.is_dir()]
    if loose:
        raise InvalidInput("a cassette is reported with --html (the table needs a run "
                           "directory)", path=str(loose[0]))
    found = [(p, table_and_statistics(load_episodes(p)[1], fmt)) for p in paths]
    if len(found) == 1:
        return found[0][1]
    if fmt == "json":
        return json.dumps({"runs": [{"run_dir": str(p), **json.loads(t)} for p, t in found]},
                          indent=2)
    return "\n\n".join(f"{p}\n\n{t}" for p, t in found)


def html(paths: Sequence[Path], out: Path | None) -> Path:
    """One self-contained HTML file of the runs and loose cassettes; where it was written
    (``out``, else the one run directory's own ``report.html``, else ``./report.html``)."""
    dirs = [p for p in paths if p.is_dir()]
    if out is not None:
        target = check_file_target(out, "--out")
    else:
        own = list(paths) == dirs[:1] and not is_recordings(dirs[0])  # never into recordings
        target = dirs[0] / html_report.REPORT_NAME if own else Path(html_report.REPORT_NAME)
        check_file_target(target, "--out (default)")
    runs = [run for p in dirs for run in (html_report.runs_from_cassettes(recorded_cassettes(p))
                                          if is_recordings(p) else html_report.load_run_arms(p))]
    runs += html_report.runs_from_cassettes([p for p in paths if not p.is_dir()])
    title = "rootbench: " + (" vs ".join(p.name for p in dirs) if dirs and len(runs) == len(dirs)
                             else ", ".join(r.label for r in runs))
    return html_report.write(runs, target, title, flag="--out")
