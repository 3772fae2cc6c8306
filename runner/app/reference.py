"""Reference points: what doing nothing and the oracle get, beside every model's figures.

A figure alone does not say whether it is good: the old headline, the mean score, gave the
noop agent (which runs no command) 0.337 over the suite, and a model's 0.33 looked like a
third of the job. So wherever rootbench shows a model's figures (``report``, ``compare``,
the HTML report, the README's block, ATIF) it shows beside them the same figures of the two
committed reference runs, over the same scenarios: ``noop`` (the machine left broken) and
``oracle`` (each spec's own solution). They are read from the checkout's recordings
(``recordings/oracle/noop/`` and ``recordings/oracle/``, one ``<scenario>.jsonl`` each, the
cassettes ``verify`` proves), only the scenarios asked for, once per process. Installed from
a wheel there are no recordings, and no reference is shown (never a made-up one).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.app.stats import Summary, summarize
from runner.core.cassette import Cassette
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.paths import repo_root

# What each reference is called, and its folder under the checkout.
REFERENCES = (("noop", Path("recordings/oracle/noop")), ("oracle", Path("recordings/oracle")))
_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")  # a scenario id; a recording's name is no path


@dataclass(frozen=True)
class Reference:
    """One reference run's figures over the scenarios asked (those it has a cassette of)."""

    name: str  # "noop" or "oracle"
    folder: Path  # relative to the checkout, as the docs name it
    scenarios: int  # of the scenarios asked, how many it has
    summary: Summary  # summarize(...).overall of those episodes

    def to_dict(self) -> dict[str, Any]:
        """As report's and compare's JSON hold it: its name, folder, how many of the scenarios
        it has, and ``summarize``'s overall entry over those."""
        return {"name": self.name, "folder": str(self.folder), "scenarios": self.scenarios,
                **self.summary.to_dict()}


def reference_episode(name: str, scenario: str) -> Episode | None:
    """The reference run ``name``'s episode of ``scenario`` (its cassette's verdict line); None
    when there is none (not a checkout, a scenario it does not cover, no verdict)."""
    folder = dict(REFERENCES).get(name)
    if folder is None or not _ID.fullmatch(scenario):
        return None
    return _episode(repo_root() / folder / f"{scenario}.jsonl")


@functools.lru_cache(maxsize=512)
def _episode(path: Path) -> Episode | None:
    if not path.is_file():
        return None
    try:
        verdict = Cassette.load(path).verdict
        return Episode.from_dict(verdict) if verdict is not None else None
    except (InvalidInput, TypeError, ValueError):
        return None  # a reference that does not read is not shown, rather than guessed


def references(scenarios: Iterable[str]) -> list[Reference]:
    """noop's and the oracle's figures over ``scenarios`` (each once), for each reference that
    has at least one of them; empty outside a checkout."""
    ids = list(dict.fromkeys(scenarios))
    out = []
    for name, folder in REFERENCES:
        eps = [ep for ep in (reference_episode(name, s) for s in ids) if ep is not None]
        if eps:
            out.append(Reference(name, folder, len(eps), summarize(eps).overall))
    return out


def reference_text(refs: Sequence[Reference], asked: int) -> str:
    """One line for the terminal and the docs: each reference's repair score, pass@1 and mean
    score, and over how many of the ``asked`` scenarios."""
    if not refs:
        return "reference: no committed noop or oracle recordings here (not a checkout)"
    parts = []
    for r in refs:
        s = r.summary
        repair = "-" if s.mean_repair is None else f"{s.mean_repair:.2f}"
        score = "-" if s.mean_score is None else f"{s.mean_score:.2f}"
        pass1 = "-" if s.pass_at_1 is None else f"{s.pass_at_1:.2f}"
        cover = "" if r.scenarios == asked else f" (on {r.scenarios} of the {asked} scenarios)"
        parts.append(f"{r.name} repair {repair}, pass@1 {pass1}, mean score {score}{cover}")
    return "reference, the committed runs over the same scenarios: " + "; ".join(parts)
