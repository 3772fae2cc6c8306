"""Probes: how a verdict is decided, from the real state of the guest.

Each probe kind is a small frozen dataclass with its own :meth:`~ProbeKind.check`:
it turns into one question to the guest, and the answer is judged here on the
host. How it asks depends on the judging rules (:mod:`runner.core.rules`):
under rules 1 it runs one shell command through the guest's clean channel,
which runs the guest's own tools (``ss``, ``systemctl``, ``curl``,
``stat``); under rules 2 the service, port, file and guest-side HTTP kinds
ask the guest helper itself (:meth:`~runner.core.guest.Guest.inspect`),
which reads ``/proc``, ``lstat``s, opens its own sockets and asks systemd
over its private socket, so a tool root replaced in the guest cannot lie to
a probe. A command probe runs its command under both (what it runs is the
spec's choice). An HTTP probe ``from: host`` asks from the host under both.
Because a check needs nothing but a :class:`~runner.core.guest.Guest`, every
kind is unit-tested against recorded guest exchanges, with no VM.

A probe has three outcomes: ``pass``, ``fail``, or ``error`` when the probe
itself could not run (its tool is missing, it timed out). An error is never
counted as a fail: a broken ruler says nothing about the model.

The command strings and questions the kinds send are part of the recorded
cassettes: a replay compares them byte for byte, so changing one invalidates
every cassette that ran it; new behaviour goes under new rules.

This module does not import :mod:`runner.core.spec` (the spec loader builds
its probes from the kinds here, so the import points the other way);
:func:`run_probes` takes anything shaped like :class:`ProbeLike`.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar
from urllib.parse import urlsplit

from runner.core.clock import Clock
from runner.core.guest import CommandResult, Guest
from runner.core.outcomes import ProbeOutcome
from runner.core.patterns import search
from runner.core.registry import Registry
from runner.core.rules import Rules
from runner.core.text import tail

PROBE_TIMEOUT = 20.0  # seconds for one probe command
RETRY_INTERVAL = 0.5  # seconds between tries of a probe with ``within``
_NOT_FOUND = 127
_HTTP_MARK = "__RB_HTTP__"
_MISSING_MARK = "__RB_MISSING__"
_DETAIL = 120  # characters of a probe's output kept in its detail: the end, from a word

_PASS, _FAIL, _ERROR = ProbeOutcome.PASS, ProbeOutcome.FAIL, ProbeOutcome.ERROR

# Spec keys that are not Python identifiers, and the field each is stored in.
_FIELD_FOR_KEY = {"from": "from_"}
_KEY_FOR_FIELD = {v: k for k, v in _FIELD_FOR_KEY.items()}

_K = TypeVar("_K", bound="ProbeKind")


# --- the shared base ---------------------------------------------------------------------

@dataclass(frozen=True)
class ProbeKind(abc.ABC):
    """One kind of check, with its parameters as typed fields.

    ``written`` names the keys the spec gave, in its order. It exists because
    a spec may spell out a default (``status: 200``), and both the cassette
    header and the generated probe name show the probe as it was written; it
    takes no part in equality, since it does not change what is checked.
    """

    kind: ClassVar[str]
    written: tuple[str, ...] = field(default=(), kw_only=True, compare=False, repr=False)

    @abc.abstractmethod
    def check(self, guest: Guest, rules: Rules) -> tuple[ProbeOutcome, str]:
        """Run the probe once against ``guest`` as ``rules`` say: its outcome and what was seen."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The probe's default name, for specs that give none."""

    @classmethod
    def from_params(cls: type[_K], params: Mapping[str, Any]) -> _K:
        """Build the kind from its spec mapping (already schema-validated, or a cassette's).

        Raises TypeError for a key the kind does not have or a required one
        missing, so a damaged cassette header is reported, not half-read.
        """
        if not isinstance(params, Mapping):
            raise TypeError(f"{cls.kind} probe parameters must be a mapping, "
                            f"not {type(params).__name__}")
        names = {f.name for f in dataclasses.fields(cls) if f.name != "written"}
        values: dict[str, Any] = {}
        for key, value in params.items():
            name = _FIELD_FOR_KEY.get(key, key)
            if name not in names:
                raise TypeError(f"{cls.kind} probe has no parameter {key!r}")
            values[name] = value
        return cls(**values, written=tuple(params))

    def to_params(self) -> dict[str, Any]:
        """The spec mapping back: the written keys in their order, then any field not at its default.

        The second part covers a probe built in code (``written`` empty), so
        its required and changed fields are never lost.
        """
        out: dict[str, Any] = {}
        for key in self.written:
            out[key] = getattr(self, _FIELD_FOR_KEY.get(key, key))
        for f in dataclasses.fields(self):
            key = _KEY_FOR_FIELD.get(f.name, f.name)
            if f.name == "written" or key in out:
                continue
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING or value != f.default:
                out[key] = value
        return out

    def _gives(self, key: str) -> bool:
        """Whether the spec mapping has ``key`` (written, or set away from its default)."""
        return key in self.to_params()


# --- helpers shared by the kinds -----------------------------------------------------------

def _run(guest: Guest, command: str) -> CommandResult:
    return guest.run_clean(command, PROBE_TIMEOUT)


def _failed_to_run(result: CommandResult, tool: str) -> str | None:
    """Why the probe could not run at all, or None if it did run."""
    if result.timed_out:
        return f"probe timed out after {PROBE_TIMEOUT:.0f}s"
    if result.exit_code == _NOT_FOUND:
        return f"{tool} is not available in the guest"
    return None


def _ask(guest: Guest, question: dict[str, Any]) -> tuple[dict[str, Any] | None,
                                                        tuple[ProbeOutcome, str] | None]:
    """Ask the guest helper ``question``: its answer, or the verdict when there is none to judge.

    The helper's ``tampered`` (what it read was not the kernel's or systemd's
    own answer: a mount over ``/proc``, a fake systemd socket) is a fail: the
    agent broke the ruler, which no fix needs. An answer it could not give
    is an error, as a missing tool is under rules 1.
    """
    result = guest.inspect(json.dumps(question, sort_keys=True), PROBE_TIMEOUT)
    if result.timed_out:
        return None, (_ERROR, f"probe timed out after {PROBE_TIMEOUT:.0f}s")
    if result.exit_code == _NOT_FOUND:
        return None, (_ERROR, f"the guest helper cannot answer: {tail(result.output, _DETAIL)}")
    try:
        answer = json.loads(result.output)
    except ValueError:
        answer = None
    if result.truncated or not isinstance(answer, dict):
        return None, (_ERROR, f"could not read the guest helper's answer: {result.output[:80]}")
    if "tampered" in answer:
        return None, (_FAIL, f"tampered: {answer['tampered']}")
    if "error" in answer or result.exit_code != 0:
        return None, (_ERROR, f"the guest helper could not answer: {answer.get('error', '?')}")
    return answer, None


_UNIT_SUFFIXES = (".service", ".socket", ".target", ".device", ".mount", ".automount", ".swap",
                  ".timer", ".path", ".slice", ".scope")


def unit_name(name: str) -> str:
    """A unit name as systemctl reads it: a bare name is a service."""
    return name if name.endswith(_UNIT_SUFFIXES) else name + ".service"


# --- the kinds ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CommandProbe(ProbeKind):
    """A shell command's exit code, and optionally its output (a substring or a regex)."""

    kind: ClassVar[str] = "command"
    run: str
    exit_code: int = 0
    stdout_contains: str | None = None
    stdout_matches: str | None = None

    def describe(self) -> str:
        return f"command `{self.run[:60]}`"

    def check(self, guest: Guest, rules: Rules) -> tuple[ProbeOutcome, str]:
        want = int(self.exit_code)
        result = _run(guest, self.run)
        if result.timed_out:
            return _ERROR, f"probe timed out after {PROBE_TIMEOUT:.0f}s"
        # 127 is "command not found" unless the spec asked for exactly that.
        if result.exit_code == _NOT_FOUND and want != _NOT_FOUND:
            return _ERROR, f"command not found: {tail(result.output, _DETAIL)}"
        out = result.output
        if result.exit_code != want:
            return _FAIL, f"exit {result.exit_code}, wanted {want}: {tail(out, _DETAIL)}"
        if self.stdout_contains is not None and self.stdout_contains not in out:
            return _FAIL, f"output lacks {self.stdout_contains!r}: {tail(out, _DETAIL)}"
        if self.stdout_matches is not None and not search(self.stdout_matches, out, multiline=True):
            return _FAIL, f"output does not match /{self.stdout_matches}/: {tail(out, _DETAIL)}"
        return _PASS, f"exit {result.exit_code}"


@dataclass(frozen=True)
class HttpProbe(ProbeKind):
    """An HTTP GET's status and body, made with curl in the guest or from the host.

    ``from_`` is the spec's ``from`` key (a Python keyword): ``guest`` tests
    the service as the machine sees it, ``host`` through the forwarded port
    as a visitor would (a firewall or a localhost-only bind shows there).
    """

    kind: ClassVar[str] = "http"
    url: str
    status: int = 200
    body_contains: str | None = None
    from_: str = "guest"

    def describe(self) -> str:
        return f"http {self.url}" + (f" -> {self.status}" if self._gives("status") else "")

    def check(self, guest: Guest, rules: Rules) -> tuple[ProbeOutcome, str]:
        if self.from_ == "host":
            parts = urlsplit(self.url)
            path = parts.path or "/"
            if parts.query:
                path += "?" + parts.query
            res = guest.host_http(parts.port or 80, path, PROBE_TIMEOUT)
            return self._judge(res.status, res.body, res.error)
        if rules >= Rules.V2:
            answer, verdict = _ask(guest, {"ask": "http", "url": self.url})
            if answer is None:
                assert verdict is not None
                return verdict
            status = answer.get("status")
            body = base64.b64decode(str(answer.get("body", ""))).decode("utf-8", "replace")
            return self._judge(status if isinstance(status, int) else None, body, answer.get("why"))
        script = (
            'b=$(mktemp) || exit 3; '
            f'c=$(curl -sS -o "$b" -w "%{{http_code}}" --max-time 10 -- {shlex.quote(self.url)} 2>/dev/null); '
            'r=$?; head -c 1000000 "$b"; rm -f "$b"; '
            f'printf "\\n{_HTTP_MARK} %s %s\\n" "$r" "$c"'
        )
        result = _run(guest, "command -v curl >/dev/null || exit 127; " + script)
        if (why := _failed_to_run(result, "curl")) is not None:
            return _ERROR, why
        body, _, tail = result.output.rpartition(_HTTP_MARK)
        fields = tail.split()
        if len(fields) < 1:
            return _ERROR, "could not read curl's result"
        curl_rc = fields[0]
        code = fields[1] if len(fields) > 1 else "000"
        status = int(code) if code.isdigit() and code != "000" else None
        body = body[:-1] if body.endswith("\n") else body
        return self._judge(status, body, f"curl exit {curl_rc}")

    def _judge(self, status: int | None, body: str, error: str | None) -> tuple[ProbeOutcome, str]:
        """The verdict on one answer, the same whichever side asked."""
        if status is None:
            return _FAIL, f"no HTTP answer: {error or 'connection failed'}"
        if status != self.status:
            return _FAIL, f"status {status}, wanted {self.status}"
        if self.body_contains is not None and self.body_contains not in body:
            return _FAIL, f"status {status} but the body lacks {self.body_contains!r}"
        return _PASS, f"status {status}"


@dataclass(frozen=True)
class ServiceProbe(ProbeKind):
    """A systemd unit's state; ``None`` for ``active``/``enabled`` means "either is fine"."""

    kind: ClassVar[str] = "service"
    name: str
    active: bool | None = None
    enabled: bool | None = None

    def describe(self) -> str:
        states = [f"{key}={str(value).lower()}"
                  for key, value in (("active", self.active), ("enabled", self.enabled))
                  if value is not None]
        return f"service {self.name}" + (f" {' '.join(states)}" if states else "")

    def check(self, guest: Guest, rules: Rules) -> tuple[ProbeOutcome, str]:
        if rules >= Rules.V2:
            answer, verdict = _ask(guest, {"ask": "service", "name": self.name})
            if answer is None:
                assert verdict is not None
                return verdict
            active, enabled = str(answer.get("active", "")), str(answer.get("enabled", ""))
        else:
            unit = shlex.quote(self.name)
            result = _run(guest, "command -v systemctl >/dev/null || exit 127; "
                                 f"systemctl is-active -- {unit}; systemctl is-enabled -- {unit} 2>&1; true")
            if (why := _failed_to_run(result, "systemctl")) is not None:
                return _ERROR, why
            lines = result.output.splitlines() + ["", ""]
            active, enabled = lines[0].strip(), lines[1].strip()
        seen = f"{self.name}: {active or '?'}, {enabled or '?'}"
        if self.active is not None and (active == "active") != bool(self.active):
            return _FAIL, seen
        if self.enabled is not None and \
                (enabled in ("enabled", "enabled-runtime", "alias")) != bool(self.enabled):
            return _FAIL, seen
        return _PASS, seen


_SS_USER = re.compile(r'\("([^"]+)",pid=(\d+)')


@dataclass(frozen=True)
class PortProbe(ProbeKind):
    """Whether something listens on a port, and optionally which process, unit and executable.

    ``process`` is a process name (its ``comm``), which any program can take.
    ``unit`` and ``exe`` (rules 2 only) tie the listener to what an admin
    means: the socket's owner runs in that systemd unit's cgroup, and its
    ``/proc/<pid>/exe`` is the file at ``exe`` with the same sha256 that file
    had before the agent had a shell. When several are given, one process
    must satisfy them all.
    """

    kind: ClassVar[str] = "port"
    port: int
    protocol: str = "tcp"
    listening: bool = True
    process: str | None = None
    unit: str | None = None
    exe: str | None = None

    def describe(self) -> str:
        s = f"port {self.port}/{self.protocol}"
        s += f" by {self.process}" if self.process is not None else ""
        s += f" in {unit_name(self.unit)}" if self.unit is not None else ""
        return s + (f" from {self.exe}" if self.exe is not None else "")

    def check(self, guest: Guest, rules: Rules) -> tuple[ProbeOutcome, str]:
        if rules >= Rules.V2:
            return self._check_v2(guest)
        if self.unit is not None or self.exe is not None:
            return _ERROR, "unit: and exe: need rules 2 (the guest helper's /proc reading)"
        port = int(self.port)
        flag = "-lnup" if self.protocol == "udp" else "-lntp"
        result = _run(guest, "command -v ss >/dev/null || exit 127; "
                             f"ss -H {flag} 'sport = :{port}'")
        if (why := _failed_to_run(result, "ss")) is not None:
            return _ERROR, why
        if result.exit_code != 0:
            return _ERROR, f"ss failed: {tail(result.output, _DETAIL)}"
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        names = sorted({m.group(1) for ln in lines for m in _SS_USER.finditer(ln)})
        seen = f"port {port}: " + (f"listening ({', '.join(names) or 'unknown process'})"
                                   if lines else "not listening")
        if bool(self.listening) != bool(lines):
            return _FAIL, seen
        if self.process is not None and self.process not in names:
            return _FAIL, seen + f", wanted {self.process}"
        return _PASS, seen

    def _check_v2(self, guest: Guest) -> tuple[ProbeOutcome, str]:
        """The kernel's socket tables and the owners' /proc entries, read by the guest helper."""
        question: dict[str, Any] = {"ask": "port", "port": int(self.port), "protocol": self.protocol}
        if self.exe is not None:
            question["exe"] = self.exe
        answer, verdict = _ask(guest, question)
        if answer is None:
            assert verdict is not None
            return verdict
        listening = bool(answer.get("listening"))
        procs = [p for p in answer.get("processes") or [] if isinstance(p, dict)]
        seen = f"port {int(self.port)}: " + (
            f"listening ({', '.join(sorted({_owner(p) for p in procs})) or 'unknown process'})"
            if listening else "not listening")
        if bool(self.listening) != listening:
            return _FAIL, seen
        if not self.listening:
            return _PASS, seen
        reference = v if isinstance(v := answer.get("exe"), dict) else {}
        if self.exe is not None and not reference.get("sha256"):
            return _FAIL, seen + f", and {self.exe} was no readable file when first checked"
        if not any(self._matches(p, reference) for p in procs):
            wanted = [f"process {self.process}" if self.process is not None else "",
                      f"unit {unit_name(self.unit)}" if self.unit is not None else "",
                      f"exe {self.exe}" if self.exe is not None else ""]
            if any(wanted):
                return _FAIL, seen + ", wanted " + " ".join(w for w in wanted if w)
        return _PASS, seen

    def _matches(self, proc: dict[str, Any], reference: dict[str, Any]) -> bool:
        """Whether one listening process is all the spec asks for."""
        if self.process is not None and proc.get("comm") != self.process:
            return False
        if self.unit is not None and proc.get("unit") != unit_name(self.unit):
            return False
        return self.exe is None or (proc.get("exe") == reference.get("resolved")
                                    and proc.get("sha256") == reference.get("sha256"))


def _owner(proc: dict[str, Any]) -> str:
    """One listener for a detail line: its name, and the unit and executable it has."""
    where = [str(x) for x in (proc.get("unit"), proc.get("exe")) if x]
    return str(proc.get("comm") or "?") + (f" [{', '.join(where)}]" if where else "")


@dataclass(frozen=True)
class FileProbe(ProbeKind):
    """A path's existence, mode, owner, group and content (a substring)."""

    kind: ClassVar[str] = "file"
    path: str
    exists: bool = True
    mode: str | None = None  # octal digits, as written: "644" or "0644"
    owner: str | None = None
    group: str | None = None
    contains: str | None = None

    def describe(self) -> str:
        return f"file {self.path}"

    def check(self, guest: Guest, rules: Rules) -> tuple[ProbeOutcome, str]:
        if rules >= Rules.V2:
            return self._check_v2(guest)
        path = shlex.quote(self.path)
        # The content is read only when it is checked: base64 keeps binary bytes intact.
        read = f"; head -c 1000000 -- {path} | base64 -w0" if self.contains is not None else ""
        result = _run(guest, f"if [ -e {path} ] || [ -L {path} ]; then "
                             f"stat -c '%a|%U|%G|%F' -- {path}{read}; else echo {_MISSING_MARK}; fi")
        if (why := _failed_to_run(result, "stat")) is not None:
            return _ERROR, why
        out = result.output.strip()
        if _MISSING_MARK in out:
            return (_PASS if self.exists is False else _FAIL), f"{self.path} does not exist"
        if self.exists is False:
            return _FAIL, f"{self.path} exists"
        first, _, rest = out.partition("\n")
        fields = first.split("|")
        if len(fields) != 4:
            return _ERROR, f"could not read stat output: {first[:80]}"
        mode, owner, group, ftype = fields
        octal = re.fullmatch(r"[0-7]+", mode) is not None
        seen = f"{self.path}: {ftype}, mode {int(mode, 8):04o}, {owner}:{group}" \
            if octal else f"{self.path}: {first[:80]}"
        return self._judge(mode, owner, group, rest if self.contains is not None else None, seen)

    def _judge(self, mode: str, owner: str, group: str, content_b64: str | None,
               seen: str) -> tuple[ProbeOutcome, str]:
        """The verdict on an existing path, the same whichever way it was read."""
        octal = re.fullmatch(r"[0-7]+", mode) is not None
        if self.mode is not None and (not octal or int(mode, 8) != int(self.mode, 8)):
            return _FAIL, seen + f", wanted mode {self.mode}"
        if self.owner is not None and owner != self.owner:
            return _FAIL, seen + f", wanted owner {self.owner}"
        if self.group is not None and group != self.group:
            return _FAIL, seen + f", wanted group {self.group}"
        if self.contains is not None:
            try:
                content = base64.b64decode((content_b64 or "").strip(),
                                           validate=False).decode("utf-8", "replace")
            except ValueError:
                return _ERROR, "could not decode the file's content"
            if self.contains not in content:
                return _FAIL, seen + f", content lacks {self.contains!r}"
        return _PASS, seen

    def _check_v2(self, guest: Guest) -> tuple[ProbeOutcome, str]:
        """``lstat`` and a read by the guest helper; owners named from /etc/passwd and /etc/group."""
        answer, verdict = _ask(guest, {"ask": "file", "path": self.path,
                                       "content": self.contains is not None})
        if answer is None:
            assert verdict is not None
            return verdict
        if not answer.get("exists"):
            return (_PASS if self.exists is False else _FAIL), f"{self.path} does not exist"
        if self.exists is False:
            return _FAIL, f"{self.path} exists"
        mode, owner, group = int(answer.get("mode", 0)), str(answer.get("owner")), str(answer.get("group"))
        seen = f"{self.path}: {answer.get('type')}, mode {mode:04o}, {owner}:{group}"
        return self._judge(f"{mode:o}", owner, group, answer.get("content"), seen)


KINDS: Registry[type[ProbeKind]] = Registry("probe kind", "probes", {
    k.kind: k for k in (CommandProbe, HttpProbe, ServiceProbe, PortProbe, FileProbe)})
"""Every probe kind by the key a spec names it with, in the order the docs list them."""


# --- running a scenario's probes --------------------------------------------------------------

class ProbeLike(Protocol):
    """What :func:`run_probes` needs of a probe: :class:`runner.core.spec.Probe` is one.

    A Protocol rather than an import because the spec loader imports the
    kinds from here; importing it back would be a cycle.
    """

    @property
    def name(self) -> str: ...

    @property
    def within(self) -> float | None: ...

    @property
    def condition(self) -> ProbeKind: ...


@dataclass(frozen=True)
class ProbeResult:
    name: str
    kind: str
    outcome: ProbeOutcome
    detail: str  # one line: what was seen
    attempts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "outcome": self.outcome,
                "detail": self.detail, "attempts": self.attempts}


def run_probes(guest: Guest, probes: Sequence[ProbeLike], clock: Clock,
               *, rules: Rules, wait: bool = True) -> list[ProbeResult]:
    """Check every probe as ``rules`` say; retry those with ``within`` until they pass or time runs out.

    Probes wait side by side, so the longest ``within`` bounds the whole wait,
    not their sum. Under rules 1, once a probe without ``within`` has failed
    the verdict is settled, so nothing waits any more (a noop run stays
    quick). That let a plain probe be judged before the thing a ``within``
    probe waits for had happened (a log file the service writes once it has
    started), which the slow tools of rules 1 hid and the helper's quick
    answers do not: under rules 2 the ``within`` probes always get their
    time, and a plain probe that failed before they settled is checked once
    more after them.
    """
    results = [_check(guest, p, rules) for p in probes]
    if not wait:
        return results
    settled = rules < Rules.V2 and \
        any(r.outcome == _FAIL and not p.within for p, r in zip(probes, results, strict=True))
    start = clock.now()
    waited = False
    while not settled:
        pending = [i for i, (p, r) in enumerate(zip(probes, results, strict=True))
                   if r.outcome != _PASS and p.within and start + p.within > clock.now()]
        if not pending:
            break
        clock.sleep(RETRY_INTERVAL)
        waited = True
        for i in pending:
            results[i] = _again(guest, probes[i], rules, results[i])
    if waited and rules >= Rules.V2:
        for i, (p, r) in enumerate(zip(probes, results, strict=True)):
            if not p.within and r.outcome != _PASS:
                results[i] = _again(guest, p, rules, r)
    return results


def _again(guest: Guest, probe: ProbeLike, rules: Rules, before: ProbeResult) -> ProbeResult:
    r = _check(guest, probe, rules)
    return ProbeResult(r.name, r.kind, r.outcome, r.detail, before.attempts + 1)


def _check(guest: Guest, probe: ProbeLike, rules: Rules) -> ProbeResult:
    # The machine it names, in a multi-machine run (runner.core.machines.Machines); else the one.
    outcome, detail = probe.condition.check(guest.on(getattr(probe, "machine", None)), rules)
    return ProbeResult(probe.name, probe.condition.kind, ProbeOutcome(outcome), _one_line(detail))


def _one_line(text: str, limit: int = 200) -> str:
    text = re.sub(r"[\x00-\x1f\x7f-\x9f]+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
