"""Replay: a recorded cassette served back as the model, the guest and the clock.

Each of the three streams is served in order. A call that differs from the
recording is a :class:`~runner.core.errors.ReplayMismatch` naming where, and
so is a run that ends with recorded events left unserved: either way the run
diverged from the one recorded. :func:`spec_change` says whether the spec the
cassette was recorded from has changed since, which makes the recording stale
however faithfully it replays.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.core.cassette import Cassette, CassetteWriter, digest, first_difference
from runner.core.clock import Clock
from runner.core.errors import (
    ContextExhausted,
    GuestDown,
    InvalidInput,
    ModelServerError,
    ReplayMismatch,
)
from runner.core.guest import CommandResult, Guest, HttpResult, RebootResult
from runner.core.machines import Machines
from runner.core.model import ChatRequest, Model, ModelReply
from runner.core.outcomes import AgentKind
from runner.core.paths import contained, default_spec_dirs
from runner.core.spec import (
    PROSE_KEYS,
    Scenario,
    read_text,
    scenario_from_text,
    scenario_to_dict,
    scenario_view,
    spec_files,
)
from runner.core.yamlfile import parse_yaml


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class _Stream:
    """One kind of recorded event, served in order; what is left at the end is a divergence too."""

    def __init__(self, events: list[dict[str, Any]], what: str,
                 describe: Callable[[dict[str, Any]], str]) -> None:
        self._events = events
        self.what = what
        self.served = 0
        self._describe = describe
        self.lock = threading.Lock()  # the machines of a run share one stream (and reboot from threads)

    def next(self, wanted: str | Callable[[], str],
             prefer: Callable[[dict[str, Any]], bool] | None = None,
             unordered: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        """The next event; with ``prefer``, the first event it accepts among the run of events
        from here on that ``unordered`` says happened side by side (their order is not
        recorded), brought forward. ``wanted`` says what the run asked for, for the message
        when nothing is left (a callable: made only then, as a replay asks ~100 times a run)."""
        if prefer is not None and unordered is not None:
            i = self.served
            while i < len(self._events) and unordered(self._events[i]):
                if prefer(self._events[i]):
                    self._events.insert(self.served, self._events.pop(i))
                    break
                i += 1
        if self.served >= len(self._events):
            raise ReplayMismatch(f"the cassette has no more {self.what} events "
                                 f"(after {self.served}); the run wanted "
                                 f"{wanted if isinstance(wanted, str) else wanted()}")
        event = self._events[self.served]
        self.served += 1
        return event

    def unserved(self) -> str | None:
        """Why the run stopped short of the recording, or None when it used every event."""
        left = len(self._events) - self.served
        if left <= 0:
            return None
        first = self._describe(self._events[self.served])
        return (f"{self.what} event {self.served + 1}: the run ended, the cassette has "
                f"{left} more (the next: {first})")


class ReplayClock(Clock):
    """Serves the recorded clock readings."""

    def __init__(self, cassette: Cassette, writer: CassetteWriter | None = None) -> None:
        super().__init__(writer)
        self._stream = _Stream(cassette.stream("clock"), "clock", lambda e: f"t={e.get('t')}")

    def now(self) -> float:
        t = float(self._stream.next("a clock reading")["t"])
        if self._writer is not None:
            self._writer.write({"type": "clock", "t": t})
        return t

    def sleep(self, seconds: float) -> None:
        return None

    def unserved(self) -> str | None:
        """Clock readings the run never asked for, as a mismatch message (None if none)."""
        return self._stream.unserved()


class ReplayModel(Model):
    """Serves recorded replies; a request that differs from the recording is an error.

    With ``lenient`` a differing request is served the recorded reply anyway,
    which is what replaying against a real VM (different PIDs, timestamps) needs.
    """

    def __init__(self, cassette: Cassette, lenient: bool = False) -> None:
        self._stream = _Stream(cassette.stream("model"), "model",
                               lambda e: f"the reply to turn {e.get('turn')}")
        self._lenient = lenient
        # What the loop decided of each reply, when the cassette says (older ones do not).
        decisions = cassette.stream("decision")
        self._decisions = _Stream(decisions, "decision",
                                  lambda e: f"{e.get('action')} in turn {e.get('turn')}")
        self._check_decisions = bool(decisions)
        self._fingerprint = dict(cassette.head.model)
        self.name = cassette.head.model_name or "replay"
        self.agent = cassette.head.model_kind
        self.turn = 0
        self.mismatches: list[str] = []

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        self.turn += 1
        event = self._stream.next(f"the reply to turn {self.turn}")
        recorded = event.get("request", {})
        # request_record's digest, without its digest of each message: first_difference makes
        # those when there is a difference to find (a replay asks ~4,000 requests a run)
        if recorded.get("digest") != digest(request.payload()):
            why = f"turn {self.turn}: the request differs from the recording: " \
                  f"{first_difference(recorded, request)}"
            if not self._lenient:
                raise ReplayMismatch(why)
            self.mismatches.append(why)
        if event["type"] == "model-error":
            message = str(event.get("error", "recorded model error"))
            attempts = event.get("attempts", [])
            if event.get("kind") == "context":
                raise ContextExhausted(message, attempts=attempts)
            raise ModelServerError(message, attempts=attempts,
                                   out_of_time=event.get("kind") == "deadline")
        reply = event["reply"]
        return ModelReply(message=reply["message"], raw=reply.get("raw", {}),
                          usage=reply.get("usage", {}), duration=reply.get("duration", 0.0),
                          attempts=reply.get("attempts", []))

    def decided(self, decision: Mapping[str, Any]) -> None:
        """The run's decision must be the recorded one, field for field: a report shows the
        recorded decisions, so a cassette that replays the same says what the loop did.

        A cassette recorded before decisions were has none, and nothing to check.
        """
        if not self._check_decisions:
            return
        try:
            event = self._decisions.next(f"{decision.get('action')} in turn {decision.get('turn')}")
        except ReplayMismatch as exc:
            if not self._lenient:
                raise
            self.mismatches.append(str(exc))
            return
        recorded = {k: v for k, v in event.items() if k != "type"}
        now = json.loads(json.dumps(dict(decision), default=str))  # as the recorder writes it
        for key in sorted(recorded.keys() | now.keys()):
            if recorded.get(key) != now.get(key):
                why = (f"decision {self._decisions.served} (turn {now.get('turn')}): {key}: "
                       f"the run decided {_short(now.get(key))}, the cassette has "
                       f"{_short(recorded.get(key))}")
                if not self._lenient:
                    raise ReplayMismatch(why)
                self.mismatches.append(why)
                return

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)

    def unserved(self) -> str | None:
        """Recorded turns (or decisions) the run never got to, as a mismatch message (None if
        none)."""
        return self._stream.unserved() or self._decisions.unserved()


@dataclass(frozen=True)
class ReplyCheck:
    """One recorded turn asked again of a live model: what it said (text and tool calls),
    whether that is the recorded reply, and the live server's own timings of it
    (``raw["timings"]``, llama-server's)."""

    turn: int
    reply: Any
    same: bool
    timings: dict[str, Any]


def _said(message: Mapping[str, Any]) -> Any:
    """What a reply says: its text and tool calls, not the ids a server makes up per reply."""
    calls = [{"name": (c.get("function") or {}).get("name"),
              "arguments": (c.get("function") or {}).get("arguments")}
             for c in message.get("tool_calls") or []]
    return message.get("content") or "", calls


class ShadowedReplayModel(ReplayModel):
    """Serves the recorded replies, as :class:`ReplayModel` does, and asks ``live`` every same
    request too, keeping whether its reply is the recorded one (:attr:`checks`).

    Why: whether a model server reproduces a recording (another build, speculative decoding)
    is a question about its replies to the very requests recorded, and an offline replay
    rebuilds those requests exactly (their digests are checked) with no VM. The run itself
    follows the recording whatever ``live`` says, so every turn is asked."""

    def __init__(self, cassette: Cassette, live: Model) -> None:
        super().__init__(cassette)
        self.live = live
        self.checks: list[ReplyCheck] = []

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        recorded = super().complete(request, timeout)
        now = self.live.complete(request, timeout)
        said = _said(now.message)
        self.checks.append(ReplyCheck(self.turn, said, said == _said(recorded.message),
                                      dict(now.raw.get("timings") or {})))
        return recorded


def _served(given: dict[str, Any]) -> dict[str, Any]:
    """The part of a guest call that decides its answer (not its timeout or output cap)."""
    return {k: v for k, v in given.items() if k not in ("timeout", "output_limit")}


# Cassettes recorded before the clean channel was renamed call it "probe".
_OLD_OPS = {"probe": "clean"}


def _on(event: dict[str, Any]) -> str:
    machine = event.get("machine")
    return f" on {machine}" if machine is not None else ""


class ReplayGuest(Guest):
    """Serves recorded guest exchanges, in order, checking each call matches.

    A multi-machine run's exchanges are one stream in the order they happened,
    each naming its machine (none: the first): :meth:`for_scenario` gives the
    run its machines, each a view of that one stream that checks the machine
    as it checks the op and the input.
    """

    def __init__(self, cassette: Cassette | None = None, *, machine: str | None = None,
                 stream: _Stream | None = None) -> None:
        if stream is None:
            assert cassette is not None
            stream = _Stream(cassette.stream("guest"), "guest",
                             lambda e: f"{e.get('op')}{_on(e)} {_short(e.get('input'))}")
        self._stream = stream
        self.machine = machine

    def for_scenario(self, scenario: Scenario) -> Guest:
        """The guest the episode is given: this one, or the scenario's machines served from it."""
        if not scenario.machines:
            return self
        return Machines({m.name: ReplayGuest(machine=None if i == 0 else m.name,
                                             stream=self._stream)
                         for i, m in enumerate(scenario.machines)}, scenario.agent_machine)

    def _next(self, op: str, given: dict[str, Any]) -> dict[str, Any]:
        with self._stream.lock:
            return self._serve(op, given)

    def _serve(self, op: str, given: dict[str, Any]) -> dict[str, Any]:
        # The machines of a run reboot side by side: among the reboots recorded in a row, this
        # machine's is served whatever its place (single-machine cassettes have one at most).
        rebooting = op == "reboot"
        event = self._stream.next(
            lambda: f"{op} {_short(_served(given))}",
            prefer=(lambda e: e.get("machine") == self.machine) if rebooting else None,
            unordered=(lambda e: e.get("op") == "reboot") if rebooting else None)
        # A changed timeout or cap does not change what was served; a changed command does.
        then_op = str(event.get("op"))
        recorded_op = _OLD_OPS.get(then_op, then_op)
        where = f"guest exchange {self._stream.served}"
        if event.get("machine") != self.machine:
            here = self.machine or "the first machine"
            raise ReplayMismatch(
                f"{where}: machine: the run wanted {op} {_short(_served(given))} on {here}, "
                f"the cassette has it on {event.get('machine') or 'the first machine'}")
        if recorded_op != op:
            raise ReplayMismatch(
                f"{where}: op: the run wanted {op} {_short(_served(given))}, the cassette has "
                f"{event.get('op')} {_short(_served(event.get('input') or {}))}")
        now, then = _served(given), _served(event.get("input") or {})
        for key in sorted(now.keys() | then.keys()) if now != then else ():
            if now.get(key) != then.get(key):
                raise ReplayMismatch(
                    f"{where} ({op}): input.{key}: the run wanted {_short(now.get(key))}, "
                    f"the cassette has {_short(then.get(key))}")
        result = event["result"]
        if result.get("error") == "guest-down":
            raise GuestDown(str(result.get("message", "guest down (recorded)")))
        return result

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        given = {"command": command, "timeout": timeout, "output_limit": output_limit}
        return CommandResult(**self._next("exec", given))

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        return CommandResult(**self._next("clean", {"command": command, "timeout": timeout}))

    def inspect(self, question: str, timeout: float) -> CommandResult:
        return CommandResult(**self._next("inspect", {"question": question, "timeout": timeout}))

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        given = {"port": guest_port, "path": path, "timeout": timeout}
        return HttpResult(**self._next("http", given))

    def alive(self) -> bool:
        return bool(self._next("alive", {})["alive"])

    def reboot(self, timeout: float) -> RebootResult:
        return RebootResult(**self._next("reboot", {"timeout": timeout}))

    def unserved(self) -> str | None:
        """Guest exchanges the run never made, as a mismatch message (None if none)."""
        return self._stream.unserved()


# --- has the spec changed since the recording? -----------------------------------------------

# (a spec file's path, the sha256 of its text) -> the id in it, None when it does not load. A
# replay looks one spec up per cassette, a thousand times over the same few files: each file
# is parsed once per process, and a file whose text changed is another key, never served stale.
_SPEC_IDS: dict[tuple[str, str], str | None] = {}
_SPEC_IDS_MAX = 4096  # a long-lived process (the MCP server) keeps no more than this


def _spec_id(path: Path) -> tuple[str | None, str]:
    """The ``id`` of the spec at ``path`` (None if it does not load) and the sha256 of its text,
    as :func:`runner.core.spec.scenario_from_text` computes it; InvalidInput if unreadable."""
    text = read_text(path)
    digest = hashlib.sha256(text.encode()).hexdigest()
    key = (str(path), digest)
    if key not in _SPEC_IDS:
        try:
            data, _lines = parse_yaml(text, str(path))
        except InvalidInput:
            data = None  # a broken spec is not the one we look for; validate reports it
        found = data.get("id") if isinstance(data, dict) else None
        if len(_SPEC_IDS) >= _SPEC_IDS_MAX:
            _SPEC_IDS.clear()
        _SPEC_IDS[key] = found if isinstance(found, str) else None
    return _SPEC_IDS[key], digest


def _spec_files(d: Path, named: str | None) -> list[Path]:
    """The spec files of folder ``d`` that lie inside it (a symlink out of it is skipped): with
    ``named``, only ``<named>.yaml`` and ``<named>.yml``; none if ``d`` cannot be listed."""
    try:
        if not d.is_dir():
            return []
        if named is None:
            found = spec_files([d])
        elif "/" in named or named in ("", ".", ".."):
            return []  # an id is a file name, never a path (the header's is the user's text)
        else:
            found = [d / f"{named}.yaml", d / f"{named}.yml"]
        return [f for f in found if f.is_file() and contained(f, d) is not None]
    except (OSError, RuntimeError, ValueError):
        return []


def _spec_by_id(scenario_id: str, dirs: Iterable[Path]) -> tuple[Path, str] | None:
    """The spec file in ``dirs`` whose ``id`` is ``scenario_id``, and the sha256 of its text.

    ``<id>.yaml`` (or ``.yml``) in each folder is tried first, then every other
    spec file in the folders' order. Only files inside those folders are read:
    a spec file that is a symlink out of its folder is skipped, and a folder
    that cannot be listed holds nothing.
    """
    dirs = list(dirs)
    named = [f for d in dirs for f in _spec_files(d, scenario_id)]
    others = (f for d in dirs for f in _spec_files(d, None) if f not in named)  # listed if need be
    for f in itertools.chain(named, others):
        try:
            found, digest = _spec_id(f)
        except InvalidInput:
            continue  # unreadable: not the one we look for either
        if found == scenario_id:
            return f, digest
    return None


def spec_change(cassette: Cassette, specs_dirs: Iterable[Path] | None = None) -> str | None:
    """Why the spec ``cassette`` was recorded from does not prove its replay, or None if it does.

    The spec is looked up by the scenario's id, in ``specs_dirs`` (default:
    ``$ROOTBENCH_SPECS``, else the bundled scenarios), then in the cassette's own folder (a scenario kept
    outside the suite travels beside its cassette). Nothing else is read: the
    header's ``scenario.path`` is a field of a file the user handed over, so it
    is never opened (it could name any host file). A spec that cannot be found
    cannot show the recording is current, so the replay cannot be "same"; the
    reason says so. A cassette whose header records no ``spec_hash`` was not
    made from a spec file, and has nothing to compare. A spec whose text
    changed only where no run reads it (a shortcut or an alternative added,
    a comment) still proves the recording: the run's header holds the whole
    scenario it ran, and today's spec must record the very same one.
    """
    recorded = cassette.head.spec_hash  # format 1 without one: the scenario's, as read_header says
    if not recorded:
        return None
    scenario_id = cassette.head.scenario_id
    dirs = list(specs_dirs) if specs_dirs is not None else default_spec_dirs()
    beside = Path(cassette.path).parent
    found = _spec_by_id(scenario_id, [*dirs, beside])
    if found is None:
        where = ", ".join(str(d) for d in [*dirs, beside])
        return (f"cannot prove the replay the same: no spec with id {scenario_id!r} in {where} "
                "to check the recording against (give its folder with --specs)")
    spec, now = found
    # A scripted run (the oracle, noop, a shortcut or an alternative) never reads the task or
    # the hints: like verify, it stands for the spec whatever its prose says.
    prose = PROSE_KEYS if cassette.head.model.get("kind") in _SCRIPTED else frozenset()
    if now != recorded and _run_view(spec, now, prose) != scenario_view(cassette.head.scenario, prose):
        return f"{spec} changed since the recording (sha256 {recorded[:12]} -> {now[:12]})"
    return None


# The agents that run fixed commands and never read the task: the oracle, noop and a spec's
# shortcuts and alternatives (verify's runs).
_SCRIPTED = frozenset({AgentKind.ORACLE.value, AgentKind.NOOP.value, AgentKind.SCRIPTED.value})

# (a spec file's path, the sha256 of its text) -> the scenario view a run of it records (None
# when it does not load): asked only of a spec whose text differs from the recording's, once.
_RUN_VIEWS: dict[tuple[str, str, frozenset[str]], str | None] = {}


def _run_view(path: Path, digest: str, leave_out: frozenset[str] = frozenset()) -> str | None:
    """:func:`~runner.core.spec.scenario_view` of the spec at ``path`` as a run of it today would
    record it, or None if it does not load. Equal to a recording's view, the spec changed only
    in what no run reads (shortcuts, alternatives, comments, layout), and the recording stands."""
    key = (str(path), digest, leave_out)
    if key not in _RUN_VIEWS:
        try:
            view: str | None = scenario_view(scenario_to_dict(scenario_from_text(read_text(path), str(path))),
                                             leave_out)
        except InvalidInput:
            view = None
        if len(_RUN_VIEWS) >= _SPEC_IDS_MAX:
            _RUN_VIEWS.clear()
        _RUN_VIEWS[key] = view
    return _RUN_VIEWS[key]
