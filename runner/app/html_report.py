"""A run as a person reads it: one self-contained HTML file, opened from disk, offline.

``report.html`` holds what ran (model, fingerprint, protocol, sampling,
budgets, harness, accelerator), the verdict counts, the scenario table, a
heat map of scenarios by rounds (and by runs, when several are compared),
plots, and every episode's trajectory read back from its cassette: the
task, each turn's reply, command, exit code, duration and output, protocol
corrections, repeat notes, the probes before and after, and the verdict.

Guest output and model text are hostile. The page is rendered by Jinja2
with autoescaping on, every value passes :func:`runner.core.text.printable`
(control sequences stripped) on its way out, content never goes into a URL
or an attribute, plots are SVG inside ``<img src="data:...">`` (where no
script can run), and a Content-Security-Policy with no ``script-src`` at
all stops anything that could still slip through. There is no JavaScript:
folding is ``<details>``.

:func:`load_trajectory` (a cassette read back as turns) is also what
:mod:`runner.app.atif` exports.
"""

from __future__ import annotations

import base64
import datetime as _dt
import io
import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from runner import __version__
from runner.app.outputs import write_error
from runner.app.report import GRADED_COLUMNS
from runner.app.runs import atomic_write, load_results, relative_name, results_file, shown_path
from runner.app.signals import Interrupted
from runner.app.stats import deciding, pass_count, verdict_counts, wilson
from runner.core import layout
from runner.core.cassette import Cassette, digest
from runner.core.episode import GRADED_FIELDS
from runner.core.episode import Episode as Result
from runner.core.errors import InvalidInput
from runner.core.outcomes import AgentKind, Verdict
from runner.core.protocol import PROTOCOLS, BudgetLeft, Finish, RunCommand, Violation
from runner.core.spec import Scenario, task_text
from runner.core.text import one_line, printable

log = logging.getLogger("rootbench.report")

REPORT_NAME = layout.REPORT
LONG_OUTPUT_LINES = 12  # longer command output is folded
LONG_OUTPUT_CHARS = 1200
# Any one text shown (an output, a reply, a task): real runs cap outputs at the scenario's
# output_limit (4000 by default); a crafted cassette's 10 MB output must not make a 25 MB page.
MAX_SHOWN_CHARS = 20_000
OPEN_TRAJECTORIES = 6  # up to this many episodes in a report, trajectories start unfolded
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


def text(value: Any) -> str:
    """Any value as text fit for the page: control sequences stripped, encodable."""
    if value is None:
        return ""
    return printable(value if isinstance(value, str) else str(value))


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int:
    n = _num(value)
    return int(n) if n is not None else 0


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# --- a cassette read back as a trajectory -----------------------------------------------------

@dataclass
class Command:
    """One command the agent ran, with what came back."""

    command: str
    call_id: str | None = None
    timeout: float | None = None  # the timeout the agent asked for, if it did
    exit_code: int | None = None
    duration: float | None = None
    output: str = ""
    timed_out: bool = False
    truncated: bool = False
    guest_down: str = ""  # the guest stopped answering during this command
    ran: bool = True  # False: the cassette ends before the command's result
    unsafe: bool = False
    times_run: int = 1  # how often this exact command has run so far in the episode

    @property
    def long(self) -> bool:
        return self.output.count("\n") >= LONG_OUTPUT_LINES or len(self.output) > LONG_OUTPUT_CHARS


@dataclass
class Turn:
    """One model call and what the agent did with its reply."""

    number: int
    content: str = ""  # the reply's text as sent
    thought: str = ""  # the JSON protocol's "thought", when the reply has one
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments)
    commands: list[Command] = field(default_factory=list)
    finish: str | None = None  # the agent's summary, when it finished here
    corrections: list[str] = field(default_factory=list)  # protocol violations it was told about
    error: str = ""  # a model call that failed (model-error)
    error_kind: str = ""
    seconds: float = 0.0  # the model call
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_ms: float = 0.0
    gen_ms: float = 0.0
    sent: str = ""  # the last message the model was sent (the task, an observation, a correction)
    sent_role: str = ""
    last_action: str = ""  # "command", "correction" or "finish": what the next request answers

    @property
    def command_seconds(self) -> float:
        return sum(c.duration or 0.0 for c in self.commands)


@dataclass
class SetupStep:
    command: str
    exit_code: int | None
    duration: float | None
    output: str


@dataclass
class Trajectory:
    """What one cassette says happened, ready to show or export."""

    path: Path
    header: dict[str, Any]
    scenario: dict[str, Any]
    verdict: dict[str, Any] | None  # the Episode as written (None: the cassette was cut short)
    system_prompt: str = ""
    system_prompt_note: str = ""  # how sure we are the prompt shown is the one sent
    task: str = ""
    setup: list[SetupStep] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    # What the report calls the cassette, set by the loader: relative to the run directory, or
    # its file name; never a local absolute path.
    shown: str = ""

    @property
    def protocol(self) -> str:
        return text(_dict(self.header.get("protocol")).get("name")) or "?"

    @property
    def model_name(self) -> str:
        return text(_dict(self.header.get("model")).get("name")) or "?"


def _system_prompt(header: dict[str, Any], first_request: dict[str, Any]) -> tuple[str, str]:
    """The system prompt, rebuilt as the harness writes it, checked against the recorded digest."""
    scenario = _dict(header.get("scenario"))
    protocol = PROTOCOLS.get(str(_dict(header.get("protocol")).get("name")))
    budget = _dict(scenario.get("budget"))
    if protocol is None or _num(budget.get("turns")) is None or _num(budget.get("seconds")) is None:
        return "", "not recorded, and the protocol or budget is unknown"
    own = scenario.get("system_prompt") if isinstance(scenario.get("system_prompt"), str) else None
    prompt = protocol().system_prompt(own, BudgetLeft(turns=_int(budget["turns"]),
                                                      seconds=float(budget["seconds"])))
    recorded = _list(first_request.get("messages"))
    if not recorded:
        return prompt, "rebuilt by this harness (the cassette has no model call to check it against)"
    if recorded[0] == digest({"role": "system", "content": prompt}):
        return prompt, "exactly as sent (its digest matches the recording)"
    return prompt, ("as this harness would write it; the one sent then differs "
                    "(the recorded digest does not match)")


def _reply_text(message: Any) -> str:
    if not isinstance(message, dict):
        return text(message)
    content = message.get("content")
    if isinstance(content, list):
        return text("".join(str(_dict(p).get("text", "")) for p in content))
    return text(content)


def _thought(content: str) -> str:
    try:
        obj = json.loads(content)
    except (ValueError, RecursionError):
        return ""
    return text(obj.get("thought")) if isinstance(obj, dict) else ""


def _tool_calls(message: Any) -> list[tuple[str, str, str]]:
    calls = []
    for call in _list(_dict(message).get("tool_calls")):
        fn = _dict(_dict(call).get("function"))
        args = fn.get("arguments")
        calls.append((text(_dict(call).get("id")), text(fn.get("name")),
                      text(args if isinstance(args, str) else json.dumps(args))))
    return calls


def _usage(turn: Turn, usage: dict[str, Any]) -> None:
    turn.prompt_tokens = _int(usage.get("prompt_tokens"))
    turn.completion_tokens = _int(usage.get("completion_tokens"))
    turn.cached_tokens = _int(usage.get("cached_tokens"))
    turn.prompt_ms = _num(usage.get("prompt_ms")) or 0.0
    turn.gen_ms = _num(usage.get("predicted_ms")) or 0.0


def _result(cmd: Command, event: dict[str, Any]) -> None:
    result = _dict(event.get("result"))
    if result.get("error") == "guest-down":
        cmd.guest_down = text(result.get("message")) or "the guest stopped answering"
        return
    code = _num(result.get("exit_code"))
    cmd.exit_code = int(code) if code is not None else None
    cmd.duration = _num(result.get("duration"))
    cmd.output = text(result.get("output"))
    cmd.timed_out = bool(result.get("timed_out"))
    cmd.truncated = bool(result.get("truncated"))


def _task(scenario: dict[str, Any], header: dict[str, Any]) -> str:
    """The task as the model was sent it: with the header's hint level, ending with its hints."""
    task, level = scenario.get("task"), header.get("hint_level")
    hints = tuple(h for h in _list(scenario.get("hints")) if isinstance(h, str))
    if (isinstance(task, str) and isinstance(level, int) and not isinstance(level, bool)
            and 0 < level <= len(hints)):
        return text(task_text(Scenario(id="", title="", image="", task=task, hints=hints), level))
    return text(task)


def load_trajectory(path: Path | str) -> Trajectory:
    """Read a cassette back as a trajectory (raises InvalidInput if it is not a cassette)."""
    cas = Cassette.load(path)
    header = cas.header
    scenario = _dict(header.get("scenario"))
    traj = Trajectory(path=Path(path), header=header, scenario=scenario, verdict=cas.verdict,
                      task=_task(scenario, header))
    protocol_cls = PROTOCOLS.get(str(_dict(header.get("protocol")).get("name")))
    unsafe = {c for c in _list(_dict(cas.verdict).get("unsafe_commands")) if isinstance(c, str)}
    setup = [c for c in _list(scenario.get("setup")) if isinstance(c, str)]
    runs: Counter[str] = Counter()
    turn: Turn | None = None
    pending: list[Command] = []  # commands of the current turn still waiting for their result
    first_request: dict[str, Any] = {}

    for event in cas.events:
        kind = event.get("type")
        if kind in ("model", "model-error"):
            request = _dict(event.get("request"))
            first_request = first_request or request
            turn = Turn(number=_int(event.get("turn")) or len(traj.turns) + 1)
            last = _dict(request.get("last"))
            turn.sent, turn.sent_role = text(last.get("content")), text(last.get("role"))
            traj.turns.append(turn)
            pending = []
            if kind == "model-error":
                turn.error = text(event.get("error")) or "the model call failed"
                turn.error_kind = text(event.get("kind"))
                continue
            reply = _dict(event.get("reply"))
            message = reply.get("message")
            turn.content = _reply_text(message)
            turn.thought = _thought(turn.content) if traj.protocol == "json" else ""
            turn.tool_calls = _tool_calls(message)
            turn.seconds = _num(reply.get("duration")) or 0.0
            _usage(turn, _dict(reply.get("usage")))
            actions = protocol_cls().parse(message if isinstance(message, dict) else {}) \
                if protocol_cls else []
            for action in actions:
                if isinstance(action, Finish):
                    turn.finish = text(action.summary)
                    turn.last_action = "finish"
                    break  # the loop stops at a finish: later actions never ran
                if isinstance(action, Violation):
                    turn.corrections.append(text(action.reason))
                    turn.last_action = "correction"
                elif isinstance(action, RunCommand):
                    key = action.command.strip()
                    runs[key] += 1
                    turn.last_action = "command"
                    cmd = Command(command=text(action.command), call_id=action.call_id,
                                  timeout=action.timeout, unsafe=action.command in unsafe,
                                  times_run=runs[key], ran=False)
                    turn.commands.append(cmd)
                    pending.append(cmd)
        elif kind == "guest":
            op = event.get("op")
            given = _dict(event.get("input"))
            next_setup = setup[len(traj.setup)] if len(traj.setup) < len(setup) else None
            if turn is None and op in ("clean", "probe") and given.get("command") == next_setup:
                result = _dict(event.get("result"))
                code = _num(result.get("exit_code"))
                traj.setup.append(SetupStep(text(given.get("command")),
                                            int(code) if code is not None else None,
                                            _num(result.get("duration")), text(result.get("output"))))
            elif op == "exec" and turn is not None:
                if pending:
                    cmd = pending.pop(0)
                else:  # a command the re-parse did not predict: show it all the same
                    key = str(given.get("command", "")).strip()
                    runs[key] += 1
                    cmd = Command(command=text(given.get("command")), times_run=runs[key])
                    turn.commands.append(cmd)
                cmd.ran = True
                _result(cmd, event)
    traj.system_prompt, traj.system_prompt_note = _system_prompt(header, first_request)
    return traj


# --- runs: what one report column is made of ---------------------------------------------------

@dataclass
class Episode:
    """One row of a run: the Episode dict as written, plus its trajectory (when readable)."""

    data: dict[str, Any]
    trajectory: Trajectory | None = None
    problem: str = ""  # why there is no trajectory
    anchor: str = ""
    result: Result | None = None  # ``data`` read as an Episode (None: it is not one, e.g. cut short)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def scenario(self) -> str:
        return text(self.data.get("scenario")) or "?"

    @property
    def round(self) -> int:
        return _int(self.data.get("round"))

    @property
    def hint_level(self) -> int:
        return _int(self.data.get("hint_level"))

    @property
    def verdict(self) -> str:
        return text(self.data.get("verdict")) or "incomplete"

    @property
    def flags(self) -> list[str]:
        return [text(f) for f in _list(self.data.get("flags"))]

    @property
    def unsafe(self) -> list[str]:
        return [text(c) for c in _list(self.data.get("unsafe_commands"))]

    @property
    def seconds(self) -> float:
        return _num(self.data.get("seconds")) or 0.0

    @property
    def turns(self) -> int:
        return _int(self.data.get("turns"))

    def probes(self, key: str) -> list[dict[str, str]]:
        """Probe results (``probes``, ``invariants``, ``precheck``, ``baseline``) as text."""
        return [{k: text(_dict(p).get(k)) for k in ("name", "kind", "outcome", "detail")}
                for p in _list(self.data.get(key))]


@dataclass
class Run:
    """One run: a run directory, or loose cassettes of one model and protocol."""

    label: str
    source: str
    info: dict[str, Any] = field(default_factory=dict)  # results.json "run", when there is one
    episodes: list[Episode] = field(default_factory=list)


def _as_result(data: dict[str, Any]) -> Result | None:
    """A verdict line as an Episode, or None when it is not one (a cassette is a file handed
    over: any field may be of any type)."""
    try:
        return Result.from_dict(data)
    except (TypeError, ValueError, AttributeError):
        return None


def _episode_from_cassette(path: Path, shown: str | None = None) -> Episode:
    """The cassette at ``path`` as an episode; ``shown`` is what the report calls it (default:
    its file name)."""
    named = layout.parse_cassette_name(path.name)
    scenario = named.scenario if named else layout.cassette_stem(path)
    try:
        traj = load_trajectory(path)
    except InvalidInput as exc:
        return Episode({"scenario": scenario, "verdict": "incomplete"},
                       problem=text(exc).replace(str(path), shown or path.name))
    traj.shown = shown or path.name
    data = dict(traj.verdict or {})
    data.pop("type", None)
    if not data:
        n = len(traj.turns)
        data = {"scenario": traj.scenario.get("id") or scenario, "verdict": "incomplete",
                "round": traj.header.get("round", 0), "hint_level": traj.header.get("hint_level", 0),
                "model": traj.model_name, "protocol": traj.protocol, "turns": n,
                "commands": sum(len(t.commands) for t in traj.turns),
                "reason": f"the cassette was cut short: it ends after {n} "
                          f"turn{'' if n == 1 else 's'}, before a verdict"}
        return Episode(data, traj)
    return Episode(data, traj, result=_as_result(data))


def _inside(path: Path, root: Path) -> bool:
    """``path``, symlinks followed, is ``root`` or under it (both resolved)."""
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a symlink loop, a name too long
        return False


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
        candidates.append(layout.cassette_path(run_dir, ep["scenario"], _int(ep.get("round")),
                                               _int(ep.get("hint_level")), arm))
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
        if _inside(c, root):
            return c, ""
        outside = True
    if outside:
        return None, "its cassette is outside the run directory (not read)"
    return None, "its cassette is not in the run directory"


def load_run_dir(run_dir: Path | str) -> Run:
    """A bench's run directory: results.json, and each episode's cassette when it is there."""
    run_dir = Path(run_dir)
    results_file(run_dir)  # says what is there instead, when it is not a results file
    info, episodes = load_results(run_dir)
    run = Run(label=text(run_dir.name), source=text(shown_path(run_dir)), info=info)
    for ep in episodes:
        data = ep.to_dict()
        cassette, why = _find_cassette(run_dir, data)
        if cassette is None:
            run.episodes.append(Episode(data, problem=why, result=ep))
            continue
        read = _episode_from_cassette(cassette, relative_name(str(cassette.resolve()), run_dir))
        run.episodes.append(Episode(data, read.trajectory, read.problem, result=ep))
    return run


def load_run_arms(run_dir: Path | str) -> list[Run]:
    """A run directory as runs to show side by side: itself, or one run per arm of a matrix
    bench (model x protocol), each labelled ``<dir> · <arm>``, in the order the bench ran them."""
    run = load_run_dir(run_dir)
    arms = list(dict.fromkeys(text(ep.get("arm")) for ep in run.episodes if ep.get("arm")))
    if not arms:
        return [run]
    return [Run(label=f"{run.label} · {arm}", source=run.source, info=run.info,
                episodes=[ep for ep in run.episodes if text(ep.get("arm")) == arm])
            for arm in arms]


def runs_from_cassettes(paths: Iterable[Path | str]) -> list[Run]:
    """Loose cassettes, one run per model and protocol (in the order first seen)."""
    runs: dict[tuple[str, str], Run] = {}
    for path in map(Path, paths):
        ep = _episode_from_cassette(path)
        model = ep.trajectory.model_name if ep.trajectory else text(ep.get("model")) or "?"
        protocol = ep.trajectory.protocol if ep.trajectory else text(ep.get("protocol")) or "?"
        key = (model, protocol)
        if key not in runs:
            runs[key] = Run(label=f"{model} · {protocol}", source=text(shown_path(path.parent)))
        runs[key].episodes.append(ep)
    return list(runs.values())


# --- the overview --------------------------------------------------------------------------------

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


def _facts(run: Run) -> list[tuple[str, str]]:
    """What ran, from the cassette headers and results.json's ``run``."""
    headers = [ep.trajectory.header for ep in run.episodes if ep.trajectory]
    agent = _dict(run.info.get("agent"))
    options = _dict(run.info.get("options"))
    fps = [_dict(h.get("model")) for h in headers]

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
        f"{text(_dict(h.get('protocol')).get('name'))} ({text(_dict(h.get('protocol')).get('reason'))})"
        for h in headers) if headers else text(options.get("protocol")) or "-"))
    sampling = _distinct(_fmt(f.get("sampling")) for f in fps if f.get("sampling"))
    if sampling == "-" and agent:
        sampling = _fmt({k: agent.get(k) for k in ("temperature", "seed", "max_tokens")
                         if k in agent})
    facts.append(("sampling", sampling or "-"))
    if agent.get("ctx_size") is not None:
        facts.append(("context window", _fmt(agent.get("ctx_size"))))
    facts.append(("budgets", _distinct(_budget(_dict(ep.trajectory.scenario.get("budget")))
                                        for ep in run.episodes if ep.trajectory)))
    facts.append(("harness", _distinct([
        *(text(_dict(h.get("harness")).get("version")) for h in headers),
        text(run.info.get("harness"))])))
    images = [_dict(h.get("image")) for h in headers]
    facts.append(("accelerator", _distinct(
        [*(text(i.get("accel")) for i in images),
         *(f"{text(_dict(h.get('options')).get('accel'))} asked" for h in headers),
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


def _counts(run: Run) -> dict[str, int]:
    """Episodes per verdict (:func:`verdict_counts`), and the cassettes cut short before one."""
    out = verdict_counts([ep.result for ep in run.episodes if ep.result is not None])
    if incomplete := sum(ep.result is None for ep in run.episodes):
        out["incomplete"] = incomplete
    return out


# Columns another part of the harness may add to Episode; shown when any episode has them. The
# hint level is the level the episode ran at; a round's assist (the lowest level that passed,
# see runner.app.stats) is what the heat map shows.
OPTIONAL_COLUMNS = (("hint_level", "hint level"), *GRADED_COLUMNS)


def _optional_columns(runs: Sequence[Run]) -> list[tuple[str, str]]:
    return [(key, title) for key, title in OPTIONAL_COLUMNS
            if any(ep.get(key) is not None for run in runs for ep in run.episodes)]


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "fixed_at" and isinstance(value, dict):  # {"turn", "seconds"}
        turn, seconds = _num(value.get("turn")), _num(value.get("seconds"))
        if turn is not None and seconds is not None:
            return f"{seconds:.1f} s (turn {turn:g})"
    n = _num(value)
    if key == "fixed_at" and n is not None:
        return f"{n:.1f} s"
    if n is not None:
        return f"{n:.2f}" if key in ("score", "milestone_fraction") else f"{n:g}"
    return _fmt(value)


def _row(ep: Episode, optional: list[tuple[str, str]]) -> dict[str, Any]:
    tokens_in, tokens_out = _int(ep.get("tokens_in")), _int(ep.get("tokens_out"))
    return {
        "scenario": ep.scenario, "round": ep.round + 1, "verdict": ep.verdict,
        "flags": ", ".join(text(f) for f in _list(ep.get("flags"))) or "",
        "turns": _int(ep.get("turns")), "commands": _int(ep.get("commands")),
        "repeats": _int(ep.get("repeats")),
        "seconds": f"{_num(ep.get('seconds')) or 0.0:.1f}",
        "tokens": f"{tokens_in} / {tokens_out}" if tokens_in or tokens_out else "-",
        "extra": [_cell(key, ep.get(key)) for key, _title in optional],
        "reason": text(ep.get("reason")), "anchor": ep.anchor,
    }


def _deciding(run: Run) -> dict[tuple[str, int], Episode]:
    """Per (scenario, round), the episode its heat map cell shows: the one that decides the round
    (:func:`runner.app.stats.deciding`: in a ladder, the pass at the lowest level, else the last
    level tried); a round of cassettes cut short only, its last one."""
    cells = {(ep.scenario, ep.round): ep for ep in run.episodes}  # every round has a cell
    by_result = {id(ep.result): ep for ep in run.episodes if ep.result is not None}
    for key, result in deciding([ep.result for ep in run.episodes if ep.result]).items():
        cells[key] = by_result[id(result)]
    return cells


def _heatmap(runs: Sequence[Run]) -> dict[str, Any]:
    """Scenarios (rows) by run and round (columns); each cell the round's verdict, the hint level
    it passed at when above 0, and a link to that episode."""
    scenarios = list(dict.fromkeys(ep.scenario for run in runs for ep in run.episodes))
    columns = []
    for i, run in enumerate(runs):
        for r in sorted({ep.round for ep in run.episodes}):
            columns.append((i, r, f"r{r + 1}"))
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


# --- plots ---------------------------------------------------------------------------------------

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


def plots(runs: Sequence[Run]) -> list[Plot] | None:
    """The report's plots as SVG data URIs; None when matplotlib is not installed."""
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
            out.append(Plot("Pass rate per scenario", "pass rate per scenario, one bar per run",
                            _svg_uri(fig)))

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
            out.append(Plot("Seconds and tokens per turn", "mean seconds and tokens at each turn",
                            _svg_uri(fig)))

        timed = [(run, ep) for run in runs for ep in run.episodes
                 if (_num(ep.get("prompt_ms")) or 0) + (_num(ep.get("gen_ms")) or 0) > 0][:40]
        if timed:
            fig = Figure(figsize=(7.5, 0.6 + 0.25 * len(timed)))
            ax = fig.subplots()
            labels = [(f"{run.label[:24]}: " if len(runs) > 1 else "")
                      + f"{ep.scenario[:30]} r{ep.round + 1}" for run, ep in timed]
            prompt = [(_num(ep.get("prompt_ms")) or 0.0) / 1000 for _run, ep in timed]
            gen = [(_num(ep.get("gen_ms")) or 0.0) / 1000 for _run, ep in timed]
            ys = list(range(len(timed)))
            ax.barh(ys, prompt, color="#2b6cb0", label="prompt processing")
            ax.barh(ys, gen, left=prompt, color="#dd6b20", label="generation")
            ax.set_yticks(ys, labels)
            ax.invert_yaxis()
            ax.set_xlabel("seconds of model time")
            ax.legend(fontsize=7, ncols=2, loc="lower center", bbox_to_anchor=(0.5, 1.0),
                      frameon=False)
            out.append(Plot("Prompt processing vs generation time",
                            "model seconds per episode, prompt processing and generation", _svg_uri(fig)))
    return out


# --- rendering -----------------------------------------------------------------------------------

def shown(value: str, limit: int | None = None) -> str:
    """``value`` cut to ``limit`` characters (default :data:`MAX_SHOWN_CHARS`), saying by how much.

    A real run caps what the model is sent of each output (the budget's
    ``output_limit``); a cassette handed over may hold anything up to its own
    size cap, and a report shows every text of it, so each is cut here.
    """
    limit = MAX_SHOWN_CHARS if limit is None else limit
    if len(value) <= limit:
        return value
    return (f"{value[:limit]}\n[... {len(value) - limit:,} more characters of "
            f"{len(value):,} cut from the report; the cassette has them all]")


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}`` the template emits passes here first: cleaned text, never markup,
    at most :data:`MAX_SHOWN_CHARS` characters of it."""
    if value is None:
        return ""
    if isinstance(value, markupsafe.Markup):  # a macro's output: made here, its values already cleaned
        return value
    return value if isinstance(value, int | float) and not isinstance(value, bool) \
        else shown(text(value))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("runner.app", "templates"),
        autoescape=True,  # every template, whatever its name: nothing is ever emitted raw
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        trim_blocks=True, lstrip_blocks=True,
    )
    env.globals.update(vclass=_verdict_class, oclass=_outcome_class, short=_short)
    return env


_VERDICT_CLASS = {"pass": "v-pass", "fail": "v-fail", "infra-error": "v-infra",
                  "invalid-scenario": "v-invalid"}
_SHORT = {"pass": "pass", "fail": "fail", "infra-error": "infra", "invalid-scenario": "invalid"}


def _verdict_class(verdict: Any) -> str:
    """A CSS class from a fixed list: verdict text never reaches an attribute."""
    return _VERDICT_CLASS.get(verdict, "v-other") if isinstance(verdict, str) else "v-other"


def _outcome_class(outcome: Any) -> str:
    return {"pass": "o-pass", "fail": "o-fail", "error": "o-error"}.get(outcome, "o-other") \
        if isinstance(outcome, str) else "o-other"


def _short(verdict: Any) -> str:
    return _SHORT.get(verdict, "?") if isinstance(verdict, str) else "?"


def render(runs: Sequence[Run], title: str = "rootbench report") -> str:
    """The whole report for ``runs`` (side by side when there are several), as one HTML string."""
    total = sum(len(run.episodes) for run in runs)
    for i, run in enumerate(runs):
        for j, ep in enumerate(run.episodes):
            ep.anchor = f"run{i}-ep{j}"
    optional = _optional_columns(runs)
    drawn = plots(runs)
    views = []
    for run in runs:
        views.append({
            "label": run.label, "facts": _facts(run), "counts": _counts(run),
            "rows": [_row(ep, optional) for ep in run.episodes],
            "episodes": run.episodes,
        })
    page = _environment().get_template("report.html.j2").render(
        title=text(title), csp=CSP, runs=views, optional=[t for _k, t in optional],
        heatmap=_heatmap(runs), plots=drawn or [], plots_missing=drawn is None,
        wilson=True, open_trajectories=total <= OPEN_TRAJECTORIES,
        generated=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        version=__version__, extra_fields=_extra_fields)
    return page


def _extra_fields(ep: Episode) -> list[tuple[str, str]]:
    """Fields other parts of the harness add to an episode (score, milestones, ...), as text."""
    out = [(text(key), _fmt(ep.get(key))) for key in ("hint_level", *GRADED_FIELDS)
           if ep.get(key) is not None and ep.get(key) is not False and ep.get(key) not in ([], {})]
    if phases := _phases_text(ep.get("phases")):
        out.append(("phases", phases))
    return out


def _phases_text(phases: Any) -> str:
    """``restore 1.2 s · baseline 0.3 s · ...``: where the episode's time went, in run order.

    The names come from a file (a cassette may be hostile), so they pass
    :func:`text` like everything else; a value that is not a number is left out.
    """
    shown = [f"{text(name)} {seconds:.2f} s" for name, value in _dict(phases).items()
             if (seconds := _num(value)) is not None]
    return " · ".join(shown)


def write(runs: Sequence[Run], out: Path | str, title: str = "rootbench report",
          flag: str | None = None) -> Path:
    """Render ``runs`` to ``out`` (atomically, with the mode of any new file) and return its path.

    A path that cannot be written is InvalidInput naming it (and ``flag``, the
    option that chose it); the CLI checks it before any work too, this is for a
    folder that changed in between.
    """
    out = Path(out)
    page = render(runs, title)
    try:
        atomic_write(out, page)
    except OSError as exc:
        if (bad := write_error(exc, out, flag)) is not None:
            raise bad from None
        raise
    return out


def write_run_report(run_dir: Path | str) -> Path:
    """``RUNDIR/report.html`` for a bench's run directory."""
    run_dir = Path(run_dir)
    return write(load_run_arms(run_dir), run_dir / REPORT_NAME, f"rootbench: {run_dir.name}")


def write_cassette_report(cassettes: Sequence[Path | str], out: Path | str,
                          title: str = "rootbench report") -> Path:
    """A report of loose cassettes (one run per model and protocol) written to ``out``."""
    return write(runs_from_cassettes(cassettes), out, title)


def refresh(run_dir: Path | str, logger: logging.Logger, *,
            cassettes: Sequence[Path | str] | None = None) -> Path | None:
    """(Re)write ``RUNDIR/report.html``; a report that cannot be drawn is a warning, not an error.

    Benches call this after every scenario, so an interrupted bench still has
    a report; by then results.json is on disk, and a report that fails to
    render must not stop the bench nor lose what it has done. ``cassettes``:
    report these (verify's run directories have no results.json).
    """
    run_dir = Path(run_dir)
    try:
        if cassettes is None:
            return write_run_report(run_dir)
        return write_cassette_report(cassettes, run_dir / REPORT_NAME, f"rootbench: {run_dir.name}")
    except Interrupted:
        raise
    except Exception as exc:  # noqa: BLE001 - the results are on disk; a report must not cost them
        logger.warning("the HTML report could not be written: %s", one_line(str(exc)))
        return None
