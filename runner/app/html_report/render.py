"""Rendering: the view model and the plots through the Jinja2 template into one HTML file.

Guest output and model text are hostile. The page is rendered with
autoescaping on, every value the template emits passes :func:`_finalize`
(:func:`~runner.app.html_report.fields.text`, so control sequences are
stripped, and :func:`shown`, so no one text can make the page huge), content
never goes into a URL or an attribute (CSS classes come from fixed lists),
and a Content-Security-Policy stops anything that could still slip through:
its ``script-src`` allows one script, by the sha256 of its exact text
(``templates/report.js``: search, filter and sort, which only hides and
reorders elements), never ``'unsafe-inline'``, so a ``<script>`` or an
``onerror=`` that got into the page would not run. Folding is ``<details>``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import functools
import hashlib
import importlib.resources
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from runner import __version__
from runner.app.events import BenchListener, Step
from runner.app.html_report.fields import text
from runner.app.html_report.load import load_run_arms, runs_from_cassettes
from runner.app.html_report.plots import plots
from runner.app.html_report.view import ChecksTable, RunView, page
from runner.app.outputs import atomic_write, write_error
from runner.app.signals import Interrupted
from runner.core import layout
from runner.core.episode import Episode
from runner.core.text import one_line

REPORT_NAME = layout.REPORT
# Any one text shown (an output, a reply, a task): real runs cap outputs at the scenario's
# output_limit (4000 by default); a crafted cassette's 10 MB output must not make a 25 MB page.
MAX_SHOWN_CHARS = 20_000


@functools.cache
def script() -> str:
    """The page's one script, as it goes between ``<script>`` and ``</script>``."""
    body = (importlib.resources.files("runner.app.templates") / "report.js").read_text(encoding="utf-8")
    # The browser hashes the element's text after the HTML parser turned CR LF into LF: hash that.
    assert "\r" not in body and "</" not in body, "report.js must keep to LF and hold no '</'"
    return body


def script_hash(body: str) -> str:
    """The CSP source that allows exactly ``body``: ``'sha256-<base64 of its UTF-8 digest>'``."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode() + "'"


def csp() -> str:
    """The page's Content-Security-Policy: nothing fetched, no script but :func:`script`."""
    return (f"default-src 'none'; script-src {script_hash(script())}; style-src 'unsafe-inline'; "
            "img-src data:; base-uri 'none'; form-action 'none'")


def shown(value: str, limit: int | None = None) -> str:
    """``value`` cut to ``limit`` characters (default :data:`MAX_SHOWN_CHARS`), saying by how much.

    A real run caps what the model is sent of each output (the budget's
    ``output_limit``); a cassette handed over may hold anything up to its own
    size cap, and a report shows every text of it, so each is cut here.
    """
    limit = MAX_SHOWN_CHARS if limit is None else limit
    if len(value) <= limit:
        return value
    return (f"{value[:limit]}\n[... {len(value) - limit:,} more characters of "
            f"{len(value):,} cut from the report; the cassette has them all]")


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}`` the template emits passes here first: cleaned text, never markup,
    at most :data:`MAX_SHOWN_CHARS` characters of it."""
    if value is None:
        return ""
    if isinstance(value, markupsafe.Markup):  # a macro's output: made here, its values already cleaned
        return value
    return value if isinstance(value, int | float) and not isinstance(value, bool) \
        else shown(text(value))


def environment() -> jinja2.Environment:
    """The one Jinja2 environment of rootbench's pages: autoescape on every template, every value
    cleaned and cut (:func:`_finalize`), an undefined name an error."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("runner.app", "templates"),
        autoescape=True,  # every template, whatever its name: nothing is ever emitted raw
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        trim_blocks=True, lstrip_blocks=True,
    )
    env.globals.update(vclass=_verdict_class, oclass=_outcome_class, short=_short)
    return env


_VERDICT_CLASS = {"pass": "v-pass", "fail": "v-fail", "infra-error": "v-infra",
                  "invalid-scenario": "v-invalid"}
_SHORT = {"pass": "pass", "fail": "fail", "infra-error": "infra", "invalid-scenario": "invalid"}


def _verdict_class(verdict: Any) -> str:
    """A CSS class from a fixed list: verdict text never reaches an attribute."""
    return _VERDICT_CLASS.get(verdict, "v-other") if isinstance(verdict, str) else "v-other"


def _outcome_class(outcome: Any) -> str:
    return {"pass": "o-pass", "fail": "o-fail", "error": "o-error"}.get(outcome, "o-other") \
        if isinstance(outcome, str) else "o-other"


def _short(verdict: Any) -> str:
    return _SHORT.get(verdict, "?") if isinstance(verdict, str) else "?"


def render(runs: Sequence[RunView], title: str = "rootbench report",
           checks: ChecksTable | None = None) -> str:
    """The whole report for ``runs`` (side by side when there are several), as one HTML string;
    with ``checks``, a verify's report that leads with its table (:func:`page`)."""
    drawn = plots(runs)
    return environment().get_template("report.html.j2").render(
        title=text(title), csp=csp(), script=markupsafe.Markup(script()), plots=drawn or [], plots_missing=drawn is None, wilson=True,
        generated=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        version=__version__, **page(runs, checks))


def write(runs: Sequence[RunView], out: Path | str, title: str = "rootbench report",
          flag: str | None = None, checks: ChecksTable | None = None) -> Path:
    """Render ``runs`` to ``out`` (atomically, with the mode of any new file) and return its path.

    A path that cannot be written is InvalidInput naming it (and ``flag``, the
    option that chose it); the CLI checks it before any work too, this is for a
    folder that changed in between.
    """
    out = Path(out)
    page = render(runs, title, checks)
    try:
        atomic_write(out, page, flag)
    except OSError as exc:
        if (bad := write_error(exc, out, flag)) is not None:
            raise bad from None
        raise
    return out


def write_run_report(run_dir: Path | str) -> Path:
    """``RUNDIR/report.html`` for a bench's run directory."""
    run_dir = Path(run_dir)
    return write(load_run_arms(run_dir), run_dir / REPORT_NAME, f"rootbench: {run_dir.name}")


def write_cassette_report(cassettes: Sequence[Path | str], out: Path | str,
                          title: str = "rootbench report",
                          checks: ChecksTable | None = None) -> Path:
    """A report of loose cassettes (one run per model and protocol) written to ``out``; with
    ``checks``, led by that table (a verify's report)."""
    return write(runs_from_cassettes(cassettes), out, title, checks=checks)


def refresh(run_dir: Path | str, logger: logging.Logger, *,
            cassettes: Sequence[Path | str] | None = None,
            checks: ChecksTable | None = None) -> Path | None:
    """(Re)write ``RUNDIR/report.html``; a report that cannot be drawn is a warning, not an error.

    Benches call this after every scenario, so an interrupted bench still has
    a report; by then results.json is on disk, and a report that fails to
    render must not stop the bench nor lose what it has done. ``cassettes``:
    report these (verify's run directories have no results.json); ``checks``: verify's
    table, which the report then leads with.
    """
    run_dir = Path(run_dir)
    try:
        if cassettes is None:
            return write_run_report(run_dir)
        return write_cassette_report(cassettes, run_dir / REPORT_NAME,
                                     f"rootbench: {run_dir.name}", checks)
    except Interrupted:
        raise
    except Exception as exc:  # noqa: BLE001 - the results are on disk; a report must not cost them
        logger.warning("the HTML report could not be written: %s", one_line(str(exc)))
        return None


REFRESH_SECONDS = 10.0  # during a bench, the report is rewritten at most this often


class Refresher(BenchListener):
    """A bench's report, kept fresh without paying for it after every episode: a listener the
    CLI hands the bench (:mod:`runner.app.events`), so the bench never imports the report.

    Rendering reads every cassette of the run and draws every plot, so
    rewriting the report after each of N episodes costs O(N²). ``done`` after
    an episode writes it only when ``every`` seconds have passed since the
    last write ended (the first episode always writes, so the path is known
    early); ``flush`` writes what is still unwritten (a bench that stops on
    an error); ``final`` always writes (the end of a bench). ``clock`` is a
    monotonic clock in seconds.
    """

    def __init__(self, run_dir: Path | str, logger: logging.Logger, *,
                 every: float = REFRESH_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir, self.logger, self.every, self.clock = Path(run_dir), logger, every, clock
        self.last: float | None = None  # when the last write ended
        self.pending = False  # an episode ended since then
        self.writes = 0

    def episode_finished(self, step: Step, episode: Episode) -> None:
        """The bench's event: the report is rewritten when due; the first time, its path said."""
        first = self.writes == 0
        path = self.done()
        if path is not None and first:
            self.logger.info("report (refreshed at most every %g s, and at the end): %s",
                             self.every, path)

    def bench_ended(self, episodes: list[Episode], *, interrupted: bool) -> None:
        """The bench's event: at the end, always rewritten; on an interruption, only if an episode
        ended since the last write (an interrupted bench's report has every episode that ended)."""
        if interrupted:
            self.flush()
            return
        path = self.final()
        if path is not None:
            self.logger.info("report: %s", path)

    def done(self) -> Path | None:
        """An episode ended: the report's path when it was rewritten now, else None."""
        self.pending = True
        if self.last is not None and self.clock() - self.last < self.every:
            return None
        return self.final()

    def flush(self) -> Path | None:
        """Rewrite the report when an episode ended since the last write."""
        return self.final() if self.pending else None

    def final(self) -> Path | None:
        """Rewrite the report now."""
        self.pending = False
        self.writes += 1
        try:
            return refresh(self.run_dir, self.logger)
        finally:
            self.last = self.clock()
