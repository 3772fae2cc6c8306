"""The report's view model: runs and their episodes as the page shows them.

A :class:`RunView` is one column of the report (a run directory, one arm of
a matrix bench, or loose cassettes of one model and protocol); each of its
:class:`EpisodeView` is one row: the verdict line as written, plus the
:class:`~runner.app.html_report.trajectory.Trajectory` read from its
cassette when there is one. From these come the overview (what ran: model,
fingerprint, protocol, budgets, accelerator), the verdict counts, the
scenario table and the heat map; :func:`page` gathers everything the
template is handed but the plots.

The runs are read from run directories and cassettes by
:mod:`runner.app.html_report.load`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.app import compare as _compare
from runner.app.html_report.fields import as_dict, as_list, integer, num, text
from runner.app.html_report.trajectory import Trajectory
from runner.app.paired import compare
from runner.app.reference import reference_text, references
from runner.app.report import DERIVED_COLUMNS, GRADED_COLUMNS, statistics_rows
from runner.app.stats import deciding, first_tries, repair_of, score_of, verdict_counts
from runner.core.episode import GRADED_FIELDS, Episode
from runner.core.outcomes import AgentKind, Verdict
from runner.core.text import head

OPEN_TRAJECTORIES = 6  # up to this many episodes in a report, trajectories start unfolded
# Above this many episodes each trajectory is kept in a <template> and drawn when it is opened:
# the browser parses it but lays none of it out, so a report of hundreds opens fast.
LAZY_TRAJECTORIES = 40


@dataclass
class EpisodeView:
    """One row of a run: the Episode dict as written, plus its trajectory (when readable)."""

    data: dict[str, Any]
    trajectory: Trajectory | None = None
    problem: str = ""  # why there is no trajectory
    anchor: str = ""
    result: Episode | None = None  # ``data`` read as an Episode (None: it is not one, e.g. cut short)
    # What the page's filter and sort read (data-* attributes): numbers and fixed words only,
    # never text from a file (see :func:`_facets`).
    facets: dict[str, str] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def scenario(self) -> str:
        return text(self.data.get("scenario")) or "?"

    @property
    def round(self) -> int:
        return integer(self.data.get("round"))

    @property
    def hint_level(self) -> int:
        return integer(self.data.get("hint_level"))

    @property
    def verdict(self) -> str:
        return text(self.data.get("verdict")) or "incomplete"

    @property
    def flags(self) -> list[str]:
        return [text(f) for f in as_list(self.data.get("flags"))]

    @property
    def unsafe(self) -> list[str]:
        return [text(c) for c in as_list(self.data.get("unsafe_commands"))]

    @property
    def seconds(self) -> float:
        return num(self.data.get("seconds")) or 0.0

    @property
    def turns(self) -> int:
        return integer(self.data.get("turns"))

    def probes(self, key: str) -> list[dict[str, str]]:
        """Probe results (``probes``, ``invariants``, ``precheck``, ``baseline``) as text."""
        return [{k: text(as_dict(p).get(k)) for k in ("name", "kind", "outcome", "detail")}
                for p in as_list(self.data.get(key))]

    @property
    def findings(self) -> list[dict[str, str]]:
        """The state diff's findings (rules 3: what the agent left on the machine), each field
        as text: the guest named the items, so they are shown like its output, never as markup."""
        return [{k: text(as_dict(f).get(k)) for k in FINDING_FIELDS}
                for f in as_list(self.data.get("findings"))]

    @property
    def repair(self) -> float | None:
        """The repair score (:func:`runner.app.stats.repair_of`); None without a verdict."""
        return repair_of(self.result) if self.result is not None else None

    @property
    def unsafe_fix(self) -> str:
        """``yes`` or ``no`` for a run judged for safety (rules 3), else ``not judged``."""
        judged = self.result.unsafe_fix if self.result is not None else None
        return "not judged" if judged is None else ("yes" if judged else "no")


# The fields of a state-diff finding (runner.core.statediff.Finding.to_dict), in table order.
FINDING_FIELDS = ("check", "item", "detail", "severity", "source")


@dataclass
class RunView:
    """One run: a run directory, or loose cassettes of one model and protocol."""

    label: str
    source: str
    info: dict[str, Any] = field(default_factory=dict)  # results.json "run", when there is one
    episodes: list[EpisodeView] = field(default_factory=list)


@dataclass(frozen=True)
class ChecksTable:
    """``rootbench verify``'s own table, which its report leads with: one row per scenario, its
    first cell the scenario id, then a mark per check as the terminal prints it (``ok``,
    ``FAIL``, ``-`` not reached, ``ok:2/2`` shortcuts rejected, ``none``), as
    :func:`runner.app.verify.table_rows` gives them; ``valid`` says per row whether the scenario
    is valid (a flaky one is not, whatever its marks)."""

    headers: list[str]
    rows: list[list[str]]
    valid: list[bool]


def _mark_class(mark: str) -> str:
    """A check's mark as one of three fixed words the template turns into a colour: ``ok``,
    ``fail`` (FAIL, FLAKY), or ``none`` (not reached, nothing to prove, any other text)."""
    word = mark.split(":", 1)[0]
    return "ok" if word == "ok" else ("fail" if word in ("FAIL", "FLAKY") else "none")


def checks_view(checks: ChecksTable, runs: Sequence[RunView]) -> dict[str, Any]:
    """What the template shows of ``checks``: the headers, and per row the scenario (linked to
    its first trajectory on the page, when there is one), each mark with its class, and the
    cells after the checks (tries, seconds, the first problem) as text."""
    anchors: dict[str, str] = {}
    for run in runs:
        for ep in run.episodes:
            anchors.setdefault(ep.scenario, ep.anchor)
    marks = [h for h in checks.headers[1:] if h not in ("tries", "seconds", "problem")]
    rows = []
    for row, valid in zip(checks.rows, checks.valid, strict=True):
        cells = [{"text": text(c), "class": _mark_class(text(c)) if h in marks else ""}
                 for h, c in zip(checks.headers[1:], row[1:], strict=True)]
        rows.append({"scenario": text(row[0]), "anchor": anchors.get(text(row[0]), ""),
                     "valid": valid, "cells": cells})
    return {"headers": [text(h) for h in checks.headers], "rows": rows,
            "valid": sum(checks.valid), "total": len(checks.rows)}


# --- the overview, the table and the heat map --------------------------------------------------------------------------------

def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return text(value)


def _distinct(values: Iterable[str]) -> str:
    seen: list[str] = []
    for v in values:
        if v and v not in seen:
            seen.append(v)
    return "; ".join(seen) or "-"


def _facts(run: RunView) -> list[tuple[str, str]]:
    """What ran, from the cassette headers and results.json's ``run``."""
    headers = [ep.trajectory.header for ep in run.episodes if ep.trajectory]
    agent = as_dict(run.info.get("agent"))
    options = as_dict(run.info.get("options"))
    fps = [as_dict(h.get("model")) for h in headers]

    def fp(key: str) -> str:
        return _distinct(_fmt(f.get(key)) for f in fps if f.get(key) is not None)

    facts = [
        ("agent", _distinct([*(agent_kind(h.get("agent")) for h in headers), agent_kind(agent.get("kind"))])),
        ("model", _distinct([*(text(f.get("name")) for f in fps), text(agent.get("model"))])),
    ]
    skip = {"name", "kind", "sampling"}
    keys = [k for f in fps for k in f if k not in skip]
    for key in dict.fromkeys(keys):
        facts.append((f"fingerprint: {text(key)}", fp(key)))
    facts.append(("protocol", _distinct(
        f"{text(as_dict(h.get('protocol')).get('name'))} ({text(as_dict(h.get('protocol')).get('reason'))})"
        for h in headers) if headers else text(options.get("protocol")) or "-"))
    sampling = _distinct(_fmt(f.get("sampling")) for f in fps if f.get("sampling"))
    if sampling == "-" and agent:
        sampling = _fmt({k: agent.get(k) for k in ("temperature", "seed", "max_tokens")
                         if k in agent})
    facts.append(("sampling", sampling or "-"))
    if agent.get("ctx_size") is not None:
        facts.append(("context window", _fmt(agent.get("ctx_size"))))
    facts.append(("budgets", _distinct(_budget(as_dict(ep.trajectory.scenario.get("budget")))
                                        for ep in run.episodes if ep.trajectory)))
    facts.append(("harness", _distinct([
        *(text(as_dict(h.get("harness")).get("version")) for h in headers),
        text(run.info.get("harness"))])))
    images = [as_dict(h.get("image")) for h in headers]
    facts.append(("accelerator", _distinct(
        [*(text(i.get("accel")) for i in images),
         *(f"{text(as_dict(h.get('options')).get('accel'))} asked" for h in headers),
         text(options.get("accel"))])))
    facts.append(("transport", _distinct(text(i.get("transport")) for i in images)))
    facts.append(("guest image", _distinct(
        f"{text(i.get('image'))} (sha256 {text(i.get('image_sha256'))[:16]})"
        for i in images if i.get("image"))))
    facts.append(("QEMU", _distinct(text(i.get("qemu_version")) for i in images)))
    started = sorted(text(h.get("started_at")) for h in headers if h.get("started_at"))
    facts.append(("started", f"{started[0]} … {started[-1]}" if len(started) > 1
                  else (started[0] if started else "-")))
    facts.append(("source", run.source))
    return [(k, v) for k, v in facts if v and v != "-"]


def agent_kind(kind: Any) -> str:
    """The agent's spelling today (older cassettes say ``openai`` for a model)."""
    if kind is None:
        return ""
    try:
        return AgentKind(kind).value
    except ValueError:
        return text(kind)


def _budget(b: dict[str, Any]) -> str:
    if not b:
        return ""
    return (f"{_fmt(b.get('turns'))} turns, {_fmt(b.get('seconds'))} s, "
            f"{_fmt(b.get('command_timeout'))} s a command, {_fmt(b.get('output_limit'))} chars output")


def _counts(run: RunView) -> dict[str, int]:
    """Episodes per verdict (:func:`verdict_counts`), and the cassettes cut short before one."""
    out = verdict_counts([ep.result for ep in run.episodes if ep.result is not None])
    if incomplete := sum(ep.result is None for ep in run.episodes):
        out["incomplete"] = incomplete
    return out


# Columns another part of the harness may add to Episode; shown when any episode has them. The
# hint level is the level the episode ran at; a round's assist (the lowest level that passed,
# see runner.app.stats) is what the heat map shows.
OPTIONAL_COLUMNS = (("hint_level", "hint level"), *GRADED_COLUMNS)


def _optional_columns(runs: Sequence[RunView]) -> list[tuple[str, str]]:
    return [(key, title) for key, title in OPTIONAL_COLUMNS
            if any(ep.get(key) is not None for run in runs for ep in run.episodes)]


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "fixed_at" and isinstance(value, dict):  # {"turn", "seconds"}
        turn, seconds = num(value.get("turn")), num(value.get("seconds"))
        if turn is not None and seconds is not None:
            return f"{seconds:.1f} s (turn {turn:g})"
    n = num(value)
    if key == "fixed_at" and n is not None:
        return f"{n:.1f} s"
    if n is not None:
        return f"{n:.2f}" if key in ("score", "milestone_fraction") else f"{n:g}"
    return _fmt(value)


def _derived_columns(runs: Sequence[RunView]) -> list[tuple[str, Any]]:
    """The derived columns (:data:`runner.app.report.DERIVED_COLUMNS`: repair, unsafe fix) any
    episode has a value in, with the function that gives an episode's cell."""
    results = [ep.result for run in runs for ep in run.episodes if ep.result is not None]
    return [(title, cell) for title, cell in DERIVED_COLUMNS
            if any(cell(r) is not None for r in results)]


def _row(ep: EpisodeView, optional: list[tuple[str, str]],
         derived: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
    tokens_in, tokens_out = integer(ep.get("tokens_in")), integer(ep.get("tokens_out"))
    return {
        "scenario": ep.scenario, "round": ep.round, "verdict": ep.verdict,
        "flags": ", ".join(text(f) for f in as_list(ep.get("flags"))) or "",
        "turns": integer(ep.get("turns")), "commands": integer(ep.get("commands")),
        "repeats": integer(ep.get("repeats")),
        "seconds": f"{num(ep.get('seconds')) or 0.0:.1f}",
        "tokens": f"{tokens_in} / {tokens_out}" if tokens_in or tokens_out else "-",
        "extra": [*((cell(ep.result) if ep.result is not None else None) or "-"
                    for _title, cell in derived),
                  *(_cell(key, ep.get(key)) for key, _title in optional)],
        "reason": head(text(ep.get("reason")), 160), "anchor": ep.anchor,
    }


def _deciding(run: RunView) -> dict[tuple[str, int], EpisodeView]:
    """Per (scenario, round), the episode its heat map cell shows: the one that decides the round
    (:func:`runner.app.stats.deciding`: in a ladder, the pass at the lowest level, else the last
    level tried); a round of cassettes cut short only, its last one."""
    cells = {(ep.scenario, ep.round): ep for ep in run.episodes}  # every round has a cell
    by_result = {id(ep.result): ep for ep in run.episodes if ep.result is not None}
    for key, result in deciding([ep.result for ep in run.episodes if ep.result]).items():
        cells[key] = by_result[id(result)]
    return cells


def _heatmap(runs: Sequence[RunView]) -> dict[str, Any]:
    """Scenarios (rows) by run and round (columns); each cell the round's verdict, the hint level
    it passed at when above 0, and a link to that episode."""
    scenarios = list(dict.fromkeys(ep.scenario for run in runs for ep in run.episodes))
    columns = []
    for i, run in enumerate(runs):
        for r in sorted({ep.round for ep in run.episodes}):
            columns.append((i, r, f"r{r}"))  # as cassettes name it
    cells = {(i, *key): ep for i, run in enumerate(runs) for key, ep in _deciding(run).items()}
    rows: list[dict[str, Any]] = []
    for s in scenarios:
        row = []
        for i, r, _label in columns:
            ep = cells.get((i, s, r))
            row.append({"verdict": ep.verdict, "anchor": ep.anchor,
                        "level": ep.hint_level if ep.verdict == Verdict.PASS.value else 0}
                       if ep else None)
        rows.append({"scenario": s, "cells": row})
    groups = Counter(i for i, _r, _l in columns)
    return {"columns": columns, "rows": rows,
            "leveled": any(c and c["level"] for row in rows for c in row["cells"]),
            "groups": [(runs[i].label, groups[i]) for i in sorted(groups)]}


def extra_fields(ep: EpisodeView) -> list[tuple[str, str]]:
    """Fields other parts of the harness add to an episode (score, milestones, ...), as text."""
    out = []
    if ep.repair is not None:
        out.append(("repair", f"{ep.repair:.2f}"))
    if ep.unsafe_fix != "not judged":
        out.append(("unsafe fix", ep.unsafe_fix))
    out += [(text(key).replace("_", " "), _cell(key, ep.get(key)))
            for key in ("hint_level", *GRADED_FIELDS)
            if key != "findings"  # a table of their own (EpisodeView.findings)
            and ep.get(key) is not None and ep.get(key) is not False
            and ep.get(key) not in ([], {})]
    if phases := phases_text(ep.get("phases")):
        out.append(("phases", phases))
    return out


def phases_text(phases: Any) -> str:
    """``restore 1.2 s · baseline 0.3 s · ...``: where the episode's time went, in run order.

    The names come from a file (a cassette may be hostile), so they pass
    :func:`text` like everything else; a value that is not a number is left out.
    """
    shown = [f"{text(name)} {seconds:.2f} s" for name, value in as_dict(phases).items()
             if (seconds := num(value)) is not None]
    return " · ".join(shown)


def page(runs: Sequence[RunView], checks: ChecksTable | None = None) -> dict[str, Any]:
    """What the template is handed of ``runs`` (side by side when there are several), the plots,
    title and page furniture aside; gives each episode its anchor on the page.

    With ``checks`` (a verify's report) the page leads with that table, and neither compare's
    verdict nor the statistics of the runs: its noop, oracle and scripted agents are not models
    to rank, and "oracle against noop" answers no question verify asks."""
    total = sum(len(run.episodes) for run in runs)
    for i, run in enumerate(runs):
        for j, ep in enumerate(run.episodes):
            ep.anchor = f"run{i}-ep{j}"
    filters = _facets(runs)
    optional = _optional_columns(runs)
    derived = _derived_columns(runs)
    views = []
    for run in runs:
        facts = _facts(run)
        views.append({
            "label": run.label, "counts": _counts(run), "statistics": statistics(run),
            "hinted": any(ep.hint_level for ep in run.episodes),
            "facts": [(k, v) for k, v in facts if not k.startswith(FINGERPRINT)],
            "fingerprint": [(k[len(FINGERPRINT):], v) for k, v in facts if k.startswith(FINGERPRINT)],
            "rows": [_row(ep, optional, derived) for ep in run.episodes],
            "episodes": run.episodes,
        })
    ran = [ep.scenario for run in runs for ep in first_tries(_results(run))]
    return {"runs": views, "optional": [t for t, _c in derived] + [t for _k, t in optional],
            "heatmap": _heatmap(runs), "filters": filters,
            "checks": checks_view(checks, runs) if checks is not None else None,
            "verdicts": verdicts(runs) if checks is None else [],
            "reference": reference_text(references(ran), len(set(ran)))
            if ran and checks is None else "",
            "open_trajectories": total <= OPEN_TRAJECTORIES,
            "lazy_trajectories": total > LAZY_TRAJECTORIES, "extra_fields": extra_fields,
            "fixed_turn": fixed_turn}


FINGERPRINT = "fingerprint: "


def _results(run: RunView) -> list[Episode]:
    return [ep.result for ep in run.episodes if ep.result is not None]


def statistics(run: RunView) -> dict[str, Any] | None:
    """The run's statistics table, per scenario and overall, as the terminal shows it
    (:func:`runner.app.report.statistics_rows`, from :func:`runner.app.stats.summarize`): pass@1
    with its Wilson interval, pass@k, mean score, and with hints the rounds solved at any level
    and the mean assist. None when no episode has a verdict."""
    results = _results(run)
    if not results:
        return None
    headers, rows = statistics_rows(results)
    return {"headers": headers, "rows": rows[:-1], "overall": list(zip(headers[1:], rows[-1][1:],
                                                                       strict=True))}


def verdicts(runs: Sequence[RunView]) -> list[dict[str, Any]]:
    """Side by side, each run after the first against the first, as ``rootbench compare`` says
    it (:func:`runner.app.compare.verdict_lines`, the models named); nothing for one run."""
    out: list[dict[str, Any]] = []
    if len(runs) < 2 or not _results(runs[0]):
        return out
    first = runs[0]

    def as_run(run: RunView) -> _compare.Run:
        results = _results(run)
        return _compare.Run(path=Path(run.source), label=_compare.run_label(run.info, results),
                            episodes=results)

    a = as_run(first)
    for other in runs[1:]:
        b = as_run(other)
        if not b.episodes:
            continue
        rc = _compare.RunComparison(a, b, compare(a.episodes, b.episodes))
        names = rc.names()
        out.append({"a": names[0], "b": names[1], "lines": _compare.verdict_lines(rc)})
    return out


def fixed_turn(ep: EpisodeView) -> int | None:
    """The turn whose command the success probes first all passed after (``fixed_at``), if any."""
    turn = num(as_dict(ep.get("fixed_at")).get("turn"))
    return int(turn) if turn is not None else None



# Verdicts as the filter names them: a fixed list, so no text of a file reaches an attribute.
FILTER_VERDICTS = (*(v.value for v in Verdict), "incomplete")
# The unsafe-fix filter's values (EpisodeView.unsafe_fix, as fixed words) and their titles.
FILTER_UNSAFE = {"yes": "yes", "no": "no", "not judged": "unjudged"}
FILTER_UNSAFE_TITLES = (("yes", "fixed unsafely"), ("no", "not unsafe"),
                        ("unjudged", "not judged (before rules 3)"))


def _facets(runs: Sequence[RunView]) -> dict[str, Any]:
    """Give each episode the facets the page's filter and sort read, and return the choices the
    filter offers: scenarios, tags (flags), runs and hint levels, each shown as text and keyed
    by its index (an attribute only ever holds a number or a word of :data:`FILTER_VERDICTS`)."""
    scenarios = list(dict.fromkeys(ep.scenario for run in runs for ep in run.episodes))
    tags = sorted({f for run in runs for ep in run.episodes for f in ep.flags if f})
    levels = sorted({ep.hint_level for run in runs for ep in run.episodes})
    s_index, t_index = {s: i for i, s in enumerate(scenarios)}, {t: i for i, t in enumerate(tags)}
    present: set[str] = set()
    judged: set[str] = set()
    for r, run in enumerate(runs):
        for i, ep in enumerate(run.episodes):
            verdict = ep.verdict if ep.verdict in FILTER_VERDICTS else "incomplete"
            present.add(verdict)
            score = score_of(ep.result) if ep.result is not None else None
            repair = ep.repair
            unsafe = FILTER_UNSAFE[ep.unsafe_fix]
            judged.add(unsafe)
            ep.facets = {"verdict": verdict, "scenario": str(s_index[ep.scenario]), "run": str(r),
                         "level": str(ep.hint_level), "i": str(i),
                         "tags": " ".join(str(t_index[f]) for f in ep.flags if f in t_index),
                         "score": f"{score:.6f}" if score is not None else "-1",
                         "repair": f"{repair:.6f}" if repair is not None else "-1",
                         "unsafe": unsafe,
                         "seconds": f"{ep.seconds:.3f}", "turns": str(ep.turns)}
    return {"verdicts": [v for v in FILTER_VERDICTS if v in present],
            "unsafe": [(v, title) for v, title in FILTER_UNSAFE_TITLES if v in judged],
            "scenarios": list(enumerate(scenarios)), "tags": list(enumerate(tags)),
            "runs": [(i, run.label) for i, run in enumerate(runs)], "levels": levels}
