"""Results as people and machines read them: tables, results JSON, JUnit XML.

Everything a guest or a model produced passes through :func:`clean_text`
before it is shown, so no escape sequence reaches the user's terminal.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from runner.core.episode import Episode
from runner.core.outcomes import Verdict
from runner.core.text import clean_text

FORMATS = ("github", "plain", "json")  # every --format choice


def _flags(ep: Episode) -> str:
    return ",".join(f.value for f in ep.flags)


def _row(ep: Episode) -> list[Any]:
    tokens = f"{ep.tokens_in}/{ep.tokens_out}" if (ep.tokens_in or ep.tokens_out) else "-"
    return [clean_text(ep.scenario), ep.verdict.value, f"{ep.seconds:.1f}", ep.turns, ep.commands,
            tokens, _flags(ep) or "-"]


HEADERS = ["scenario", "verdict", "seconds", "turns", "commands", "tokens in/out", "flags"]


def summary_counts(episodes: Sequence[Episode]) -> dict[str, int]:
    """How many runs ended with each verdict, keyed by the verdict's spelling."""
    counts = Counter(ep.verdict for ep in episodes)
    return {v.value: counts[v] for v in Verdict}


def summary_line(episodes: Sequence[Episode]) -> str:
    c = summary_counts(episodes)
    return f"{len(episodes)} runs: " + ", ".join(f"{n} {v}" for v, n in c.items())


def render_table(episodes: Sequence[Episode], fmt: str = "github") -> str:
    """The results table (or JSON) for the terminal."""
    if fmt == "json":
        return json.dumps({"summary": summary_counts(episodes),
                           "episodes": [ep.to_dict() for ep in episodes]}, indent=2)
    tablefmt = "github" if fmt == "github" else "plain"
    table = tabulate([_row(ep) for ep in episodes], headers=HEADERS, tablefmt=tablefmt)
    lines = [table, "", summary_line(episodes)]
    tps = [(ep.prompt_tps, ep.gen_tps) for ep in episodes if ep.prompt_tps and ep.gen_tps]
    if tps:
        p = sum(t[0] for t in tps) / len(tps)
        g = sum(t[1] for t in tps) / len(tps)
        lines.append(f"model speed: prompt {p:.0f} tok/s, generation {g:.1f} tok/s (mean of runs)")
    why = [f"  {clean_text(ep.scenario)}: {clean_text(ep.reason)}" for ep in episodes
           if not ep.verdict.scored and ep.reason]
    if why:
        lines += ["", "not scored:"] + why
    return "\n".join(lines)


def render_rows(headers: list[str], rows: list[list[Any]], fmt: str = "github") -> str:
    """A generic table in the chosen format (used by verify, replay, perf)."""
    if fmt == "json":
        return json.dumps([dict(zip(headers, r, strict=False)) for r in rows], indent=2)
    return tabulate(rows, headers=headers, tablefmt="github" if fmt == "github" else "plain")


def junit_xml(episodes: Sequence[Episode], suite: str = "rootbench") -> str:
    """JUnit XML, so CI systems show each scenario as a test case."""
    c = summary_counts(episodes)
    root = ET.Element("testsuite", name=suite, tests=str(len(episodes)),
                      failures=str(c[Verdict.FAIL.value]),
                      errors=str(c[Verdict.INFRA_ERROR.value] + c[Verdict.INVALID_SCENARIO.value]),
                      time=f"{sum(ep.seconds for ep in episodes):.3f}")
    for ep in episodes:
        case = ET.SubElement(root, "testcase", classname=suite, name=clean_text(ep.scenario),
                             time=f"{ep.seconds:.3f}")
        if ep.verdict is Verdict.FAIL:
            ET.SubElement(case, "failure", message=clean_text(ep.reason)[:500])
        elif ep.verdict is not Verdict.PASS:
            ET.SubElement(case, "error", type=ep.verdict.value, message=clean_text(ep.reason)[:500])
        if ep.flags:
            ET.SubElement(case, "system-out").text = "flags: " + _flags(ep)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def pass_at(episodes: Sequence[Episode], fmt: str = "github") -> str:
    """pass@1 (mean pass rate over rounds) and pass@N (passed in any round) per scenario."""
    by: dict[str, list[Episode]] = {}
    for ep in episodes:
        by.setdefault(ep.scenario, []).append(ep)
    rows = []
    for scenario, eps in by.items():
        scored = [e for e in eps if e.verdict.scored]
        passes = sum(e.verdict is Verdict.PASS for e in scored)
        p1 = f"{passes / len(scored):.2f}" if scored else "-"
        rows.append([clean_text(scenario), len(eps), p1, "yes" if passes else "no"])
    return render_rows(["scenario", "rounds", "pass@1", f"pass@{max(len(v) for v in by.values())}"],
                       rows, fmt)
