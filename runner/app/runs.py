"""Run directories: where a bench keeps what it did, written so nothing finished is ever lost.

A run directory::

    runs/<stamp>-<label>/
      run.json          what was asked (for --resume)
      results.json      every finished episode, rewritten atomically after each one
      results.xml       the same as JUnit XML
      cassettes/<scenario>.r<round>.jsonl
      logs/llama-server.log

Files are written atomically (temp file, fsync, rename): a crash never
leaves a half-written results file, and earlier results stay intact.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runner.app.report import junit_xml, summary_counts
from runner.core.episode import Episode


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
    path.mkdir(parents=True)
    return path


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(run_dir: Path, run_info: dict[str, Any], episodes: Sequence[Episode]) -> None:
    """Rewrite results.json and results.xml in ``run_dir`` (atomically, after every run)."""
    data = {"run": run_info, "summary": summary_counts(episodes),
            "episodes": [ep.to_dict() for ep in episodes]}
    atomic_write(run_dir / "results.json", json.dumps(data, indent=2, default=str) + "\n")
    atomic_write(run_dir / "results.xml", junit_xml(episodes) + "\n")


def load_results(run_dir: Path) -> tuple[dict[str, Any], list[Episode]]:
    """Read a run directory's results back (for ``--resume``)."""
    path = Path(run_dir) / "results.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, []
    fields = set(Episode.__dataclass_fields__)
    episodes = [Episode(**{k: v for k, v in e.items() if k in fields}) for e in data.get("episodes", [])]
    return data.get("run", {}), episodes
