"""Run directories: where a bench keeps what it did, written so nothing finished is ever lost.

A run directory::

    runs/<stamp>-<label>/
      run.json          what was asked (for --resume)
      results.json      every finished episode, rewritten atomically after each one
      results.xml       the same as JUnit XML
      cassettes/<scenario>.r<round>.jsonl
      cassettes/<arm>/<scenario>.r<round>.jsonl   (a matrix bench: one folder per model-protocol)
      logs/llama-server.log

Files are written atomically (temp file, fsync, rename): a crash never
leaves a half-written results file, and earlier results stay intact.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema

from runner.app.report import junit_xml, summary_counts
from runner.app.stats import summarize
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.paths import repo_root
from runner.core.spec import read_text
from runner.core.text import one_line

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


def check_writable_dir(path: Path, flag: str) -> None:
    """Refuse, before any work, a directory the command would write to but cannot.

    ``path`` need not exist yet: then its nearest existing ancestor must be
    a directory it can be made in. Tried for real (a temporary file made and
    removed), since permission bits say nothing to root or of a read-only
    mount. One line naming the flag, :class:`InvalidInput`.
    """
    path = Path(path)
    where = path
    try:
        while not where.exists() and where != where.parent:
            where = where.parent
        if not where.is_dir():
            what = "is not a directory" if where == path else f"is under {where}, not a directory"
            raise InvalidInput(f"{path} {what}", field=flag)
        with tempfile.TemporaryFile(dir=where, prefix=".rootbench-write-check-"):
            pass
    except OSError as exc:
        raise InvalidInput(f"cannot write in {where}: {exc.strerror or exc}", field=flag) from None


def _umask() -> int:
    """The process's umask, read without changing it (Linux says it in /proc), else set back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new one, never half.

    The file gets the mode any new file gets (0666 less the umask), as the
    cassettes do: the temporary file it is renamed from is made 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(run_dir: Path, run_info: dict[str, Any], episodes: Sequence[Episode]) -> None:
    """Rewrite results.json and results.xml in ``run_dir`` (atomically, after every run).

    results.json holds ``run`` (what was asked), ``summary`` (runs per
    verdict), ``statistics`` (per scenario and overall: pass@1 with its Wilson
    interval, pass@k, mean score with its bootstrap interval; the structure is
    documented at :meth:`runner.app.stats.Statistics.to_dict`) and ``episodes``.
    """
    data: dict[str, Any] = {"run": run_info, "summary": summary_counts(episodes),
                            "statistics": summarize(episodes).to_dict()}
    arms = list(dict.fromkeys(ep.arm for ep in episodes if ep.arm))
    if arms:  # a matrix bench: the statistics of each arm too (the overall ones mix them)
        data["statistics_by_arm"] = {a: summarize([ep for ep in episodes if ep.arm == a]).to_dict()
                                     for a in arms}
    data["episodes"] = [ep.to_dict() for ep in episodes]
    atomic_write(run_dir / "results.json", json.dumps(data, indent=2, default=str) + "\n")
    atomic_write(run_dir / "results.xml", junit_xml(episodes) + "\n")


def load_results(run_dir: Path) -> tuple[dict[str, Any], list[Episode]]:
    """Read a run directory's results back (for ``report`` and ``--resume``).

    A missing file is an empty run. A damaged one (not JSON, wrong types, an
    unknown verdict) is :class:`InvalidInput` naming the file and the field:
    a resume must never guess what a broken file meant.
    """
    path = Path(run_dir) / "results.json"
    if not path.exists():
        return {}, []
    text = read_text(path, limit=MAX_RESULTS_BYTES)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise InvalidInput(f"not valid JSON{where}", path=str(path)) from None
    errors = sorted(_results_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        assert best is not None
        field = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in best.absolute_path)
        raise InvalidInput(one_line(best.message, 160), path=str(path),
                           field=field.replace(".[", "[") or None)
    fields = set(Episode.__dataclass_fields__)
    episodes = [Episode(**{k: v for k, v in e.items() if k in fields}) for e in data["episodes"]]
    run = data.get("run")
    return (run if isinstance(run, dict) else {}), episodes


@functools.cache
def _results_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((repo_root() / "schema" / "results.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)
