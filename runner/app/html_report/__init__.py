"""A run as a person reads it: one self-contained HTML file, opened from disk, offline.

``report.html`` opens with each run's statistics (pass@1 with its interval,
solved with hints, mean assist: ``stats.summarize`` as the terminal shows it)
and, side by side, ``compare``'s verdict; then what ran (model, protocol,
sampling, budgets, harness, accelerator; the fingerprint folded), the
verdict counts, the scenario table, a
heat map of scenarios by rounds (and by runs, when several are compared),
plots, and every episode's trajectory read back from its cassette: the
task, each turn's reply, command, exit code, duration and output, protocol
corrections, repeat notes, the probes before and after, and the verdict.

The report is four parts, each a module, in the order the data flows:

========================  ========================================================
``trajectory.py``         a cassette read back as turns (also what ATIF exports)
``view.py``               the view model: runs and episodes loaded from a run
                          directory or cassettes, the overview, table and heat map
``plots.py``              the SVG plots (matplotlib, optional)
``render.py``             the Jinja2 template (``runner/app/templates``) into a file,
                          with ``report.js`` (search, filter, sort) pinned by hash
========================  ========================================================

``fields.py`` is how each of them reads a field of a file handed over. The
names below are the package's public surface; callers import them from here.
"""

from runner.app.html_report.fields import text
from runner.app.html_report.load import load_run_arms, load_run_dir, runs_from_cassettes
from runner.app.html_report.render import (
    MAX_SHOWN_CHARS,
    REFRESH_SECONDS,
    REPORT_NAME,
    Refresher,
    refresh,
    render,
    write,
    write_cassette_report,
    write_run_report,
)
from runner.app.html_report.trajectory import Command, SetupStep, Trajectory, Turn, load_trajectory
from runner.app.html_report.view import (
    OPTIONAL_COLUMNS,
    ChecksTable,
    EpisodeView,
    RunView,
    agent_kind,
)

__all__ = [
    "MAX_SHOWN_CHARS", "OPTIONAL_COLUMNS", "REFRESH_SECONDS", "REPORT_NAME", "Refresher", "ChecksTable",
    "Command", "EpisodeView", "RunView",
    "SetupStep", "Trajectory", "Turn", "agent_kind", "load_run_arms", "load_run_dir",
    "load_trajectory", "refresh", "render", "runs_from_cassettes", "text", "write",
    "write_cassette_report", "write_run_report",
]
