"""The report's runs read from what the user hands over: run directories and loose cassettes.

A run directory is a file the user hands over: its fields only ever pick
files inside it (:func:`_find_cassette`). A cassette that is unreadable or
cut short is still a row, saying so, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runner.app.html_report.fields import integer, text
from runner.app.html_report.trajectory import load_trajectory
from runner.app.html_report.view import EpisodeView, RunView
from runner.app.report import levels_in_order
from runner.app.runs import load_results, relative_name, results_file, shown_path
from runner.core import layout
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.paths import contained


def _as_result(data: dict[str, Any]) -> Episode | None:
    """A verdict line as an Episode, or None when it is not one (a cassette is a file handed
    over: any field may be of any type)."""
    try:
        return Episode.from_dict(data)
    except (TypeError, ValueError, AttributeError):
        return None


def _episode_from_cassette(path: Path, shown: str | None = None) -> EpisodeView:
    """The cassette at ``path`` as an episode; ``shown`` is what the report calls it (default:
    its file name)."""
    named = layout.parse_cassette_name(path.name)
    scenario = named.scenario if named else layout.cassette_stem(path)
    try:
        traj = load_trajectory(path)
    except InvalidInput as exc:
        return EpisodeView({"scenario": scenario, "verdict": "incomplete"},
                           problem=text(exc).replace(str(path), shown or path.name))
    traj.shown = shown or path.name
    data = dict(traj.verdict or {})
    data.pop("type", None)
    if not data:
        n = len(traj.turns)
        data = {"scenario": traj.scenario.get("id") or scenario, "verdict": "incomplete",
                "round": traj.head.round, "hint_level": traj.head.hint_level,
                "model": traj.model_name, "protocol": traj.protocol, "turns": n,
                "commands": sum(len(t.commands) for t in traj.turns),
                "reason": f"the cassette was cut short: it ends after {n} "
                          f"turn{'' if n == 1 else 's'}, before a verdict"}
        return EpisodeView(data, traj)
    return EpisodeView(data, traj, result=_as_result(data))


def _find_cassette(run_dir: Path, ep: dict[str, Any]) -> tuple[Path | None, str]:
    """The episode's cassette inside ``run_dir``, or None and why it is not shown.

    results.json is a file the user hands over: its ``scenario``, ``arm`` and
    ``cassette`` fields only ever pick a file *inside* the run directory.
    ``scenario: ../../../x`` or ``cassette: /etc/passwd`` (or a symlink in
    ``cassettes/`` pointing out) is never opened.
    """
    root = run_dir.resolve()
    arm = ep.get("arm") if isinstance(ep.get("arm"), str) else None
    candidates = []
    if isinstance(ep.get("scenario"), str):  # where the bench put it: the level's own cassette
        candidates.append(layout.cassette_path(run_dir, ep["scenario"], integer(ep.get("round")),
                                               integer(ep.get("hint_level")), arm))
    if isinstance(ep.get("cassette"), str):  # a run directory moved: the recorded name in it
        recorded = Path(ep["cassette"])
        candidates += [recorded, layout.arm_folder(run_dir / layout.CASSETTES, arm) / recorded.name]
    outside = False
    for c in candidates:
        try:
            if not c.is_file():
                continue
        except OSError:
            continue
        if contained(c, root) is not None:
            return c, ""
        outside = True
    if outside:
        return None, "its cassette is outside the run directory (not read)"
    return None, "its cassette is not in the run directory"


def load_run_dir(run_dir: Path | str) -> RunView:
    """A bench's run directory: results.json, and each episode's cassette when it is there."""
    run_dir = Path(run_dir)
    results_file(run_dir)  # says what is there instead, when it is not a results file
    info, episodes = load_results(run_dir)
    run = RunView(label=text(run_dir.name), source=text(shown_path(run_dir)), info=info)
    for ep in episodes:
        data = ep.to_dict()
        cassette, why = _find_cassette(run_dir, data)
        if cassette is None:
            run.episodes.append(EpisodeView(data, problem=why, result=ep))
            continue
        read = _episode_from_cassette(cassette, relative_name(str(cassette.resolve()), run_dir))
        run.episodes.append(EpisodeView(data, read.trajectory, read.problem, result=ep))
    return run


def load_run_arms(run_dir: Path | str) -> list[RunView]:
    """A run directory as runs to show side by side: itself, or one run per arm of a matrix
    bench (model x protocol), each labelled ``<dir> · <arm>``, in the order the bench ran them."""
    run = load_run_dir(run_dir)
    arms = list(dict.fromkeys(text(ep.get("arm")) for ep in run.episodes if ep.get("arm")))
    if not arms:
        return [run]
    return [RunView(label=f"{run.label} · {arm}", source=run.source, info=run.info,
                episodes=[ep for ep in run.episodes if text(ep.get("arm")) == arm])
            for arm in arms]


def runs_from_cassettes(paths: Iterable[Path | str]) -> list[RunView]:
    """Loose cassettes, one run per model and protocol (in the order first seen)."""
    runs: dict[tuple[str, str], RunView] = {}
    for path in map(Path, paths):
        ep = _episode_from_cassette(path)
        model = ep.trajectory.model_name if ep.trajectory else text(ep.get("model")) or "?"
        protocol = ep.trajectory.protocol if ep.trajectory else text(ep.get("protocol")) or "?"
        key = (model, protocol)
        if key not in runs:
            runs[key] = RunView(label=f"{model} · {protocol}", source=text(shown_path(path.parent)))
        runs[key].episodes.append(ep)
    for run in runs.values():  # a folder lists x.r0.h1.jsonl before x.r0.jsonl: level 0 first
        run.episodes = levels_in_order(run.episodes, lambda e: (e.scenario, e.round),
                                       lambda e: e.hint_level)
    return list(runs.values())
