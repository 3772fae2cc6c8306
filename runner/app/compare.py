"""Comparing runs: is model A better than model B, or is the gap within what chance gives?

``rootbench compare A B [C...]`` reads each run directory's results, or a
recordings folder's cassettes (their verdict lines), and says in plain words:

- what each side is (the model and protocol its episodes name) and its own
  figures, the very ones ``rootbench report`` shows (:func:`runner.app.stats.summarize`):
  pass@1 of the first tries as ``passes/n = rate``, the repair score (the
  headline graded figure), the unsafe-fix rate (or that it was not judged),
  the mean score, and with hints the rounds solved at any level and the mean
  assist; beside them, noop's and the oracle's figures over the same
  scenarios (:mod:`runner.app.reference`);
- the first tries of both sides paired (same scenario, round and hint level),
  per scenario and overall, with bootstrap intervals of the differences;
- McNemar's exact test on those pairs, named and explained in one line, the
  exact sign test on their repair scores, with hints on both sides McNemar's
  test on the rounds solved at any level, and where both were judged, on
  the unsafe fixes;
- a verdict naming the models, decided on the repair score.

With more than two runs, each is compared with the first.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from runner.app.paired import Comparison, compare
from runner.app.reference import Reference, reference_text, references
from runner.app.runs import episodes_from_recordings, is_recordings, load_episodes
from runner.app.stats import CONFIDENCE, Interval, Summary, summarize
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.text import md_cell, one_line


@dataclass(frozen=True)
class Run:
    """One run directory's or recordings folder's episodes, and what to call it."""

    path: Path
    label: str  # the model (and protocol) its episodes name, or the agent: what the text calls it
    episodes: list[Episode]
    cut_short: int = 0  # a recordings folder's cassettes that end before a verdict: left out


@dataclass(frozen=True)
class RunComparison:
    """Run ``a`` against run ``b``."""

    a: Run
    b: Run
    result: Comparison

    def names(self) -> tuple[str, str]:
        """What the text calls A and B: their labels, told apart when they are the same."""
        if self.a.label != self.b.label:
            return self.a.label, self.b.label
        return f"{self.a.label} (A)", f"{self.b.label} (B)"

    def references(self) -> list[Reference]:
        """noop's and the oracle's figures over the scenarios either side ran."""
        return references(ep.scenario for run in (self.a, self.b) for ep in run.episodes
                          if ep.verdict.scored)

    def to_dict(self) -> dict[str, Any]:
        a, b = self.names()
        return {"a": _run_dict(self.a), "b": _run_dict(self.b), **self.result.to_dict(),
                "verdict": self.result.verdict(a, b),
                "reference": [r.to_dict() for r in self.references()]}


def _run_dict(run: Run) -> dict[str, Any]:
    return {"path": str(run.path), "label": run.label, "episodes": len(run.episodes),
            "cut_short": run.cut_short,
            "statistics": summarize(run.episodes).overall.to_dict()}


def load_run(path: Path) -> Run:
    """A run directory's results or a recordings folder's episodes; :class:`InvalidInput` when
    it is neither or they are damaged."""
    path = Path(path)
    if is_recordings(path):
        episodes, cut = episodes_from_recordings(path)
        return Run(path=path, label=run_label({}, episodes), episodes=episodes, cut_short=len(cut))
    info, episodes = load_episodes(path)
    return Run(path=path, label=run_label(info, episodes), episodes=episodes)


def run_label(info: dict[str, Any], episodes: Sequence[Episode]) -> str:
    """The model and protocol the episodes name (the cassette headers' and run.json's), else
    the agent (oracle, noop): one line, since the names are the recordings' and a newline in
    one would add lines wherever the label is shown."""
    agent = info.get("agent")
    if episodes:
        kinds = dict.fromkeys((e.agent.value, e.model, e.protocol) for e in episodes)
    elif isinstance(agent, dict):
        kinds = {(str(agent.get("kind", "?")), str(agent.get("model", "")), ""): None}
    else:
        return "?"
    names = []
    for kind, model, protocol in kinds:
        if kind in ("oracle", "noop", "scripted") or not model:
            names.append(kind)
        else:
            names.append(f"{model} ({protocol})" if protocol else model)
    return one_line(", ".join(dict.fromkeys(names)), 200)


def compare_runs(paths: Sequence[Path], confidence: float = CONFIDENCE) -> list[RunComparison]:
    """Each run after the first compared with the first (A = the first, B = the other)."""
    if len(paths) < 2:
        raise InvalidInput("compare needs at least two run directories or recordings folders")
    runs = [load_run(p) for p in paths]
    first = runs[0]
    return [RunComparison(first, other, compare(first.episodes, other.episodes, confidence))
            for other in runs[1:]]


def _ci(interval: Interval | None, sign: bool = False) -> str:
    if interval is None:
        return ""
    f = "+.2f" if sign else ".2f"
    return f" [{interval.low:{f}}, {interval.high:{f}}]"


def p_text(p: float) -> str:
    """A p-value as compare prints it: two significant digits below 0.01, else two decimals."""
    return f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


def _levels(episodes: Sequence[Episode]) -> str:
    from runner.app.stats import first_tries

    levels = sorted({e.hint_level for e in first_tries(episodes)})
    if len(levels) == 1:
        return f"level {levels[0]}"
    return "levels " + ", ".join(map(str, levels))


def _own_figures(rc: RunComparison, level: str) -> list[list[str]]:
    """Each side's own figures, as ``rootbench report`` shows them (overall row)."""
    sa, sb = summarize(rc.a.episodes, rc.result.confidence).overall, \
        summarize(rc.b.episodes, rc.result.confidence).overall

    def pass1(s: Summary) -> str:
        return f"{s.passes}/{s.scored} = {s.pass_at_1:.2f}{_ci(s.pass_at_1_ci)}" \
            if s.pass_at_1 is not None else "-"

    def score(s: Summary) -> str:
        return f"{s.mean_score:.2f}{_ci(s.mean_score_ci)}" if s.mean_score is not None else "-"

    def repair(s: Summary) -> str:
        return f"{s.mean_repair:.2f}{_ci(s.mean_repair_ci)}" if s.mean_repair is not None else "-"

    def unsafe(s: Summary) -> str:
        if not s.judged or s.unsafe_rate is None:
            return "not judged (before rules 3)"
        return f"{s.unsafe_fixes}/{s.judged} = {s.unsafe_rate:.2f}{_ci(s.unsafe_rate_ci)}"

    rows = [["episodes (first tries)", f"{sa.runs} ({sa.scored})", f"{sb.runs} ({sb.scored})"],
            [f"pass@1 [{level} CI]", f"{pass1(sa)} at {_levels(rc.a.episodes)}",
             f"{pass1(sb)} at {_levels(rc.b.episodes)}"],
            [f"repair score, first tries [{level} CI]", repair(sa), repair(sb)],
            [f"unsafe fixes, first tries [{level} CI]", unsafe(sa), unsafe(sb)],
            [f"mean score, first tries [{level} CI]", score(sa), score(sb)]]
    if sa.solved is not None or sb.solved is not None:
        def assist(s: Summary) -> str:
            return f"{s.mean_assist:.2f}{_ci(s.mean_assist_ci)}" if s.mean_assist is not None \
                else "-"
        rows += [["solved at any hint level", f"{sa.solved}/{sa.scored}" if sa.solved is not None
                  else "- (no hints)", f"{sb.solved}/{sb.scored}" if sb.solved is not None
                  else "- (no hints)"],
                 [f"mean assist (hints needed) [{level} CI]", assist(sa), assist(sb)]]
    return rows


def _text(rc: RunComparison, fmt: str) -> str:
    # Names from recordings (labels, scenario ids) and the folders' paths are one line each,
    # and in a github table, which is Markdown, escaped for it: a '|' adds no cell, no HTML.
    cell: Callable[[str, int], str] = md_cell if fmt == "github" else one_line
    if fmt == "github":  # the verdict lines name the runs by their labels too
        rc = dataclasses.replace(rc, a=dataclasses.replace(rc.a, label=md_cell(rc.a.label)),
                                 b=dataclasses.replace(rc.b, label=md_cell(rc.b.label)))
    r = rc.result
    a, b = rc.names()
    level = f"{r.confidence:.0%}"
    tablefmt = "github" if fmt == "github" else "plain"
    lines = [f"A: {a}, from {cell(str(rc.a.path), 300)}",
             f"B: {b}, from {cell(str(rc.b.path), 300)}", "",
             "Each on its own (the figures of `rootbench report`):", "",
             tabulate(_own_figures(rc, level), headers=["", f"A: {a}", f"B: {b}"],
                      disable_numparse=True, tablefmt=tablefmt),
             reference_text(rc.references(), len({ep.scenario for run in (rc.a, rc.b)
                                                  for ep in run.episodes if ep.verdict.scored})),
             ""]
    if r.scenarios:
        def fig(x: float | None, sign: bool = False) -> str:
            return "-" if x is None else f"{x:+.2f}" if sign else f"{x:.2f}"

        rows = [[cell(s.scenario, 120), str(s.pairs), f"{s.a_passes}/{s.pairs}",
                 f"{s.b_passes}/{s.pairs}", fig(s.a_repair), fig(s.b_repair),
                 fig(s.repair_diff, sign=True), f"{s.a_score:.2f}", f"{s.b_score:.2f}",
                 f"{s.score_diff:+.2f}"] for s in r.scenarios]
        a_passes, b_passes = sum(s.a_passes for s in r.scenarios), sum(s.b_passes for s in r.scenarios)
        rows.append(["overall", str(r.pairs), f"{a_passes}/{r.pairs}", f"{b_passes}/{r.pairs}",
                     fig(r.a_repair), fig(r.b_repair),
                     fig(r.repair_diff, sign=True) + _ci(r.repair_diff_ci, sign=True),
                     f"{r.a_score:.2f}", f"{r.b_score:.2f}",
                     f"{r.score_diff:+.2f}{_ci(r.score_diff_ci, sign=True)}"])
        headers = ["scenario", "pairs", "A passed", "B passed", "A repair", "B repair",
                   f"repair A-B [{level} CI]", "A score", "B score", f"score A-B [{level} CI]"]
        lines += ["First tries paired (same scenario, round and hint level):", "",
                  tabulate(rows, headers=headers, disable_numparse=True, tablefmt=tablefmt), "",
                  f"pass rate A-B, mean over scenarios: {r.pass_diff:+.2f}"
                  f"{_ci(r.pass_diff_ci, sign=True)} ({level} bootstrap interval over scenarios)"]
    lines += [f"McNemar's exact test on the {r.pairs} paired first tries: only A passed "
              f"{r.a_only}, only B passed {r.b_only}, p = {p_text(r.mcnemar_p)}",
              "  (p: the chance of a split at least this uneven if A and B were equally good; "
              f"below {1 - r.confidence:.2g} it shows a difference)"]
    if r.repair_p is not None:
        lines.append(f"exact sign test on the {r.repair_pairs} pairs' repair scores (the "
                     f"verdict's basis): A higher in {r.a_repair_better}, B higher in "
                     f"{r.b_repair_better}, p = {p_text(r.repair_p)}")
    if (r.a_better, r.b_better) != (r.a_only, r.b_only):
        lines.append(f"exact sign test on the first tries' scores: A higher in {r.a_better}, "
                     f"B higher in {r.b_better}, p = {p_text(r.sign_p)}")
    if r.unsafe_p is not None:
        lines.append(f"McNemar's exact test on the {r.unsafe_pairs} pairs judged for safety on "
                     f"both sides: only A fixed unsafely {r.a_unsafe_only}, only B "
                     f"{r.b_unsafe_only}, p = {p_text(r.unsafe_p)}")
    if r.solved_p is not None:
        lines.append(f"McNemar's exact test on the {r.solved_pairs} rounds both ran with hints, "
                     f"solved at any level: only A solved {r.a_solved_only}, only B solved "
                     f"{r.b_solved_only}, p = {p_text(r.solved_p)}")
    if r.unpaired:
        lines.append(f"{r.unpaired} scored first tries had no partner in the other run and are "
                     "left out")
    if r.by_order:
        lines.append("a run repeats round numbers, so its runs of a scenario were paired in order")
    for side, run in (("A", rc.a), ("B", rc.b)):
        if run.cut_short:
            lines.append(f"{run.cut_short} of {side}'s cassettes end before a verdict (cut short) "
                         "and are left out")
    lines.append("")
    lines += verdict_lines(rc)
    return "\n".join(lines)


def verdict_lines(rc: RunComparison) -> list[str]:
    """The verdict naming the models, as ``rootbench compare`` ends with it: on the first tries,
    and with hints on both sides, on the rounds solved at any level (the HTML report shows
    these very lines)."""
    r = rc.result
    a, b = rc.names()
    lines = [f"first tries: {r.verdict(a, b)}"]
    if r.solved_winner:
        better, worse = (a, b) if r.solved_winner == "a" else (b, a)
        lines.append(f"with hints: {better} solves more rounds than {worse} "
                     f"(p = {p_text(r.solved_p or 0.0)})")
    elif r.solved_p is not None:
        lines.append("with hints: no difference shown in the rounds solved at any level")
    return lines


def render_comparisons(comparisons: Sequence[RunComparison], fmt: str = "github") -> str:
    """The comparisons as tables and verdicts, or one JSON document (``fmt`` json)."""
    if fmt == "json":
        return json.dumps({"comparisons": [c.to_dict() for c in comparisons]}, indent=2)
    return "\n\n".join(_text(c, fmt) for c in comparisons)
