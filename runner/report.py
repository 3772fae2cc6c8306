"""Results as people and machines read them: tables, results JSON, JUnit XML.

Everything a guest or a model produced passes through :func:`clean_text`
before it is shown, so no escape sequence reaches the user's terminal.
Files are written atomically (temp file, fsync, rename): a crash never leaves
a half-written results file behind, and earlier results stay intact.
"""

from __future__ import annotations

import json
import os
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from runner.agent import Episode, clean_text

FORMATS = ("github", "plain", "json")


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


def _flags(ep: Episode | dict[str, Any]) -> str:
    flags = ep.flags if isinstance(ep, Episode) else ep.get("flags", [])
    return ",".join(flags)


def _row(ep: Episode) -> list[Any]:
    tokens = f"{ep.tokens_in}/{ep.tokens_out}" if (ep.tokens_in or ep.tokens_out) else "-"
    return [clean_text(ep.scenario), ep.verdict, f"{ep.seconds:.1f}", ep.turns, ep.commands,
            tokens, _flags(ep) or "-"]


HEADERS = ["scenario", "verdict", "seconds", "turns", "commands", "tokens in/out", "flags"]


def summary_counts(episodes: Sequence[Episode]) -> dict[str, int]:
    counts = Counter(ep.verdict for ep in episodes)
    return {"pass": counts["pass"], "fail": counts["fail"],
            "infra-error": counts["infra-error"], "invalid": counts["invalid-scenario"]}


def summary_line(episodes: Sequence[Episode]) -> str:
    c = summary_counts(episodes)
    return (f"{len(episodes)} runs: {c['pass']} pass, {c['fail']} fail, "
            f"{c['infra-error']} infra-error, {c['invalid']} invalid")


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
           if ep.verdict in ("infra-error", "invalid-scenario") and ep.reason]
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
                      failures=str(c["fail"]), errors=str(c["infra-error"] + c["invalid"]),
                      time=f"{sum(ep.seconds for ep in episodes):.3f}")
    for ep in episodes:
        case = ET.SubElement(root, "testcase", classname=suite, name=clean_text(ep.scenario),
                             time=f"{ep.seconds:.3f}")
        if ep.verdict == "fail":
            ET.SubElement(case, "failure", message=clean_text(ep.reason)[:500])
        elif ep.verdict != "pass":
            ET.SubElement(case, "error", type=ep.verdict, message=clean_text(ep.reason)[:500])
        if ep.flags:
            ET.SubElement(case, "system-out").text = "flags: " + _flags(ep)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


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


def pass_at(episodes: Sequence[Episode], fmt: str = "github") -> str:
    """pass@1 (mean pass rate over rounds) and pass@N (passed in any round) per scenario."""
    by: dict[str, list[Episode]] = {}
    for ep in episodes:
        by.setdefault(ep.scenario, []).append(ep)
    rows = []
    for scenario, eps in by.items():
        scored = [e for e in eps if e.verdict in ("pass", "fail")]
        passes = sum(e.verdict == "pass" for e in scored)
        p1 = f"{passes / len(scored):.2f}" if scored else "-"
        rows.append([clean_text(scenario), len(eps), p1, "yes" if passes else "no"])
    return render_rows(["scenario", "rounds", "pass@1", f"pass@{max(len(v) for v in by.values())}"],
                       rows, fmt)
