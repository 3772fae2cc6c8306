"""Where a run keeps what it did: the one owner of run-directory and cassette names.

Every reader and writer of a run directory (bench, verify, the reports, the
ATIF export, replay, the MCP server) asks this module for a name, so a name
changed here changes everywhere, and a reader can never look for a file under
another name than the writer gave it (the HTML report once looked for
``<scenario>.r<round>.jsonl`` whatever the episode's hint level, and showed a
ladder's level-0 transcript under every hinted verdict). A run directory::

    <run>/
      run.json                                    RUN_INFO: what was asked (for --resume)
      results.json, results.xml                   RESULTS, RESULTS_XML
      report.html                                 REPORT
      cassettes/<scenario>.r<round>.jsonl         level 0 (as before hints existed)
      cassettes/<scenario>.r<round>.h<level>.jsonl
      cassettes/<arm>/...                         a matrix bench: one folder per arm

``verify`` names its oracle cassettes ``<scenario>.jsonl`` (round 0, level 0),
its noop runs ``<scenario>.noop.jsonl`` in its run directory or, recorded,
``noop/<scenario>.jsonl``, and a shortcut's ``shortcuts/<scenario>/<slug>.jsonl``.
:func:`parse_cassette_name` reads all of these back. Names only: nothing here touches the disk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUN_INFO = "run.json"
RESULTS = "results.json"
RESULTS_XML = "results.xml"
REPORT = "report.html"
CASSETTES = "cassettes"  # the folder of a bench's cassettes inside its run directory
SHORTCUTS = "shortcuts"  # under verify's --record-to: shortcuts/<scenario>/<slug>.jsonl
ALTERNATIVES = "alternatives"  # under verify's --record-to: alternatives/<scenario>/<slug>.jsonl
SUFFIX = ".jsonl"  # every cassette's
NOOP = "noop"  # verify's noop run: <scenario>.noop.jsonl; recorded: noop/<scenario>.jsonl

_EPISODE = re.compile(r"(?P<scenario>.+?)\.r(?P<round>\d+)(?:\.h(?P<level>[1-9]\d*))?")


@dataclass(frozen=True)
class CassetteName:
    """What a bench cassette's name says: its scenario, round and hint level."""

    scenario: str
    round: int = 0
    hint_level: int = 0

    def __str__(self) -> str:
        return cassette_name(self.scenario, self.round, self.hint_level)


def cassette_name(scenario: str, round_: int = 0, hint_level: int = 0) -> str:
    """``<scenario>.r<round>.jsonl`` at level 0 (as before hints, so resume and record modes still
    find old cassettes), ``<scenario>.r<round>.h<level>.jsonl`` above it."""
    return f"{scenario}.r{round_}" + (f".h{hint_level}" if hint_level else "") + SUFFIX


def parse_cassette_name(name: str) -> CassetteName | None:
    """The scenario, round and hint level a cassette's file name says, or None when the name is
    not one a bench or verify gives (verify's ``<scenario>.jsonl`` is round 0 at level 0)."""
    if not name.endswith(SUFFIX):
        return None
    stem = name.removesuffix(SUFFIX)
    if (m := _EPISODE.fullmatch(stem)) is not None:
        return CassetteName(m["scenario"], int(m["round"]), int(m["level"] or 0))
    if not stem or "." in stem:  # another name (a noop run, a partial file): not an episode's
        return None
    return CassetteName(stem)


def cassette_stem(path: Path | str) -> str:
    """The cassette's name without :data:`SUFFIX`: what an export names its episode by."""
    return Path(path).name.removesuffix(SUFFIX)


def arm_folder(base: Path, arm: str | None) -> Path:
    """Where an arm's cassettes go under ``base``: ``base`` itself in a bench of one arm,
    ``base/<arm>`` in a matrix bench."""
    return base / arm if arm else base


def cassette_path(run_dir: Path, scenario: str, round_: int = 0, hint_level: int = 0,
                  arm: str | None = None) -> Path:
    """Where a bench keeps one episode's cassette inside its run directory."""
    return arm_folder(run_dir / CASSETTES, arm) / cassette_name(scenario, round_, hint_level)


def recorded_names(scenario: str, round_: int = 0, hint_level: int = 0) -> list[str]:
    """The names a recording of this episode may have in a ``--record-to`` folder, best first:
    the bench's, and for round 0 at level 0 verify's oracle name too."""
    own = [cassette_name(scenario, round_, hint_level)]
    return own + ([oracle_cassette_name(scenario)] if round_ == 0 and not hint_level else [])


def oracle_cassette_name(scenario: str) -> str:
    """verify's oracle cassette: ``<scenario>.jsonl``."""
    return scenario + SUFFIX


def noop_cassette_name(scenario: str) -> str:
    """verify's noop run: ``<scenario>.noop.jsonl``."""
    return f"{scenario}.{NOOP}{SUFFIX}"


def noop_cassette_path(record_dir: Path, scenario: str) -> Path:
    """verify's recording of the noop run: ``<record_dir>/noop/<scenario>.jsonl``."""
    return record_dir / NOOP / (scenario + SUFFIX)


def shortcut_cassette_path(record_dir: Path, scenario: str, slug: str) -> Path:
    """verify's recording of one shortcut: ``<record_dir>/shortcuts/<scenario>/<slug>.jsonl``."""
    return record_dir / SHORTCUTS / scenario / (slug + SUFFIX)


def alternative_cassette_path(record_dir: Path, scenario: str, slug: str) -> Path:
    """verify's recording of one valid alternative fix:
    ``<record_dir>/alternatives/<scenario>/<slug>.jsonl``."""
    return record_dir / ALTERNATIVES / scenario / (slug + SUFFIX)
