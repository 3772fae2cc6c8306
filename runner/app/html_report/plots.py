"""The report's plots: pass rate of first tries per scenario (with its Wilson interval), seconds
and tokens per turn (every episode), prompt processing against generation time (every timed
episode, a mean bar per scenario and run). Each says what it counts.

Each is an SVG drawn by matplotlib (the optional ``report`` extra: without
it the report says so and has no plots) and shown as ``<img
src="data:...">``, where no script can run. Labels taken from a run are
cut short; the figures are made without dates, so the same runs draw the
same bytes.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import markupsafe

from runner.app.html_report.fields import num
from runner.app.html_report.view import RunView
from runner.app.stats import assists, hinted, pass_count, wilson
from runner.backends.cachedir import cache_dir
from runner.core.errors import InvalidInput


@dataclass
class Plot:
    title: str
    alt: str
    uri: str  # data:image/svg+xml;base64,...


def _interval(passes: int, n: int) -> tuple[float, float] | None:
    """The 95% Wilson interval of a pass rate (None with no scored runs)."""
    if n == 0:
        return None
    got = wilson(passes, n)
    return float(got.low), float(got.high)


def _svg_uri(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    # Made here of base64 alone (no quote, no angle bracket): Markup, so that the cap every
    # shown text gets (see `shown`) never cuts a plot.
    return markupsafe.Markup("data:image/svg+xml;base64,"
                             + base64.b64encode(buf.getvalue()).decode("ascii"))


def plots(runs: Sequence[RunView]) -> list[Plot] | None:
    """The report's plots as SVG data URIs; None when matplotlib is not installed."""
    # matplotlib keeps its config and font cache under $MPLCONFIGDIR, else ~/.config and
    # ~/.cache/matplotlib: folders of the user's that rootbench does not own. Read at its
    # first import, so set before it (a folder the user chose is kept; with no cache folder
    # to be had, matplotlib's own choice stands: a report is not refused for it).
    if "MPLCONFIGDIR" not in os.environ:
        with contextlib.suppress(InvalidInput, OSError):
            os.environ["MPLCONFIGDIR"] = str(cache_dir("matplotlib"))
    try:
        # Optional heavy dependency (the `report` extra): without it the report has no plots.
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        return None
    out: list[Plot] = []
    colors = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#4a5568"]
    with matplotlib.rc_context({"svg.hashsalt": "rootbench", "svg.fonttype": "path",
                                "font.size": 9}):
        scenarios = list(dict.fromkeys(ep.scenario for run in runs for ep in run.episodes))
        if scenarios:
            fig = Figure(figsize=(7.5, 0.5 + 0.32 * len(scenarios) * max(1, min(len(runs), 3))))
            ax = fig.subplots()
            height = 0.8 / max(len(runs), 1)
            any_interval = False
            for i, run in enumerate(runs):
                rates, lo, hi, counts = [], [], [], []
                for s in scenarios:
                    k, n = pass_count([ep.result for ep in run.episodes
                                       if ep.scenario == s and ep.result is not None])
                    rate = k / n if n else 0.0
                    ci = _interval(k, n)
                    any_interval |= ci is not None
                    rates.append(rate)
                    counts.append(f"{k}/{n}" if n else "not scored")
                    lo.append(rate - ci[0] if ci else 0.0)
                    hi.append(ci[1] - rate if ci else 0.0)
                ys = [j + i * height for j in range(len(scenarios))]
                ax.barh(ys, rates, height=height * 0.9, color=colors[i % len(colors)],
                        label=run.label[:60], xerr=[lo, hi] if any_interval else None,
                        error_kw={"capsize": 2, "elinewidth": 0.8})
                for y, rate, up, count in zip(ys, rates, hi, counts, strict=True):
                    ax.text(min(rate + up + 0.02, 0.9), y, count, va="center", fontsize=7)
            ax.set_yticks([j + height * (len(runs) - 1) / 2 for j in range(len(scenarios))],
                          [s[:40] for s in scenarios])
            ax.invert_yaxis()
            ax.set_xlim(0, 1)
            ax.set_xlabel("pass rate of first tries (pass / (pass + fail))"
                          + (", 95% Wilson interval" if any_interval else ""))
            if len(runs) > 1:
                ax.legend(loc="lower right", fontsize=7)
            out.append(Plot("Pass rate per scenario, first tries",
                            "pass rate of first tries per scenario, one bar per run",
                            _svg_uri(fig)))

        ladder = _ladder(runs, colors, Figure)
        if ladder is not None:
            out.append(ladder)

        per_turn = [(run, [ep.trajectory for ep in run.episodes if ep.trajectory]) for run in runs]
        if any(t.turns for _r, ts in per_turn for t in ts):
            fig = Figure(figsize=(7.5, 3.0))
            ax_s, ax_t = fig.subplots(1, 2)
            for i, (run, trajs) in enumerate(per_turn):
                n = max((len(t.turns) for t in trajs), default=0)
                xs, secs, tin, tout = [], [], [], []
                for k in range(n):
                    turns = [t.turns[k] for t in trajs if len(t.turns) > k]
                    xs.append(k + 1)
                    secs.append(sum(t.seconds + t.command_seconds for t in turns) / len(turns))
                    tin.append(sum(t.prompt_tokens for t in turns) / len(turns))
                    tout.append(sum(t.completion_tokens for t in turns) / len(turns))
                c = colors[i % len(colors)]
                ax_s.plot(xs, secs, marker="o", ms=3, color=c, label=run.label[:40])
                if any(tin) or any(tout):
                    who = f"{run.label[:30]}: " if len(runs) > 1 else ""
                    ax_t.plot(xs, tin, marker="o", ms=3, color=c, label=f"{who}prompt")
                    ax_t.plot(xs, tout, marker="s", ms=3, ls="--", color=c, label=f"{who}generated")
            ax_s.set_title("seconds per turn (model + commands)", fontsize=9)
            ax_s.set_xlabel("turn")
            ax_t.set_title("tokens per turn", fontsize=9)
            ax_t.set_xlabel("turn")
            if ax_t.get_legend_handles_labels()[0]:
                ax_t.legend(fontsize=7)
            else:
                ax_t.text(0.5, 0.5, "no token counts recorded", ha="center", va="center",
                          transform=ax_t.transAxes, color="#718096")
            if len(runs) > 1:
                ax_s.legend(fontsize=6)
            fig.tight_layout()
            out.append(Plot("Seconds and tokens per turn: the mean over every episode (all hint "
                            "levels) that reached that turn", "mean seconds and tokens at each turn",
                            _svg_uri(fig)))

        timed = [(i, ep) for i, run in enumerate(runs) for ep in run.episodes
                 if (num(ep.get("prompt_ms")) or 0) + (num(ep.get("gen_ms")) or 0) > 0]
        if timed:
            # Every timed episode counts: one bar per scenario and run, its mean over the
            # episodes (all hint levels), so no run drops off the end of a long list.
            groups: dict[tuple[int, str], list[Any]] = {}
            for i, ep in timed:
                groups.setdefault((i, ep.scenario), []).append(ep)
            keys = sorted(groups, key=lambda k: (scenarios.index(k[1]) if k[1] in scenarios
                                                 else len(scenarios), k[0]))
            fig = Figure(figsize=(7.5, 0.8 + 0.22 * len(keys)))
            ax = fig.subplots()
            labels = [(f"{runs[i].label[:24]}: " if len(runs) > 1 else "")
                      + f"{s[:30]} ({len(groups[(i, s)])})" for i, s in keys]

            def mean_s(eps: list[Any], key: str) -> float:
                return sum((num(ep.get(key)) or 0.0) for ep in eps) / len(eps) / 1000

            prompt = [mean_s(groups[k], "prompt_ms") for k in keys]
            gen = [mean_s(groups[k], "gen_ms") for k in keys]
            ys = list(range(len(keys)))
            ax.barh(ys, prompt, color="#2b6cb0", label="prompt processing")
            ax.barh(ys, gen, left=prompt, color="#dd6b20", label="generation")
            ax.set_yticks(ys, labels)
            ax.invert_yaxis()
            ax.set_xlabel(f"mean seconds of model time per episode (all {len(timed)} timed "
                          "episodes; in brackets, how many per bar)")
            ax.legend(fontsize=7, ncols=2, loc="lower center", bbox_to_anchor=(0.5, 1.0),
                      frameon=False)
            out.append(Plot("Prompt processing vs generation time, per scenario",
                            "mean model seconds per episode and scenario, prompt processing and "
                            "generation", _svg_uri(fig)))
    return out


def ladder_curve(run: RunView) -> list[float]:
    """Share of the run's rounds solved with at most k hints, for k = 0 .. the highest level run.

    The ladder as a figure of its own: the pass-rate plot counts first tries
    (level 0) only, so what the hints bought shows here and nowhere else.
    """
    results = [ep.result for ep in run.episodes if ep.result is not None]
    needed = list(assists(results).values())
    if not needed:
        return []
    top = max(r.hint_level for r in results if r.verdict.scored)
    return [sum(1 for a in needed if a is not None and a <= k) / len(needed)
            for k in range(top + 1)]


def _ladder(runs: Sequence[RunView], colors: list[str], figure: Any) -> Plot | None:
    """Rounds solved with at most k hints, one line per run; None when no run used hints."""
    curves = [(run, ladder_curve(run)) for run in runs
              if hinted([ep.result for ep in run.episodes if ep.result is not None])]
    curves = [(run, c) for run, c in curves if c]
    if not curves:
        return None
    fig = figure(figsize=(7.5, 2.8))
    ax = fig.subplots()
    for i, (run, curve) in enumerate(curves):
        ax.step(range(len(curve)), curve, where="post", marker="o", color=colors[i % len(colors)],
                label=run.label[:60])
    top = max(len(c) for _r, c in curves)
    ax.set_xticks(range(top), [str(k) for k in range(top)])
    ax.set_xlabel("hints given (hint level)")
    ax.set_ylabel("rounds solved")
    ax.set_ylim(0, 1.05)
    if len(curves) > 1:
        ax.legend(loc="upper left", fontsize=7)
    return Plot("The ladder: rounds solved with at most k hints",
                "share of rounds solved at hint level k or lower, one line per run",
                _svg_uri(fig))

