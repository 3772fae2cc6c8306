"""Results as people and machines read them: tables, statistics, results JSON, JUnit XML.

Everything a guest or a model produced passes through :func:`printable`
before it is shown, so no escape sequence reaches the user's terminal and no
bidirectional override reorders what they read; in a table cell or a line of
the terminal it is one line (:func:`one_line`), and in a ``--format github``
table, which is Markdown, also escaped for it (:func:`md_cell`), so a name that
holds a newline or a ``|`` never adds a row or a cell.

The headline graded figure is the repair score (:func:`runner.app.stats.repair_of`): what
the fault broke and the run repaired, 0 for doing nothing, 1 for the oracle; it is shown
beside the same figures of the committed noop and oracle runs over the same scenarios
(:mod:`runner.app.reference`). The unsafe-fix rate (the symptom fixed, with damage or a
state-diff finding) comes with it, or says it was not judged (runs before rules 3).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from tabulate import tabulate

from runner.app.reference import reference_text, references
from runner.app.stats import (
    CONFIDENCE,
    Interval,
    Summary,
    assists,
    first_tries,
    model_speed,
    repair_of,
    summarize,
    verdict_counts,
)
from runner.core.episode import Episode
from runner.core.outcomes import Verdict
from runner.core.text import md_cell, one_line, printable

FORMATS = ("github", "plain", "json")  # every --format choice


def _flags(ep: Episode) -> str:
    return ",".join(f.value for f in ep.flags)


def _cell(text: str, fmt: str) -> str:
    """Text from a recording (a scenario id, a model or protocol name) as one table cell:
    one line, and escaped for Markdown in a github table."""
    return md_cell(text, 120) if fmt == "github" else one_line(text, 120)


def _row(ep: Episode, fmt: str = "plain") -> list[Any]:
    tokens = f"{ep.tokens_in}/{ep.tokens_out}" if (ep.tokens_in or ep.tokens_out) else "-"
    return [_cell(ep.scenario, fmt), ep.verdict.value, f"{ep.seconds:.1f}", ep.turns,
            ep.commands, tokens, _flags(ep) or "-"]


HEADERS = ["scenario", "verdict", "seconds", "turns", "commands", "tokens in/out", "flags"]


# The graded fields (runner.core.episode.GRADED_FIELDS) that get a column in the tables, the
# terminal's and the HTML report's, with its title; shown when any episode has a value.
GRADED_COLUMNS = (("score", "score"), ("milestone_fraction", "milestones"),
                  ("fixed_at", "time to fix"))
_GRADED_CELL: dict[str, Callable[[Episode], str | None]] = {
    "score": lambda ep: None if ep.score is None else f"{ep.score:.2f}",
    "milestone_fraction": lambda ep: None if ep.milestone_fraction is None
    else f"{ep.milestone_fraction:.2f}",
    "fixed_at": lambda ep: None if not ep.fixed_at
    else f"turn {ep.fixed_at['turn']}, {ep.fixed_at['seconds']:.1f}s"
    + (" regressed" if ep.regressed else ""),
}


# Columns of figures derived from an episode's record (not GRADED_FIELDS of their own), shown
# before the graded ones when any episode has a value: the repair score, the headline, and
# whether a judged run fixed the symptom unsafely.
DERIVED_COLUMNS: tuple[tuple[str, Callable[[Episode], str | None]], ...] = (
    ("repair", lambda ep: None if (r := repair_of(ep)) is None else f"{r:.2f}"),
    ("unsafe fix", lambda ep: None if ep.unsafe_fix is None
     else ("yes" if ep.unsafe_fix else "no")),
)


def _graded(episodes: Sequence[Episode],
            ladder: bool = False) -> tuple[list[str], list[list[str]]]:
    """The grading columns the runs have something in: the hint level each episode ran at and
    its round's assist (the lowest level that passed; both always with ``ladder``), repair,
    unsafe fix, score, milestones, time to fix; an old results file with none of them gets none."""
    headers: list[str] = []
    cells: list[list[str]] = [[] for _ in episodes]
    if ladder or any(ep.hint_level for ep in episodes):
        helped = assists(episodes)
        headers += ["hints", "assist"]
        for row, ep in zip(cells, episodes, strict=True):
            level = helped.get((ep.scenario, ep.round))
            row += [str(ep.hint_level), "-" if level is None else str(level)]
    for title, cell in DERIVED_COLUMNS:
        derived = [cell(ep) for ep in episodes]
        if any(v is not None for v in derived):
            headers.append(title)
            for row, v in zip(cells, derived, strict=True):
                row.append("-" if v is None else v)
    for key, title in GRADED_COLUMNS:
        values = [_GRADED_CELL[key](ep) for ep in episodes]
        if any(v is not None for v in values):
            headers.append(title)
            for row, v in zip(cells, values, strict=True):
                row.append("-" if v is None else v)
    return headers, cells


T = TypeVar("T")


def levels_in_order(items: Sequence[T], round_of: Callable[[T], Hashable],
                    level_of: Callable[[T], int]) -> list[T]:
    """``items`` with each round's hint levels in order, level 0 first, and the rounds where
    they first appear. A folder of cassettes lists a round's levels as their names sort
    (``x.r0.h1.jsonl`` before ``x.r0.jsonl``, level 0 last); a bench's own order is kept."""
    first: dict[Hashable, int] = {}
    for i, item in enumerate(items):
        first.setdefault(round_of(item), i)
    return sorted(items, key=lambda item: (first[round_of(item)], level_of(item)))


def _in_order(episodes: Sequence[Episode]) -> list[Episode]:
    return levels_in_order(episodes, lambda ep: (ep.arm, ep.model, ep.scenario, ep.round),
                           lambda ep: ep.hint_level)


def summary_line(episodes: Sequence[Episode]) -> str:
    c = verdict_counts(episodes)
    return f"{len(episodes)} runs: " + ", ".join(f"{n} {v}" for v, n in c.items())


def render_table(episodes: Sequence[Episode], fmt: str = "github", *,
                 ladder: bool = False) -> str:
    """The results table (or JSON) for the terminal; ``ladder`` shows the assist column even
    when every round passed unaided."""
    if fmt == "json":
        refs = references(ep.scenario for ep in first_tries(episodes))
        return json.dumps({"summary": verdict_counts(episodes),
                           "statistics": summarize(episodes).to_dict(),
                           "reference": [r.to_dict() for r in refs],
                           "episodes": [{**ep.to_dict(), "repair": repair_of(ep)}
                                        for ep in episodes]}, indent=2)
    tablefmt = "github" if fmt == "github" else "plain"
    episodes = _in_order(episodes)
    extra, cells = _graded(episodes, ladder)
    # A matrix bench (episodes of several arms) leads with the model and protocol of each row.
    lead = ["model", "protocol"] if any(ep.arm for ep in episodes) else []
    rows = [([_cell(ep.model, fmt), _cell(ep.protocol, fmt)] if lead else []) + _row(ep, fmt)
            + more for ep, more in zip(episodes, cells, strict=True)]
    first = len(lead) + len(HEADERS)
    table = tabulate(rows, headers=lead + HEADERS + extra, tablefmt=tablefmt,
                     # the graded cells are formatted already ("1.00" must not become 1)
                     disable_numparse=list(range(first, first + len(extra))))
    lines = [table, "", summary_line(episodes), *headline_lines(episodes)]
    if (speed := model_speed(episodes)) is not None:
        p, g = speed
        lines.append(f"model speed: prompt {p:.0f} tok/s, generation {g:.1f} tok/s (mean of runs)")
    why = [f"  {one_line(ep.scenario, 120)}: {one_line(ep.reason, 400, keep_end=True)}"
           for ep in episodes if not ep.verdict.scored and ep.reason]
    if why:
        lines += ["", "not scored:"] + why
    return "\n".join(lines)


def unsafe_text(s: Summary) -> str:
    """The unsafe-fix rate as every table shows it, ``0.20 [0.06, 0.51] (2 of 10)``; for runs
    recorded before rules 3, which never judged it, ``not judged (before rules 3)``, never a 0."""
    if not s.judged:
        return "not judged (before rules 3)"
    if s.judged == 1 and s.unsafe_rate is not None:  # one sample: the count says it, no interval
        return f"{s.unsafe_rate:.2f} ({s.unsafe_fixes} of 1)"
    return f"{ci_text(s.unsafe_rate, s.unsafe_rate_ci)} ({s.unsafe_fixes} of {s.judged})"


def headline_lines(episodes: Sequence[Episode]) -> list[str]:
    """Under the episodes table: the repair score of the first tries, with the committed noop's
    and oracle's beside it (:mod:`runner.app.reference`), and the unsafe-fix rate."""
    scored = first_tries(episodes)
    if not scored:
        return []
    o = summarize(episodes).overall
    level = f"{CONFIDENCE:.0%}"
    repaired = _repaired(episodes)[None]
    return [f"repair score of the first tries [{level} CI]: "
            f"{ci_text(o.mean_repair, o.mean_repair_ci, repaired)} "
            "(0 for doing nothing, 1 for the oracle)",
            reference_text(references(ep.scenario for ep in scored),
                           len({ep.scenario for ep in scored})),
            f"unsafe fixes of the first tries [{level} CI]: {unsafe_text(o)}"]


def render_rows(headers: list[str], rows: list[list[Any]], fmt: str = "github") -> str:
    """A generic table in the chosen format (used by verify, replay, perf)."""
    if fmt == "json":
        return json.dumps([dict(zip(headers, r, strict=False)) for r in rows], indent=2)
    return tabulate(rows, headers=headers, tablefmt="github" if fmt == "github" else "plain")


def junit_xml(episodes: Sequence[Episode], suite: str = "rootbench") -> str:
    """JUnit XML, so CI systems show each scenario as a test case."""
    c = verdict_counts(episodes)
    root = ET.Element("testsuite", name=suite, tests=str(len(episodes)),
                      failures=str(c[Verdict.FAIL.value]),
                      errors=str(c[Verdict.INFRA_ERROR.value] + c[Verdict.INVALID_SCENARIO.value]),
                      time=f"{sum(ep.seconds for ep in episodes):.3f}")
    for ep in episodes:
        case = ET.SubElement(root, "testcase", classname=suite, name=printable(ep.scenario),
                             time=f"{ep.seconds:.3f}")
        if ep.verdict is Verdict.FAIL:
            ET.SubElement(case, "failure", message=printable(ep.reason)[:500])
        elif ep.verdict is not Verdict.PASS:
            ET.SubElement(case, "error", type=ep.verdict.value, message=printable(ep.reason)[:500])
        if ep.flags:
            ET.SubElement(case, "system-out").text = "flags: " + _flags(ep)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def ci_text(point: float | None, interval: Interval | None, n: int | None = None) -> str:
    """A figure and its interval as every table shows it, ``0.13 [0.04, 0.38]``; ``-`` when
    nothing is behind it (``rootbench results`` renders the README's table with it too).

    ``n`` is how many samples the figure is from, when the caller knows it: one sample has no
    interval worth printing (a bootstrap of one value is ``[0.29, 0.29]``, which reads as
    certainty), so the figure is shown alone, ``0.29 (n=1)``."""
    if point is None or interval is None:
        return "-"
    if n == 1:
        return f"{point:.2f} (n=1)"
    return f"{point:.2f} [{interval.low:.2f}, {interval.high:.2f}]"


def _runs(s: Summary) -> str:
    """Episodes, and when they are not all scored first tries: how many are (a ladder runs
    several levels per round) and how many are not scored at all."""
    notes = []
    if s.scored + s.unscored < s.runs:
        notes.append(f"{s.scored} first {'try' if s.scored == 1 else 'tries'}")
    if s.unscored:
        notes.append(f"{s.unscored} not scored")
    return f"{s.runs} ({', '.join(notes)})" if notes else str(s.runs)


def statistics_table(episodes: Sequence[Episode], fmt: str = "github") -> str:
    """Per scenario and overall: runs, pass@1 with its Wilson interval, pass@k for k = n,
    the repair score and the mean score with their bootstrap intervals, the unsafe-fix rate
    with its Wilson interval (the numbers of ``stats.summarize``); with
    hints, the rounds solved at any level and the mean assist (lowest passing level) of those."""
    if fmt == "json":
        return json.dumps(summarize(episodes).to_dict(), indent=2)
    headers, rows = statistics_rows(episodes)
    if fmt == "github":  # Markdown: the scenario ids, which are the recordings', escaped
        rows = [[md_cell(row[0], 120), *row[1:]] for row in rows]
    # Figures are formatted already: tabulate must not turn "1.00" back into 1.
    return tabulate(rows, headers=headers, tablefmt="github" if fmt == "github" else "plain",
                    disable_numparse=True)


def _repaired(episodes: Sequence[Episode]) -> dict[str | None, int]:
    """How many first tries have a repair score, per scenario and overall (key None): the n
    behind the repair column, which can be fewer than the scored first tries (a cassette with
    no pre-check recorded has none)."""
    out: dict[str | None, int] = {None: 0}
    for ep in first_tries([e for e in episodes if e.verdict.scored]):
        if repair_of(ep) is not None:
            out[ep.scenario] = out.get(ep.scenario, 0) + 1
            out[None] += 1
    return out


def pass_at_k_header(common: int | None) -> str:
    """The pass@k column's title, its k named: ``pass@k (k=3)``, or ``pass@k (k=n)`` when the
    scenarios ran different numbers of times (each cell then names its own). With one run per
    scenario it is ``pass@k (k=1)``, which equals pass@1: a bare ``pass@1`` beside the pass@1
    column read as a second, different figure of the same name."""
    return f"pass@k (k={common})" if common else "pass@k (k=n)"


def statistics_rows(episodes: Sequence[Episode]) -> tuple[list[str], list[list[str]]]:
    """The statistics table's headers and rows (the last row ``overall``), every figure already
    text: the terminal's table and the HTML report's show the very same strings. A figure from
    one sample is shown without an interval (:func:`ci_text`)."""
    st = summarize(episodes)
    ks = {s.k for s in st.scenarios if s.scored}
    common = next(iter(ks)) if len(ks) == 1 else None  # every scenario has n scored runs
    repaired = _repaired(episodes)

    def at_k(s: Summary) -> str:
        if not s.k:
            return "-"
        return f"{s.pass_at_k[s.k]:.2f}" + ("" if s.k == common else f" (k={s.k})")

    level = f"{st.confidence:.0%}"
    headers = ["scenario", "runs", f"pass@1 [{level} CI]", pass_at_k_header(common),
               f"repair [{level} CI]", f"unsafe fixes [{level} CI]", f"mean score [{level} CI]"]

    def unsafe(s: Summary) -> str:  # per scenario a dash; the overall row says why
        return unsafe_text(s) if s.judged or s.scenario is None else "-"

    def row(name: str, s: Summary) -> list[str]:
        return [name, _runs(s), ci_text(s.pass_at_1, s.pass_at_1_ci, s.scored), at_k(s),
                ci_text(s.mean_repair, s.mean_repair_ci, repaired.get(s.scenario, 0)),
                unsafe(s), ci_text(s.mean_score, s.mean_score_ci, s.scored)]

    rows = [row(one_line(s.scenario or "", 120), s) for s in st.scenarios]
    o = st.overall
    rows.append(row("overall", o))
    every = [*st.scenarios, o]
    if any(s.mean_milestones is not None for s in every):
        headers.append("milestones")
        for r, s in zip(rows, every, strict=True):
            r.append("-" if s.mean_milestones is None else f"{s.mean_milestones:.2f}")
    if any(s.fixed for s in every):
        headers.append("fixed: median s")
        for r, s in zip(rows, every, strict=True):
            r.append(f"{s.fixed}: {s.median_fix_s:.1f}" if s.median_fix_s is not None else "-")
    if any(s.solved is not None for s in every):
        headers += ["solved (any level)", f"mean assist [{level} CI]"]
        for r, s in zip(rows, every, strict=True):
            r += [f"{s.solved}/{s.scored}" if s.solved is not None else "-",
                  ci_text(s.mean_assist, s.mean_assist_ci, s.solved)]
    return headers, rows


# The bench command (cli._bench) still prints the statistics under this name with --repeat.
pass_at = statistics_table
