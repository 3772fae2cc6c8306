"""Comparing runs: is run A better than run B, or is the gap within what chance gives?

``rootbench compare RUN_A RUN_B [RUN...]`` reads each run directory's
results, pairs the runs of the same scenario and round (and hint level), and
shows per scenario and overall how A and B differ, with a paired bootstrap
interval and McNemar's exact test (:func:`runner.app.stats.compare`). With
more than two runs, each is compared with the first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from runner.app.runs import load_results, results_file
from runner.app.stats import CONFIDENCE, Comparison, Interval, compare
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.text import printable


@dataclass(frozen=True)
class Run:
    """One run directory's episodes, and what to call it."""

    path: Path
    label: str  # the agent and model that ran it, as the run directory recorded them
    episodes: list[Episode]


@dataclass(frozen=True)
class RunComparison:
    """Run ``a`` against run ``b``."""

    a: Run
    b: Run
    result: Comparison

    def to_dict(self) -> dict[str, Any]:
        return {"a": _run_dict(self.a), "b": _run_dict(self.b), **self.result.to_dict()}


def _run_dict(run: Run) -> dict[str, Any]:
    return {"path": str(run.path), "label": run.label, "episodes": len(run.episodes)}


def load_run(path: Path) -> Run:
    """A run directory's results; :class:`InvalidInput` if it has none or they are damaged."""
    path = Path(path)
    results_file(path)  # says what is there instead, when it is not a results file
    info, episodes = load_results(path)
    return Run(path=path, label=_label(info, episodes), episodes=episodes)


def _label(info: dict[str, Any], episodes: list[Episode]) -> str:
    agent = info.get("agent")
    if episodes:
        kind, model = episodes[0].agent.value, episodes[0].model
    elif isinstance(agent, dict):
        kind, model = str(agent.get("kind", "?")), str(agent.get("model", ""))
    else:
        return "?"
    return printable(kind if kind in ("oracle", "noop", "scripted") or not model else f"{kind} {model}")


def compare_runs(paths: Sequence[Path], confidence: float = CONFIDENCE) -> list[RunComparison]:
    """Each run after the first compared with the first (A = the first, B = the other)."""
    if len(paths) < 2:
        raise InvalidInput("compare needs at least two run directories")
    runs = [load_run(p) for p in paths]
    first = runs[0]
    return [RunComparison(first, other, compare(first.episodes, other.episodes, confidence))
            for other in runs[1:]]


def _ci(interval: Interval) -> str:
    return f"[{interval.low:+.2f}, {interval.high:+.2f}]"


def _text(rc: RunComparison, fmt: str) -> str:
    r = rc.result
    level = f"{r.confidence:.0%}"
    lines = [f"A: {printable(str(rc.a.path))} ({rc.a.label}, {len(rc.a.episodes)} runs)",
             f"B: {printable(str(rc.b.path))} ({rc.b.label}, {len(rc.b.episodes)} runs)", ""]
    if r.scenarios:
        rows = [[printable(s.scenario), str(s.pairs), f"{s.a_passes}/{s.pairs}",
                 f"{s.b_passes}/{s.pairs}", f"{s.pass_diff:+.2f}", f"{s.a_score:.2f}",
                 f"{s.b_score:.2f}", f"{s.score_diff:+.2f}"] for s in r.scenarios]
        rows.append(["overall", str(r.pairs), f"{r.a_pass_rate:.2f}", f"{r.b_pass_rate:.2f}",
                     f"{r.pass_diff:+.2f} {_ci(r.pass_diff_ci)}", f"{r.a_score:.2f}",
                     f"{r.b_score:.2f}", f"{r.score_diff:+.2f} {_ci(r.score_diff_ci)}"])
        headers = ["scenario", "pairs", "A pass", "B pass", f"pass diff [{level} CI]",
                   "A score", "B score", f"score diff [{level} CI]"]
        lines += [tabulate(rows, headers=headers, disable_numparse=True,
                           tablefmt="github" if fmt == "github" else "plain"), ""]
    lines.append(f"paired runs: {r.pairs}; only A passed: {r.a_only}, only B passed: {r.b_only}; "
                 f"McNemar exact p = {r.mcnemar_p:.4g}")
    if (r.a_better, r.b_better) != (r.a_only, r.b_only):
        lines.append(f"score higher for A: {r.a_better}, for B: {r.b_better}; "
                     f"exact sign test p = {r.sign_p:.4g}")
    if r.unpaired:
        lines.append(f"{r.unpaired} scored run(s) had no partner in the other run and are left out")
    if r.by_order:
        lines.append("a run repeats round numbers, so its runs of a scenario were paired in order")
    lines.append(r.verdict())
    return "\n".join(lines)


def render_comparisons(comparisons: Sequence[RunComparison], fmt: str = "github") -> str:
    """The comparisons as tables and verdicts, or one JSON document (``fmt`` json)."""
    if fmt == "json":
        return json.dumps({"comparisons": [c.to_dict() for c in comparisons]}, indent=2)
    return "\n\n".join(_text(c, fmt) for c in comparisons)
