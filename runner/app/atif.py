"""Runs exported as ATIF, the Agent Trajectory Interchange Format of the Harbor project.

The format is Harbor's RFC 0001 (``docs/rfcs/0001-trajectory-format.md`` in
laude-institute/harbor), version **ATIF-v1.4**, the version of the text this
was written from. One ``trajectory.json`` per episode:

- root: ``schema_version``, ``session_id``, ``agent`` (``name``, ``version``,
  ``model_name``), ``steps``, ``notes``, ``final_metrics``, ``extra``;
- step 1, ``source: system``: the system prompt; step 2, ``source: user``:
  the task;
- then one ``source: agent`` step per model call: ``message`` is the reply as
  sent, ``reasoning_content`` the JSON protocol's ``thought``, ``tool_calls``
  the commands (``run_command``) and the finish (``finish``) the harness
  read from it, whatever the protocol (tools, json, text), ``observation``
  the command results and protocol corrections, ``metrics`` the tokens, and
  ``extra`` each result's exit code, duration, flags (v1.4 results have no
  ``extra`` of their own); a model call that failed is a ``source: system``
  step saying so;
- every step has a ``timestamp`` (ISO 8601, UTC, to the millisecond): the
  header's ``started_at`` plus the run clock's reading recorded in the
  cassette (the first reading after the model's reply for an agent step,
  the first reading of the run for the system prompt and the task);
- the verdict, probes and flags, which ATIF has no field for, are under
  ``extra.rootbench``; the verdict and score also go where Harbor's tooling
  reads a trial's reward: each episode is exported as a Harbor trial folder,
  ``<episode>/agent/trajectory.json`` beside ``<episode>/verifier/reward.txt``
  (one number: 1 for a pass, 0 for a fail) and ``verifier/reward.json`` (a
  flat map of numbers: ``reward``, and ``repair``, ``score`` and
  ``milestones`` when the run has them), the files Harbor's verifier reads
  into a trial's ``verifier_result.rewards``. An episode that is not scored
  (infra-error, invalid-scenario, cut short) has no reward file, as a Harbor
  trial whose verifier wrote none;
- ``final_metrics.extra`` holds the headline figures of the episode: its
  ``repair`` score (what the fault broke and the run repaired: 0 for doing
  nothing, 1 for the oracle), ``unsafe_fix`` (the symptom fixed with damage
  or a state-diff finding; null when not judged, before rules 3), and under
  ``reference`` the same scenario's repair and score of the committed noop
  and oracle runs (:mod:`runner.app.reference`; none outside a checkout);
- no path of the machine that ran or exports it: the cassette is named
  relative to the folder given to ``export`` (or by its file name), and so is
  the one its verdict line recorded.

Text is what :func:`runner.app.html_report.load_trajectory` reads from the
cassette: cleaned of terminal control sequences like everything rootbench
writes for people. An observation is the very message the model was sent
next when the cassette has it, else rebuilt from the
guest's answer (``extra.results[].as_sent``).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runner.app.html_report import Trajectory, load_trajectory, text
from runner.app.outputs import atomic_write, check_dir_target, write_error
from runner.app.reference import REFERENCES, reference_episode
from runner.app.runs import relative_name, slug
from runner.app.stats import repair_of, score_of
from runner.core import layout
from runner.core.cassette import Cassette, digest, find_cassettes
from runner.core.cassette_header import CassetteHeader
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.outcomes import Verdict

SCHEMA_VERSION = "ATIF-v1.4"
FORMATS = ("atif",)
AGENT_NAME = "rootbench"
FILE_NAME = "trajectory.json"
AGENT_DIR = "agent"  # a Harbor trial's folders: agent/trajectory.json, verifier/reward.*
VERIFIER_DIR = "verifier"
REWARD_TXT = "reward.txt"
REWARD_JSON = "reward.json"


def _started(head: CassetteHeader) -> _dt.datetime | None:
    value = head.started_at
    if value is None:
        return None
    try:
        start = _dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return start if start.tzinfo else start.replace(tzinfo=_dt.timezone.utc)


def step_times(traj: Trajectory) -> tuple[str | None, list[str | None]]:
    """When the run began (its first clock reading) and when each model call's reply came (the
    first clock reading after it; the last before it when none follows), as ISO 8601 UTC.

    The cassette's clock records are seconds since the run's clock started, read from the
    monotonic clock; the header's ``started_at`` (to the second) says when that was. None
    where the cassette has no start time or no reading to go by.
    """
    start = _started(traj.head)
    if start is None:
        return None, [None] * len(traj.turns)

    def iso(t: float | None) -> str | None:
        if t is None:
            return None
        return (start + _dt.timedelta(seconds=t)).astimezone(_dt.timezone.utc) \
            .isoformat(timespec="milliseconds").replace("+00:00", "Z")

    first: float | None = None
    last: float | None = None
    times: list[float | None] = []
    waiting: int | None = None  # the model call whose reply still waits for a reading
    for event in Cassette.load(traj.path).events:
        kind = event.get("type")
        if kind == "clock" and isinstance(event.get("t"), int | float):
            last = float(event["t"])
            first = last if first is None else first
            if waiting is not None:
                times[waiting], waiting = last, None
        elif kind in ("model", "model-error"):
            times.append(last)
            waiting = len(times) - 1
    times += [None] * (len(traj.turns) - len(times))
    return iso(first if first is not None else 0.0), [iso(t) for t in times[:len(traj.turns)]]


def rewards(episode: dict[str, Any]) -> dict[str, float] | None:
    """What goes in a Harbor trial's ``verifier/reward.json``: ``reward`` 1 for a pass, 0 for
    a fail, and the graded ``score`` and ``milestones`` fraction when the run has them; None
    for a run that is not scored (nothing to reward)."""
    verdict = episode.get("verdict")
    if verdict not in (Verdict.PASS.value, Verdict.FAIL.value):
        return None
    out = {"reward": 1.0 if verdict == Verdict.PASS.value else 0.0}
    if (repair := _repair(episode)) is not None:
        out["repair"] = repair
    for key, name in (("score", "score"), ("milestone_fraction", "milestones")):
        value = episode.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def _episode(episode: dict[str, Any]) -> Episode | None:
    """A verdict line as an Episode, or None when it is not one (a cassette is a file handed
    over: any field may be of any type)."""
    try:
        return Episode.from_dict(episode) if episode else None
    except (TypeError, ValueError, AttributeError):
        return None


def _repair(episode: dict[str, Any]) -> float | None:
    """The verdict line's repair score (:func:`runner.app.stats.repair_of`), or None."""
    ep = _episode(episode)
    return repair_of(ep) if ep is not None else None


def headline(episode: dict[str, Any], scenario: str) -> dict[str, Any]:
    """What ``final_metrics.extra`` adds to the counts: the episode's ``repair`` score and
    ``unsafe_fix`` (None: not judged), and the same scenario's ``repair`` and ``score`` of the
    committed noop and oracle runs under ``reference`` (those there are)."""
    ep = _episode(episode)
    reference = {}
    for name, _folder in REFERENCES:
        ref = reference_episode(name, scenario)
        if ref is not None:
            reference[name] = {"repair": repair_of(ref), "score": score_of(ref)}
    return {"repair": repair_of(ep) if ep is not None else None,
            "unsafe_fix": ep.unsafe_fix if ep is not None else None, "reference": reference}


def _observation_text(exit_code: int | None, timed_out: bool, output: str) -> str:
    head = "the command timed out and was killed" if timed_out else f"exit code {exit_code}"
    return f"{head}\n{output}" if output else f"{head}\n(no output)"


def _agent_step(traj: Trajectory, i: int, step_id: int) -> dict[str, Any]:
    turn = traj.turns[i]
    following = traj.turns[i + 1] if i + 1 < len(traj.turns) else None
    step: dict[str, Any] = {"step_id": step_id, "source": "agent", "model_name": traj.model_name,
                            "message": turn.content}
    if turn.thought:
        step["reasoning_content"] = turn.thought
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    details: list[dict[str, Any]] = []  # ATIF-v1.4 results have no `extra`: the step's holds these
    for j, cmd in enumerate(turn.commands):
        call_id = cmd.call_id or f"turn{turn.number}-call{j + 1}"
        arguments: dict[str, Any] = {"command": cmd.command}
        if cmd.timeout is not None:
            arguments["timeout"] = cmd.timeout
        calls.append({"tool_call_id": call_id, "function_name": "run_command",
                      "arguments": arguments})
        last = j == len(turn.commands) - 1 and turn.last_action == "command"
        as_sent = bool(last and following is not None and following.sent)
        if cmd.guest_down:
            content = f"the server stopped answering: {cmd.guest_down}"
        elif not cmd.ran:
            content = "(the recording ends before this command's result)"
        else:
            content = following.sent if as_sent and following is not None else \
                _observation_text(cmd.exit_code, cmd.timed_out, cmd.output)
        results.append({"source_call_id": call_id, "content": content})
        details.append({"source_call_id": call_id, "exit_code": cmd.exit_code,
                        "duration_s": cmd.duration, "timed_out": cmd.timed_out,
                        "truncated": cmd.truncated, "unsafe": cmd.unsafe,
                        "times_run": cmd.times_run, "as_sent": as_sent})
    for j, reason in enumerate(turn.corrections):
        last = j == len(turn.corrections) - 1 and turn.last_action == "correction"
        as_sent = bool(last and following is not None and following.sent)
        results.append({"content": following.sent if as_sent and following is not None
                        else f"Error: {reason}"})
        details.append({"protocol_correction": reason, "as_sent": as_sent})
    if turn.finish is not None:
        call_id = f"turn{turn.number}-finish"
        calls.append({"tool_call_id": call_id, "function_name": "finish",
                      "arguments": {"summary": turn.finish}})
    if calls:
        step["tool_calls"] = calls
    if results:
        step["observation"] = {"results": results}
    if turn.prompt_tokens or turn.completion_tokens or turn.prompt_ms or turn.gen_ms:
        step["metrics"] = {"prompt_tokens": turn.prompt_tokens,
                           "completion_tokens": turn.completion_tokens,
                           "cached_tokens": turn.cached_tokens,
                           "extra": {"prompt_ms": turn.prompt_ms, "generation_ms": turn.gen_ms,
                                     "model_seconds": turn.seconds}}
    step["extra"] = {"turn": turn.number, "results": details}
    return step


def to_atif(traj: Trajectory, shown: str | None = None) -> dict[str, Any]:
    """One episode's trajectory as an ATIF-v1.4 document; ``shown`` is what to call its
    cassette (relative to the folder exported, never a local absolute path; default: its
    file name)."""
    shown = shown or traj.path.name
    began, replied = step_times(traj)
    head = traj.head
    steps: list[dict[str, Any]] = [
        {"step_id": 1, "source": "system", "message": traj.system_prompt,
         "extra": {"system_prompt": traj.system_prompt_note}},
        {"step_id": 2, "source": "user", "message": traj.task},
    ]
    for i, turn in enumerate(traj.turns):
        step_id = len(steps) + 1
        step: dict[str, Any]
        if turn.error:
            step = {"step_id": step_id, "source": "system",
                    "message": f"the model call failed ({turn.error_kind or 'error'}): "
                               f"{turn.error}",
                    "extra": {"turn": turn.number, "model_error": turn.error_kind}}
        else:
            step = _agent_step(traj, i, step_id)
        if replied[i] is not None:
            step = {"step_id": step_id, "timestamp": replied[i], **step}
        steps.append(step)
    if began is not None:
        steps[:2] = [{"step_id": s["step_id"], "timestamp": began, **s} for s in steps[:2]]
    agent_steps = [s for s in steps if s["source"] == "agent"]
    episode = {k: v for k, v in (traj.verdict or {}).items() if k != "type"}
    if "cassette" in episode:  # the path of the machine that ran it: the file read instead
        episode["cassette"] = shown
    scenario_doc = dict(traj.scenario)
    if isinstance(scenario_doc.get("path"), str):  # the spec file where it was recorded: its name
        scenario_doc["path"] = Path(scenario_doc["path"]).name
    scenario = text(traj.scenario.get("id")) or traj.path.stem
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": f"rootbench-{slug(scenario)}-r{episode.get('round', head.round)}"
                      f"-{digest(traj.header)[:16]}",  # the line as recorded
        "agent": {"name": AGENT_NAME, "version": text(head.harness.version) or "unknown",
                  "model_name": traj.model_name,
                  "extra": {"agent": head.agent.value, "protocol": traj.protocol,
                            "protocol_reason": text(head.protocol.reason),
                            "fingerprint": dict(head.model)}},
        "notes": (f"rootbench episode of scenario {scenario}: a broken Linux server the agent "
                  "fixes through a root shell. The verdict and probe results are in "
                  "extra.rootbench. Text is cleaned of terminal control sequences."),
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": sum(s.get("metrics", {}).get("prompt_tokens", 0)
                                       for s in agent_steps),
            "total_completion_tokens": sum(s.get("metrics", {}).get("completion_tokens", 0)
                                           for s in agent_steps),
            "total_cached_tokens": sum(s.get("metrics", {}).get("cached_tokens", 0)
                                       for s in agent_steps),
            "total_steps": len(steps),
            "extra": {**{k: episode.get(k) for k in ("seconds", "turns", "commands", "repeats",
                                                      "violations") if k in episode},
                      **headline(episode, scenario)},
        },
        "extra": {"rootbench": {
            "scenario": scenario_doc, "started_at": head.started_at,
            "image": dict(head.image),
            "options": {"accel": head.options.accel, "transport": head.options.transport},
            "episode": episode or None, "cassette": shown,
        }},
    }


def _clean(obj: Any) -> Any:
    """Every string in ``obj`` through the same cleaner the report uses."""
    if isinstance(obj, dict):
        return {text(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return text(obj) if isinstance(obj, str) else obj


def export(paths: Sequence[Path], out: Path | None = None) -> list[Path]:
    """Write a Harbor trial folder ``OUT/<run>/`` for every cassette under ``paths``:
    ``agent/trajectory.json`` and, for a scored run, ``verifier/reward.txt`` and
    ``verifier/reward.json``. Returns the trajectories written.

    ``paths`` are run directories (searched for ``*.jsonl``) and cassettes.
    Without ``out``: ``RUNDIR/atif`` for one run directory, else ``./atif``.
    Every cassette is read before anything is written, so a bad one (one
    line naming it) leaves nothing half exported.
    """
    if not paths:
        raise InvalidInput("nothing to export: give run directories or cassettes")
    for p in paths:
        if not p.exists():
            raise InvalidInput("no such file or directory", path=str(p))
    flag = "--out" if out is not None else "--out (default)"
    if out is None:
        out = paths[0] / "atif" if len(paths) == 1 and paths[0].is_dir() else Path("atif")
    check_dir_target(out, flag)  # before any cassette is read: a bad --out costs no work
    several = len(paths) > 1
    loaded: list[tuple[str, Trajectory, str]] = []
    for p in paths:
        for cassette in find_cassettes([p]):
            prefix = f"{slug(p.name)}-" if several and p.is_dir() else ""
            # Named as the folder given holds it (or by its name): never a local absolute path.
            shown = relative_name(str(cassette.absolute()), p) if p.is_dir() else cassette.name
            loaded.append((prefix + slug(layout.cassette_stem(cassette)),
                           load_trajectory(cassette), shown or cassette.name))
    written: list[Path] = []
    used: set[str] = set()
    for name, traj, shown in loaded:
        unique, n = name, 1
        while unique in used:
            n += 1
            unique = f"{name}-{n}"
        used.add(unique)
        doc = _clean(to_atif(traj, shown))
        files = {out / unique / AGENT_DIR / FILE_NAME:
                 json.dumps(doc, indent=2, ensure_ascii=False) + "\n"}
        if (reward := rewards(doc["extra"]["rootbench"]["episode"] or {})) is not None:
            files[out / unique / VERIFIER_DIR / REWARD_TXT] = f"{reward['reward']:g}\n"
            files[out / unique / VERIFIER_DIR / REWARD_JSON] = json.dumps(reward) + "\n"
        for target, document in files.items():
            _write(target, document, flag)
        written.append(out / unique / AGENT_DIR / FILE_NAME)
    return written


def _write(target: Path, document: str, flag: str) -> None:
    try:
        for folder in (target.parent.parent, target.parent):
            if folder.exists() and not folder.is_dir():
                raise InvalidInput("exists and is not a directory (each trajectory gets a folder)",
                                   path=str(folder), field=flag)
        if target.is_dir():
            raise InvalidInput("exists and is a directory", path=str(target), field=flag)
        atomic_write(target, document, flag)
    except OSError as exc:
        if (bad := write_error(exc, target, flag)) is not None:
            raise bad from None
        raise
