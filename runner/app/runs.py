"""Run directories: where a bench keeps what it did, written so nothing finished is ever lost.

A run directory (every name in it is :mod:`runner.core.layout`'s)::

    runs/<stamp>-<label>/
      run.json          what was asked (for --resume)
      results.json      every finished episode, rewritten atomically after each one
      results.xml       the same as JUnit XML
      report.html       the same for people
      cassettes/<scenario>.r<round>[.h<level>].jsonl
      cassettes/<arm>/<scenario>.r<round>[.h<level>].jsonl   (a matrix bench: one folder per arm)
      logs/llama-server.log

Files are written atomically (temp file, fsync, rename) by
:func:`runner.app.outputs.atomic_write`: a crash never leaves a half-written
results file, and earlier results stay intact.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema

from runner.app.outputs import atomic_write
from runner.app.report import junit_xml
from runner.app.stats import summarize, verdict_counts
from runner.core import layout
from runner.core.cassette import Cassette
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.paths import schema_path
from runner.core.spec import read_text
from runner.core.text import one_line, reason_first

MAX_RESULTS_BYTES = 64 * 1024 * 1024


def slug(label: str) -> str:
    """``label`` as one safe path component: never a separator, never ``..``."""
    text = re.sub(r"[^A-Za-z0-9._-]+|\.{2,}", "-", label)
    text = re.sub(r"-{2,}", "-", text).strip(".-")
    return text[:80] or "run"


def new_run_dir(base: Path, label: str) -> Path:
    """A fresh ``<stamp>-<label>`` folder inside ``base`` (the label made a slug)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"{stamp}-{slug(label)}"
    path = base / name
    n = 1
    while path.exists():
        n += 1
        path = base / f"{name}-{n}"
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise InvalidInput(f"cannot make the run directory: {exc.strerror}", path=str(base),
                           field="--runs-dir") from None
    return path


def write_results(run_dir: Path, run_info: dict[str, Any], episodes: Sequence[Episode]) -> None:
    """Rewrite results.json and results.xml in ``run_dir`` (atomically, after every run).

    results.json holds ``run`` (what was asked), ``summary`` (runs per
    verdict), ``statistics`` (per scenario and overall: pass@1 with its Wilson
    interval, pass@k, mean score with its bootstrap interval; the structure is
    documented at :meth:`runner.app.stats.Statistics.to_dict`) and ``episodes``.
    """
    data: dict[str, Any] = {"run": run_info, "summary": verdict_counts(episodes),
                            "statistics": summarize(episodes).to_dict()}
    arms = list(dict.fromkeys(ep.arm for ep in episodes if ep.arm))
    if arms:  # a matrix bench: the statistics of each arm too (the overall ones mix them)
        data["statistics_by_arm"] = {a: summarize([ep for ep in episodes if ep.arm == a]).to_dict()
                                     for a in arms}
    data["episodes"] = [ep.to_dict() for ep in episodes]
    atomic_write(run_dir / layout.RESULTS, json.dumps(data, indent=2, default=str) + "\n")
    atomic_write(run_dir / layout.RESULTS_XML, junit_xml(episodes) + "\n")


class _NotANumber:
    """What the reader puts where results.json holds a number JSON cannot mean: NaN,
    Infinity, a float that overflows to infinity, or an integer too long to convert
    (Python refuses those past ``sys.get_int_max_str_digits()`` digits)."""

    def __init__(self, text: str, why: str) -> None:
        self.text = text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"
        self.why = why


MAX_INT_DIGITS = 100  # no count or time in a results file comes near this


def _parse_int(text: str) -> int | _NotANumber:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _NotANumber(text, f"an integer of {digits} digits is out of range")
    return int(text)


def _parse_float(text: str) -> float | _NotANumber:
    value = float(text)
    return value if math.isfinite(value) else _NotANumber(text, "out of range (not finite)")


def _parse_constant(name: str) -> _NotANumber:
    return _NotANumber(name, "is not a number (JSON has no NaN or Infinity)")


def _not_a_number(value: Any, path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], _NotANumber] | None:
    """The first number the reader could not take, with where it is, or None."""
    if isinstance(value, _NotANumber):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        if (found := _not_a_number(item, (*path, key))) is not None:
            return found
    return None


def _field(path: Sequence[Any]) -> str | None:
    # Keys are the file's: one line each, no controls (a key may hold a newline or a bidi override).
    field = ".".join(f"[{p}]" if isinstance(p, int) else one_line(str(p), 60) for p in path)
    return field.replace(".[", "[") or None


def results_file(run_dir: Path, what: str = "a run directory") -> Path:
    """``RUNDIR/results.json`` when it is a regular file; else InvalidInput saying what is there.

    Only ``stat`` is used: a FIFO named results.json is named as one, never opened
    (an open would wait for a writer forever).
    """
    run_dir = Path(run_dir)
    path = run_dir / layout.RESULTS
    try:
        st = path.stat()
    except FileNotFoundError:
        if not run_dir.is_dir():
            raise InvalidInput("no such directory" if not run_dir.exists() else
                               f"not {what} (a file, not a directory)", path=str(run_dir)) from None
        raise InvalidInput(f"not {what} (no results.json)", path=str(run_dir)) from None
    except OSError as exc:
        raise InvalidInput(f"cannot read results.json: {exc.strerror or exc}",
                           path=str(run_dir)) from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
                "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
        raise InvalidInput(f"is {kind}, not a results file", path=str(path))
    return path


def load_results(run_dir: Path) -> tuple[dict[str, Any], list[Episode]]:
    """Read a run directory's results back (for ``report``, ``compare`` and ``--resume``).

    A missing file is an empty run. A damaged one (not JSON, wrong types, an
    unknown verdict, a number that is NaN, infinite, out of range or too long
    to read) is :class:`InvalidInput` naming the file and the field: a resume
    must never guess what a broken file meant, and a report never show it.
    """
    path = Path(run_dir) / layout.RESULTS
    if not path.exists() and not path.is_symlink():
        return {}, []
    path = results_file(Path(run_dir))
    text = read_text(path, limit=MAX_RESULTS_BYTES)
    try:
        data = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_parse_constant)
    except (ValueError, RecursionError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise InvalidInput(f"not valid JSON{where}", path=str(path)) from None
    if (bad := _not_a_number(data)) is not None:
        at, number = bad
        raise InvalidInput(f"{number.text} {number.why}" if number.why.startswith("is ")
                           else f"{number.text}: {number.why}", path=str(path), field=_field(at))
    errors = sorted(_results_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        assert best is not None
        raise InvalidInput(reason_first(best.message, best.instance), path=str(path),
                           field=_field(list(best.absolute_path)))
    episodes = [Episode.from_dict(e) for e in data["episodes"]]
    run = data.get("run")
    return (run if isinstance(run, dict) else {}), episodes


def recorded_cassettes(folder: Path) -> list[Path]:
    """The episode cassettes directly in a recordings folder (a ``--record-to`` folder or an
    archive's ``<model>-<protocol>``): the names :func:`layout.parse_cassette_name` reads as an
    episode's, so verify's noop runs and the shortcuts' subfolders are not among them."""
    try:
        names = sorted(p for p in Path(folder).iterdir()
                       if p.is_file() and layout.parse_cassette_name(p.name) is not None)
    except OSError as exc:
        raise InvalidInput(f"cannot list the folder: {exc.strerror or exc}",
                           path=str(folder)) from None
    return names


def episodes_from_recordings(folder: Path) -> tuple[list[Episode], list[Path]]:
    """A recordings folder's episodes, read from its cassettes' verdict lines (what the bench
    wrote, so the figures are the ones its results.json had), and the cassettes with no verdict
    line (cut short), which have no episode. A damaged cassette is :class:`InvalidInput`."""
    episodes: list[Episode] = []
    cut: list[Path] = []
    for path in recorded_cassettes(folder):
        verdict = Cassette.load(path).verdict
        if verdict is None:
            cut.append(path)
            continue
        try:
            ep = Episode.from_dict(verdict)  # it leaves out the line's "type"
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"the verdict line is not an episode: {one_line(str(exc), 120)}",
                               path=str(path)) from None
        ep.cassette = path.name  # where it is now, not where the machine that ran it kept it
        episodes.append(ep)
    return episodes, cut


def is_recordings(path: Path) -> bool:
    """Whether ``path`` is a folder of episode cassettes without a results.json (not a run
    directory): ``report`` and ``compare`` then read the cassettes' verdict lines."""
    path = Path(path)
    try:  # a folder that cannot be entered is not known to be one: results_file says why
        if not path.is_dir() or (path / layout.RESULTS).exists() \
                or (path / layout.RESULTS).is_symlink():
            return False
        return bool(recorded_cassettes(path))
    except (OSError, InvalidInput):
        return False


def load_episodes(path: Path) -> tuple[dict[str, Any], list[Episode]]:
    """A run directory's results (:func:`load_results`) or a recordings folder's episodes
    (:func:`episodes_from_recordings`; no ``run`` information then). Anything else is
    :class:`InvalidInput` saying what is there."""
    path = Path(path)
    if is_recordings(path):
        return {}, episodes_from_recordings(path)[0]
    results_file(path, "a run directory or a folder of cassettes")
    info, episodes = load_results(path)
    for ep in episodes:  # shown to others: never the layout of the machine that ran it
        ep.cassette = relative_name(ep.cassette, path)
    return info, episodes


def relative_name(recorded: str | None, root: Path) -> str | None:
    """A path recorded in a verdict line (``/work/main/runs/.../x.jsonl``, the machine that ran
    it) as shown to others: relative to ``root`` (the run or recordings directory) when it lies
    under it, else its file name. Exports and reports never carry another machine's layout."""
    if not recorded:
        return recorded
    path = Path(recorded)
    if not path.is_absolute():
        return recorded
    try:
        return str(path.relative_to(Path(root).resolve()))
    except ValueError:
        pass
    parts = path.parts
    if layout.CASSETTES in parts[:-1]:  # <run>/cassettes/[<arm>/]<name>: from cassettes/ on
        return str(Path(*parts[len(parts) - 1 - parts[::-1].index(layout.CASSETTES):]))
    return path.name


def shown_path(path: Path) -> str:
    """A folder or file the user named, as a report shows it: as typed when relative, relative
    to the working directory when under it, else by its name (never a local absolute path)."""
    path = Path(path)
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except (ValueError, OSError):
        return path.name


@functools.cache
def _results_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_path("results.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)
