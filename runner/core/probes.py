"""Probes: how a verdict is decided, from the real state of the guest.

Each probe kind turns into one shell command run through the guest's clean
clean channel (or one HTTP request from the host), and its output is judged
here on the host. A probe has three outcomes: ``pass``, ``fail``, or
``error`` when the probe itself could not run (its tool is missing, it timed
out). An error is never counted as a fail: a broken ruler says nothing about
the model.
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from runner.core.clock import Clock
from runner.core.guest import CommandResult, Guest
from runner.core.outcomes import ProbeOutcome
from runner.core.spec import Probe

Outcome = ProbeOutcome

PROBE_TIMEOUT = 20.0  # seconds for one probe command
RETRY_INTERVAL = 0.5  # seconds between tries of a probe with ``within``
_NOT_FOUND = 127
_HTTP_MARK = "__RB_HTTP__"
_MISSING_MARK = "__RB_MISSING__"


@dataclass(frozen=True)
class ProbeResult:
    name: str
    kind: str
    outcome: Outcome
    detail: str  # one line: what was seen
    attempts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "outcome": self.outcome,
                "detail": self.detail, "attempts": self.attempts}


def run_probes(guest: Guest, probes: tuple[Probe, ...] | list[Probe], clock: Clock,
               *, wait: bool = True) -> list[ProbeResult]:
    """Check every probe; retry those with ``within`` until they pass or time runs out.

    Probes wait side by side, so the longest ``within`` bounds the whole wait,
    not their sum. Once a probe without ``within`` has failed the verdict is
    settled, so nothing waits any more (a noop run stays quick).
    """
    results = [_check(guest, p) for p in probes]
    if not wait:
        return results
    settled = any(r.outcome == "fail" and not p.within for p, r in zip(probes, results, strict=True))
    start = clock.now()
    while not settled:
        pending = [i for i, (p, r) in enumerate(zip(probes, results, strict=True))
                   if r.outcome != "pass" and p.within and start + p.within > clock.now()]
        if not pending:
            break
        clock.sleep(RETRY_INTERVAL)
        for i in pending:
            r = _check(guest, probes[i])
            results[i] = ProbeResult(r.name, r.kind, r.outcome, r.detail, results[i].attempts + 1)
    return results


def _check(guest: Guest, probe: Probe) -> ProbeResult:
    checker = _CHECKERS[probe.kind]
    outcome, detail = checker(guest, probe.params)
    return ProbeResult(probe.name, probe.kind, ProbeOutcome(outcome), _one_line(detail))


def _one_line(text: str, limit: int = 200) -> str:
    text = re.sub(r"[\x00-\x1f\x7f-\x9f]+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _run(guest: Guest, command: str) -> CommandResult:
    return guest.run_clean(command, PROBE_TIMEOUT)


def _failed_to_run(result: CommandResult, tool: str) -> str | None:
    """Why the probe could not run at all, or None if it did run."""
    if result.timed_out:
        return f"probe timed out after {PROBE_TIMEOUT:.0f}s"
    if result.exit_code == _NOT_FOUND:
        return f"{tool} is not available in the guest"
    return None


# --- the kinds --------------------------------------------------------------------------

def _command(guest: Guest, p: dict[str, Any]) -> tuple[Outcome, str]:
    want = int(p.get("exit_code", 0))
    result = _run(guest, p["run"])
    if result.timed_out:
        return "error", f"probe timed out after {PROBE_TIMEOUT:.0f}s"
    if result.exit_code == _NOT_FOUND and want != _NOT_FOUND:
        return "error", f"command not found: {result.output[-120:]}"
    out = result.output
    if result.exit_code != want:
        return "fail", f"exit {result.exit_code}, wanted {want}: {out[-120:]}"
    if "stdout_contains" in p and p["stdout_contains"] not in out:
        return "fail", f"output lacks {p['stdout_contains']!r}: {out[-120:]}"
    if "stdout_matches" in p and not re.search(p["stdout_matches"], out, re.MULTILINE):
        return "fail", f"output does not match /{p['stdout_matches']}/: {out[-120:]}"
    return "pass", f"exit {result.exit_code}"


def _judge_http(p: dict[str, Any], status: int | None, body: str, error: str | None
                ) -> tuple[Outcome, str]:
    want = p.get("status", 200)
    if status is None:
        return "fail", f"no HTTP answer: {error or 'connection failed'}"
    if status != want:
        return "fail", f"status {status}, wanted {want}"
    if "body_contains" in p and p["body_contains"] not in body:
        return "fail", f"status {status} but the body lacks {p['body_contains']!r}"
    return "pass", f"status {status}"


def _http(guest: Guest, p: dict[str, Any]) -> tuple[Outcome, str]:
    url = p["url"]
    if p.get("from", "guest") == "host":
        parts = urlsplit(url)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        res = guest.host_http(parts.port or 80, path, PROBE_TIMEOUT)
        return _judge_http(p, res.status, res.body, res.error)
    script = (
        'b=$(mktemp) || exit 3; '
        f'c=$(curl -sS -o "$b" -w "%{{http_code}}" --max-time 10 -- {shlex.quote(url)} 2>/dev/null); '
        'r=$?; head -c 1000000 "$b"; rm -f "$b"; '
        f'printf "\\n{_HTTP_MARK} %s %s\\n" "$r" "$c"'
    )
    result = _run(guest, "command -v curl >/dev/null || exit 127; " + script)
    if (why := _failed_to_run(result, "curl")) is not None:
        return "error", why
    body, _, tail = result.output.rpartition(_HTTP_MARK)
    fields = tail.split()
    if len(fields) < 1:
        return "error", "could not read curl's result"
    curl_rc = fields[0]
    code = fields[1] if len(fields) > 1 else "000"
    status = int(code) if code.isdigit() and code != "000" else None
    body = body[:-1] if body.endswith("\n") else body
    return _judge_http(p, status, body, f"curl exit {curl_rc}")


def _service(guest: Guest, p: dict[str, Any]) -> tuple[Outcome, str]:
    unit = shlex.quote(p["name"])
    result = _run(guest, "command -v systemctl >/dev/null || exit 127; "
                         f"systemctl is-active -- {unit}; systemctl is-enabled -- {unit} 2>&1; true")
    if (why := _failed_to_run(result, "systemctl")) is not None:
        return "error", why
    lines = result.output.splitlines() + ["", ""]
    active, enabled = lines[0].strip(), lines[1].strip()
    seen = f"{p['name']}: {active or '?'}, {enabled or '?'}"
    if "active" in p and (active == "active") != bool(p["active"]):
        return "fail", seen
    if "enabled" in p and (enabled in ("enabled", "enabled-runtime", "alias")) != bool(p["enabled"]):
        return "fail", seen
    return "pass", seen


_SS_USER = re.compile(r'\("([^"]+)",pid=(\d+)')


def _port(guest: Guest, p: dict[str, Any]) -> tuple[Outcome, str]:
    port = int(p["port"])
    flag = "-lnup" if p.get("protocol", "tcp") == "udp" else "-lntp"
    result = _run(guest, "command -v ss >/dev/null || exit 127; "
                         f"ss -H {flag} 'sport = :{port}'")
    if (why := _failed_to_run(result, "ss")) is not None:
        return "error", why
    if result.exit_code != 0:
        return "error", f"ss failed: {result.output[-120:]}"
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    names = sorted({m.group(1) for ln in lines for m in _SS_USER.finditer(ln)})
    seen = f"port {port}: " + (f"listening ({', '.join(names) or 'unknown process'})"
                               if lines else "not listening")
    if bool(p.get("listening", True)) != bool(lines):
        return "fail", seen
    if "process" in p and p["process"] not in names:
        return "fail", seen + f", wanted {p['process']}"
    return "pass", seen


def _file(guest: Guest, p: dict[str, Any]) -> tuple[Outcome, str]:
    path = shlex.quote(p["path"])
    read = f"; head -c 1000000 -- {path} | base64 -w0" if "contains" in p else ""
    result = _run(guest, f"if [ -e {path} ] || [ -L {path} ]; then "
                         f"stat -c '%a|%U|%G|%F' -- {path}{read}; else echo {_MISSING_MARK}; fi")
    if (why := _failed_to_run(result, "stat")) is not None:
        return "error", why
    out = result.output.strip()
    exists = _MISSING_MARK not in out
    if not exists:
        ok = p.get("exists", True) is False
        return ("pass" if ok else "fail"), f"{p['path']} does not exist"
    if p.get("exists", True) is False:
        return "fail", f"{p['path']} exists"
    first, _, rest = out.partition("\n")
    fields = first.split("|")
    if len(fields) != 4:
        return "error", f"could not read stat output: {first[:80]}"
    mode, owner, group, ftype = fields
    seen = f"{p['path']}: {ftype}, mode {int(mode, 8):04o}, {owner}:{group}" \
        if re.fullmatch(r"[0-7]+", mode) else f"{p['path']}: {first[:80]}"
    if "mode" in p and (not re.fullmatch(r"[0-7]+", mode) or int(mode, 8) != int(p["mode"], 8)):
        return "fail", seen + f", wanted mode {p['mode']}"
    if "owner" in p and owner != p["owner"]:
        return "fail", seen + f", wanted owner {p['owner']}"
    if "group" in p and group != p["group"]:
        return "fail", seen + f", wanted group {p['group']}"
    if "contains" in p:
        try:
            content = base64.b64decode(rest.strip(), validate=False).decode("utf-8", "replace")
        except ValueError:
            return "error", "could not decode the file's content"
        if p["contains"] not in content:
            return "fail", seen + f", content lacks {p['contains']!r}"
    return "pass", seen


_CHECKERS = {"command": _command, "http": _http, "service": _service, "port": _port,
             "file": _file}
