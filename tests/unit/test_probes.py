"""Every probe kind, checked against recorded guest exchanges: no VM, no model.

A probe's check is one command (or one host-side HTTP request) and a
judgement of its answer. These tests feed each kind canned answers keyed by
the exact command it sends, so they pin both halves: the command strings
(which committed cassettes replay byte for byte) and the outcome and detail
text for pass, fail and error. The last section re-checks the probe
exchanges recorded in the committed oracle cassettes through the typed
kinds and gets the recorded results back.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.core.cassette import Cassette
from runner.core.clock import Clock
from runner.core.errors import InvalidInput, ReplayMismatch
from runner.core.guest import CommandResult, Guest, HttpResult, RebootResult
from runner.core.outcomes import ProbeOutcome
from runner.core.paths import repo_root
from runner.core.probes import (
    KINDS,
    PROBE_TIMEOUT,
    CommandProbe,
    FileProbe,
    HttpProbe,
    PortProbe,
    ProbeKind,
    ProbeResult,
    ServiceProbe,
    run_probes,
)
from runner.core.replay import ReplayClock, ReplayGuest
from runner.core.rules import Rules
from runner.core.spec import Probe, scenario_from_dict

PASS, FAIL, ERROR = ProbeOutcome.PASS, ProbeOutcome.FAIL, ProbeOutcome.ERROR
V1, V2 = Rules.V1, Rules.V2
ORACLE = repo_root() / "recordings" / "oracle"


# --- fakes ---------------------------------------------------------------------------------

def ok(output: str = "", exit_code: int = 0) -> CommandResult:
    return CommandResult(exit_code=exit_code, output=output, duration=0.01)


NOT_FOUND = CommandResult(exit_code=127, output="sh: 1: frobnicate: not found\n", duration=0.01)
TIMED_OUT = CommandResult(exit_code=None, output="", duration=PROBE_TIMEOUT, timed_out=True)


class CannedGuest(Guest):
    """Answers ``run_clean`` from a table keyed by the exact command; anything else fails the test.

    A list value is served one answer per call, so a retried probe can see
    the guest change.
    """

    def __init__(self, clean: dict[str, CommandResult | list[CommandResult]] | None = None,
                 http: dict[tuple[int, str], HttpResult] | None = None,
                 inspect: dict[str, CommandResult] | None = None) -> None:
        self.clean = {k: list(v) if isinstance(v, list) else [v] for k, v in (clean or {}).items()}
        self.http = dict(http or {})
        self.inspected = dict(inspect or {})
        self.sent: list[str] = []

    def inspect(self, question: str, timeout: float) -> CommandResult:
        assert timeout == PROBE_TIMEOUT
        assert question in self.inspected, f"unexpected question: {question!r}"
        self.sent.append(question)
        return self.inspected[question]

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        assert timeout == PROBE_TIMEOUT
        assert command in self.clean, f"unexpected command: {command!r}"
        self.sent.append(command)
        answers = self.clean[command]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        assert (guest_port, path) in self.http, f"unexpected request: {guest_port} {path}"
        self.sent.append(f"host GET :{guest_port}{path}")
        return self.http[guest_port, path]

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        raise AssertionError("a probe must never use the agent's shell")

    def alive(self) -> bool:
        raise AssertionError("a probe has no business asking")

    def reboot(self, timeout: float) -> RebootResult:
        raise AssertionError("a probe never reboots the guest")


def replayed(events: list[dict[str, Any]], header: dict[str, Any] | None = None) -> Cassette:
    """An in-memory cassette of recorded events (the real replay path, without a file)."""
    head = header or {"type": "header", "format": 1, "scenario": {}}  # as old as they come
    return Cassette(Path("<memory>"), [head, *events])


def clean_event(command: str, result: CommandResult, op: str = "clean") -> dict[str, Any]:
    return {"type": "guest", "op": op, "input": {"command": command, "timeout": PROBE_TIMEOUT},
            "result": {"exit_code": result.exit_code, "output": result.output,
                       "duration": result.duration, "timed_out": result.timed_out,
                       "truncated": result.truncated}}


# --- command -------------------------------------------------------------------------------

def test_command_sends_the_run_string_verbatim() -> None:
    run = "for f in /etc/cron.d/*; do grep -q 'x' \"$f\" && exit 1; done; true"
    guest = CannedGuest({run: ok()})
    assert CommandProbe(run).check(guest, V1) == (PASS, "exit 0")
    assert guest.sent == [run]


@pytest.mark.parametrize(("probe", "answer", "expected"), [
    (CommandProbe("nginx -t"), ok("syntax is ok\n"), (PASS, "exit 0")),
    (CommandProbe("nginx -t"), ok("emerg: unexpected }\n", 1),
     (FAIL, "exit 1, wanted 0: emerg: unexpected }\n")),
    (CommandProbe("false", exit_code=1), ok("", 1), (PASS, "exit 1")),
    (CommandProbe("true", exit_code=1), ok(""), (FAIL, "exit 0, wanted 1: ")),
    (CommandProbe("id -un", stdout_contains="www-data"), ok("www-data\n"), (PASS, "exit 0")),
    (CommandProbe("id -un", stdout_contains="www-data"), ok("root\n"),
     (FAIL, "output lacks 'www-data': root\n")),
    (CommandProbe("getent hosts x", stdout_matches=r"^127\.0\.0\.1\s"),
     ok("::1 x\n127.0.0.1 x\n"), (PASS, "exit 0")),  # MULTILINE: ^ matches any line
    (CommandProbe("getent hosts x", stdout_matches=r"^127\.0\.0\.1\s"), ok("10.0.0.9 x\n"),
     (FAIL, "output does not match /^127\\.0\\.0\\.1\\s/: 10.0.0.9 x\n")),
    (CommandProbe("frobnicate"), NOT_FOUND,
     (ERROR, "command not found: sh: 1: frobnicate: not found\n")),
    (CommandProbe("frobnicate", exit_code=127), NOT_FOUND, (PASS, "exit 127")),
    (CommandProbe("sleep 99"), TIMED_OUT, (ERROR, "probe timed out after 20s")),
])
def test_command(probe: CommandProbe, answer: CommandResult,
                 expected: tuple[ProbeOutcome, str]) -> None:
    assert probe.check(CannedGuest({probe.run: answer}), V1) == expected


def test_command_detail_keeps_only_the_output_tail() -> None:
    outcome, detail = CommandProbe("x").check(CannedGuest({"x": ok("a" * 500 + "END", 2)}), V1)
    assert outcome is FAIL and detail == "exit 2, wanted 0: …" + "a" * 116 + "END"


def test_command_detail_starts_at_a_word() -> None:
    # nginx -t's error, kept from its end: the detail must not begin inside "invalid"
    out = ('nginx: [emerg] invalid parameter "listen" in /etc/nginx/sites-enabled/default:23\n'
           "nginx: configuration file /etc/nginx/nginx.conf test failed\n")
    outcome, detail = CommandProbe("nginx -t").check(CannedGuest({"nginx -t": ok(out, 1)}), V2)
    kept = detail.removeprefix("exit 1, wanted 0: ")
    assert outcome is FAIL and kept.startswith("…") and len(kept) <= 120
    assert out.rstrip().endswith(kept[1:].rstrip()) and kept[1] != "d", kept
    assert kept.startswith('…parameter "listen"'), kept


# --- http ----------------------------------------------------------------------------------

# As recorded in recordings/oracle/permission-403.jsonl: replay compares it byte for byte.
CURL_LOCALHOST = (
    'command -v curl >/dev/null || exit 127; b=$(mktemp) || exit 3; '
    'c=$(curl -sS -o "$b" -w "%{http_code}" --max-time 10 -- http://localhost/ 2>/dev/null); '
    'r=$?; head -c 1000000 "$b"; rm -f "$b"; printf "\\n__RB_HTTP__ %s %s\\n" "$r" "$c"')


def curl_said(body: str, curl_rc: int, code: str) -> CommandResult:
    return ok(f"{body}\n__RB_HTTP__ {curl_rc} {code}\n")


def test_http_from_guest_sends_the_recorded_curl_command() -> None:
    guest = CannedGuest({CURL_LOCALHOST: curl_said("hi", 0, "200")})
    assert HttpProbe("http://localhost/").check(guest, V1) == (PASS, "status 200")
    assert guest.sent == [CURL_LOCALHOST]


def test_http_url_is_shell_quoted() -> None:
    url = "http://localhost/a?b=1&c=$(reboot)"
    probe = HttpProbe(url)
    quoted = "'http://localhost/a?b=1&c=$(reboot)'"
    guest = CannedGuest({CURL_LOCALHOST.replace("http://localhost/", quoted): curl_said("", 0, "200")})
    assert probe.check(guest, V1) == (PASS, "status 200")


@pytest.mark.parametrize(("probe", "answer", "expected"), [
    (HttpProbe("http://localhost/", body_contains="Welcome"), curl_said("<h1>Welcome</h1>", 0, "200"),
     (PASS, "status 200")),
    (HttpProbe("http://localhost/", status=404), curl_said("nope", 0, "404"), (PASS, "status 404")),
    (HttpProbe("http://localhost/"), curl_said("<h1>403 Forbidden</h1>", 0, "403"),
     (FAIL, "status 403, wanted 200")),
    (HttpProbe("http://localhost/", body_contains="Welcome"), curl_said("It works", 0, "200"),
     (FAIL, "status 200 but the body lacks 'Welcome'")),
    (HttpProbe("http://localhost/"), curl_said("", 7, "000"), (FAIL, "no HTTP answer: curl exit 7")),
    (HttpProbe("http://localhost/"), ok("__RB_HTTP__ 28\n"), (FAIL, "no HTTP answer: curl exit 28")),
    (HttpProbe("http://localhost/"), NOT_FOUND, (ERROR, "curl is not available in the guest")),
    (HttpProbe("http://localhost/"), TIMED_OUT, (ERROR, "probe timed out after 20s")),
    (HttpProbe("http://localhost/"), ok(""), (ERROR, "could not read curl's result")),
])
def test_http_from_guest(probe: HttpProbe, answer: CommandResult,
                         expected: tuple[ProbeOutcome, str]) -> None:
    assert probe.check(CannedGuest({CURL_LOCALHOST: answer}), V1) == expected


def test_http_body_marker_is_the_last_one() -> None:
    """A page that itself prints the marker cannot forge curl's result line."""
    body = "fake\n__RB_HTTP__ 0 200\nrest"
    probe = HttpProbe("http://localhost/", body_contains="rest")
    assert probe.check(CannedGuest({CURL_LOCALHOST: curl_said(body, 0, "500")}), V1) == \
        (FAIL, "status 500, wanted 200")


@pytest.mark.parametrize(("url", "port", "path"), [
    ("http://localhost/", 80, "/"),
    ("http://localhost", 80, "/"),
    ("http://localhost:8080/a/b?x=1&y=2", 8080, "/a/b?x=1&y=2"),
])
def test_http_from_host_asks_the_forwarded_port(url: str, port: int, path: str) -> None:
    guest = CannedGuest(http={(port, path): HttpResult(200, "Welcome to nginx!")})
    probe = HttpProbe(url, body_contains="Welcome", from_="host")
    assert probe.check(guest, V1) == (PASS, "status 200")
    assert guest.sent == [f"host GET :{port}{path}"]


@pytest.mark.parametrize(("answer", "expected"), [
    (HttpResult(None, "", "connection refused"), (FAIL, "no HTTP answer: connection refused")),
    (HttpResult(None, ""), (FAIL, "no HTTP answer: connection failed")),
    (HttpResult(502, "Bad Gateway"), (FAIL, "status 502, wanted 200")),
    (HttpResult(200, "It works"), (FAIL, "status 200 but the body lacks 'Welcome'")),
])
def test_http_from_host_failures(answer: HttpResult, expected: tuple[ProbeOutcome, str]) -> None:
    probe = HttpProbe("http://localhost/", body_contains="Welcome", from_="host")
    assert probe.check(CannedGuest(http={(80, "/"): answer}), V1) == expected


# --- service -------------------------------------------------------------------------------

SYSTEMCTL_NGINX = ("command -v systemctl >/dev/null || exit 127; "
                   "systemctl is-active -- nginx; systemctl is-enabled -- nginx 2>&1; true")


@pytest.mark.parametrize(("probe", "answer", "expected"), [
    (ServiceProbe("nginx", active=True), ok("active\nenabled\n"), (PASS, "nginx: active, enabled")),
    (ServiceProbe("nginx", active=True), ok("failed\nenabled\n"), (FAIL, "nginx: failed, enabled")),
    (ServiceProbe("nginx", active=False), ok("inactive\ndisabled\n"),
     (PASS, "nginx: inactive, disabled")),
    (ServiceProbe("nginx", active=False), ok("active\nenabled\n"), (FAIL, "nginx: active, enabled")),
    (ServiceProbe("nginx", enabled=True), ok("inactive\nenabled-runtime\n"),
     (PASS, "nginx: inactive, enabled-runtime")),
    (ServiceProbe("nginx", enabled=True), ok("active\nalias\n"), (PASS, "nginx: active, alias")),
    (ServiceProbe("nginx", enabled=True), ok("active\nmasked\n"), (FAIL, "nginx: active, masked")),
    (ServiceProbe("nginx", enabled=False), ok("active\nenabled\n"), (FAIL, "nginx: active, enabled")),
    (ServiceProbe("nginx", active=True, enabled=True), ok("active\ndisabled\n"),
     (FAIL, "nginx: active, disabled")),
    (ServiceProbe("nginx"), ok(""), (PASS, "nginx: ?, ?")),
    (ServiceProbe("nginx", active=True), NOT_FOUND, (ERROR, "systemctl is not available in the guest")),
    (ServiceProbe("nginx", active=True), TIMED_OUT, (ERROR, "probe timed out after 20s")),
])
def test_service(probe: ServiceProbe, answer: CommandResult,
                 expected: tuple[ProbeOutcome, str]) -> None:
    assert probe.check(CannedGuest({SYSTEMCTL_NGINX: answer}), V1) == expected


def test_service_name_is_shell_quoted() -> None:
    command = SYSTEMCTL_NGINX.replace("-- nginx", "-- 'a b'")
    assert ServiceProbe("a b", active=True).check(CannedGuest({command: ok("active\n")}), V1) == \
        (PASS, "a b: active, ?")


# --- port ----------------------------------------------------------------------------------

SS_80 = "command -v ss >/dev/null || exit 127; ss -H -lntp 'sport = :80'"
NGINX_ON_80 = ('LISTEN 0 511 0.0.0.0:80 0.0.0.0:* users:(("nginx",pid=812,fd=6),'
               '("nginx",pid=811,fd=6))\n'
               'LISTEN 0 511 [::]:80 [::]:* users:(("nginx",pid=811,fd=7))\n')
PYTHON_ON_80 = 'LISTEN 0 5 0.0.0.0:80 0.0.0.0:* users:(("python3",pid=640,fd=3))\n'


@pytest.mark.parametrize(("probe", "answer", "expected"), [
    (PortProbe(80, process="nginx"), ok(NGINX_ON_80), (PASS, "port 80: listening (nginx)")),
    (PortProbe(80), ok(PYTHON_ON_80), (PASS, "port 80: listening (python3)")),
    (PortProbe(80, process="nginx"), ok(PYTHON_ON_80),
     (FAIL, "port 80: listening (python3), wanted nginx")),
    (PortProbe(80), ok(""), (FAIL, "port 80: not listening")),
    (PortProbe(80, listening=False), ok("\n"), (PASS, "port 80: not listening")),
    (PortProbe(80, listening=False), ok(PYTHON_ON_80), (FAIL, "port 80: listening (python3)")),
    (PortProbe(80), ok("LISTEN 0 5 0.0.0.0:80 0.0.0.0:*\n"),
     (PASS, "port 80: listening (unknown process)")),
    (PortProbe(80), ok("Error: bad filter\n", 1), (ERROR, "ss failed: Error: bad filter\n")),
    (PortProbe(80), NOT_FOUND, (ERROR, "ss is not available in the guest")),
    (PortProbe(80), TIMED_OUT, (ERROR, "probe timed out after 20s")),
])
def test_port(probe: PortProbe, answer: CommandResult, expected: tuple[ProbeOutcome, str]) -> None:
    assert probe.check(CannedGuest({SS_80: answer}), V1) == expected


def test_port_udp_asks_ss_for_udp() -> None:
    command = "command -v ss >/dev/null || exit 127; ss -H -lnup 'sport = :53'"
    line = 'UNCONN 0 0 127.0.0.53%lo:53 0.0.0.0:* users:(("systemd-resolve",pid=400,fd=13))\n'
    assert PortProbe(53, protocol="udp").check(CannedGuest({command: ok(line)}), V1) == \
        (PASS, "port 53: listening (systemd-resolve)")


# --- file ----------------------------------------------------------------------------------

STAT_X = ("if [ -e /srv/x ] || [ -L /srv/x ]; then stat -c '%a|%U|%G|%F' -- /srv/x; "
          "else echo __RB_MISSING__; fi")
STAT_AND_READ_X = ("if [ -e /srv/x ] || [ -L /srv/x ]; then stat -c '%a|%U|%G|%F' -- /srv/x; "
                   "head -c 1000000 -- /srv/x | base64 -w0; else echo __RB_MISSING__; fi")
MISSING = ok("__RB_MISSING__\n")
REGULAR = ok("644|root|www-data|regular file\n")


def with_content(text: str) -> CommandResult:
    return ok("640|www-data|www-data|regular file\n" + base64.b64encode(text.encode()).decode())


@pytest.mark.parametrize(("probe", "answer", "expected"), [
    (FileProbe("/srv/x"), REGULAR, (PASS, "/srv/x: regular file, mode 0644, root:www-data")),
    (FileProbe("/srv/x"), MISSING, (FAIL, "/srv/x does not exist")),
    (FileProbe("/srv/x", exists=False), MISSING, (PASS, "/srv/x does not exist")),
    (FileProbe("/srv/x", exists=False), REGULAR, (FAIL, "/srv/x exists")),
    (FileProbe("/srv/x", mode="644"), REGULAR, (PASS, "/srv/x: regular file, mode 0644, root:www-data")),
    (FileProbe("/srv/x", mode="0644"), REGULAR, (PASS, "/srv/x: regular file, mode 0644, root:www-data")),
    (FileProbe("/srv/x", mode="600"), REGULAR,
     (FAIL, "/srv/x: regular file, mode 0644, root:www-data, wanted mode 600")),
    (FileProbe("/srv/x", mode="4755"), ok("4755|root|root|regular file\n"),
     (PASS, "/srv/x: regular file, mode 4755, root:root")),
    (FileProbe("/srv/x", owner="www-data"), REGULAR,
     (FAIL, "/srv/x: regular file, mode 0644, root:www-data, wanted owner www-data")),
    (FileProbe("/srv/x", group="www-data"), REGULAR,
     (PASS, "/srv/x: regular file, mode 0644, root:www-data")),
    (FileProbe("/srv/x", group="root"), REGULAR,
     (FAIL, "/srv/x: regular file, mode 0644, root:www-data, wanted group root")),
    (FileProbe("/srv/x"), ok("777|root|root|symbolic link\n"),
     (PASS, "/srv/x: symbolic link, mode 0777, root:root")),
    (FileProbe("/srv/x", mode="644"), ok("?|root|root|weird\n"),
     (FAIL, "/srv/x: ?|root|root|weird, wanted mode 644")),
    (FileProbe("/srv/x"), ok("stat: cannot statx\n"),
     (ERROR, "could not read stat output: stat: cannot statx")),
    (FileProbe("/srv/x"), NOT_FOUND, (ERROR, "stat is not available in the guest")),
    (FileProbe("/srv/x"), TIMED_OUT, (ERROR, "probe timed out after 20s")),
])
def test_file(probe: FileProbe, answer: CommandResult, expected: tuple[ProbeOutcome, str]) -> None:
    assert probe.check(CannedGuest({STAT_X: answer}), V1) == expected


@pytest.mark.parametrize(("answer", "expected"), [
    (with_content("a\nalice,120\nb\n"), (PASS, "/srv/x: regular file, mode 0640, www-data:www-data")),
    (with_content("bob,7\n"),
     (FAIL, "/srv/x: regular file, mode 0640, www-data:www-data, content lacks 'alice,120'")),
    (ok("640|www-data|www-data|regular file\n"),  # empty file: nothing after the stat line
     (FAIL, "/srv/x: regular file, mode 0640, www-data:www-data, content lacks 'alice,120'")),
    (MISSING, (FAIL, "/srv/x does not exist")),
])
def test_file_contains_reads_the_content(answer: CommandResult,
                                         expected: tuple[ProbeOutcome, str]) -> None:
    probe = FileProbe("/srv/x", contains="alice,120")
    assert probe.check(CannedGuest({STAT_AND_READ_X: answer}), V1) == expected


def test_file_path_is_shell_quoted() -> None:
    command = STAT_X.replace("/srv/x", "'/srv/my file'")
    assert FileProbe("/srv/my file", exists=False).check(CannedGuest({command: MISSING}), V1) == \
        (PASS, "/srv/my file does not exist")


# --- the typed vocabulary itself -----------------------------------------------------------

def test_every_schema_kind_has_a_class_with_the_schema_keys() -> None:
    """The schema and the classes say the same thing: no key one knows and the other not."""
    schema = json.loads((repo_root() / "schema" / "scenario.schema.json").read_text())
    kinds = [k for k in schema["$defs"]["probe"]["properties"] if k not in ("name", "within", "weight", "machine")]
    assert list(KINDS) == kinds
    for kind, cls in KINDS.items():
        keys = set(schema["$defs"][kind]["properties"])
        required = set(schema["$defs"][kind]["required"])
        assert set(cls.from_params({k: "x" for k in required}).to_params()) == required, kind
        for key in keys:  # every schema key is accepted (values are not checked here)
            cls.from_params({**{k: "x" for k in required}, key: "x"})


@pytest.mark.parametrize(("probe", "name"), [
    (CommandProbe("x" * 80), f"command `{'x' * 60}`"),
    (HttpProbe("http://localhost/"), "http http://localhost/"),
    (HttpProbe.from_params({"url": "http://localhost/", "status": 200}), "http http://localhost/ -> 200"),
    (HttpProbe("http://localhost/", status=502), "http http://localhost/ -> 502"),
    (ServiceProbe("ssh"), "service ssh"),
    (ServiceProbe("ssh", active=True, enabled=False), "service ssh active=true enabled=false"),
    (PortProbe(80), "port 80/tcp"),
    (PortProbe(53, protocol="udp", process="dnsmasq"), "port 53/udp by dnsmasq"),
    (FileProbe("/etc/x", mode="600"), "file /etc/x"),
    (PortProbe(80, process="nginx", unit="nginx", exe="/usr/sbin/nginx"),
     "port 80/tcp by nginx in nginx.service from /usr/sbin/nginx"),
    (PortProbe(22, unit="ssh.service"), "port 22/tcp in ssh.service"),
])
def test_describe(probe: ProbeKind, name: str) -> None:
    assert probe.describe() == name


def test_params_come_back_as_written() -> None:
    """Defaults a spec spelled out stay spelled out, in the spec's order (cassette headers)."""
    params = {"port": 80, "listening": True, "process": "nginx"}
    probe = PortProbe.from_params(params)
    assert probe == PortProbe(80, process="nginx")  # what is checked is the same
    assert list(probe.to_params().items()) == list(params.items())
    http = {"from": "host", "url": "http://localhost/", "status": 200}
    assert HttpProbe.from_params(http).from_ == "host"
    assert list(HttpProbe.from_params(http).to_params().items()) == list(http.items())


def test_unit_and_exe_params_round_trip_and_old_shapes_stay_as_they_were() -> None:
    """A header written before ``unit``/``exe`` existed reads back key for key; new keys keep their order."""
    old = {"port": 80, "listening": True, "process": "nginx"}
    assert PortProbe.from_params(old).to_params() == old
    assert "unit" not in PortProbe(80).to_params() and "exe" not in PortProbe(80).to_params()
    new = {"exe": "/usr/sbin/nginx", "port": 80, "unit": "nginx"}
    probe = PortProbe.from_params(new)
    assert (probe.unit, probe.exe) == ("nginx", "/usr/sbin/nginx")
    assert list(probe.to_params().items()) == list(new.items())


SPEC = """id: t
title: t
difficulty: easy
image: debian-12-nginx
task: The site is down.
setup: ["true"]
solution: ["true"]
probes:
  - port: {PORT}
"""


def test_a_spec_takes_unit_and_exe() -> None:
    from runner.core.spec import scenario_from_text
    text = SPEC.replace("{PORT}", "{port: 80, process: nginx, unit: nginx.service, exe: /usr/sbin/nginx}")
    [probe] = scenario_from_text(text, "t.yaml").probes
    assert probe.condition == PortProbe(80, process="nginx", unit="nginx.service", exe="/usr/sbin/nginx")
    assert probe.name == "port 80/tcp by nginx in nginx.service from /usr/sbin/nginx"


@pytest.mark.parametrize(("port", "field"), [
    ("{port: 80, exe: nginx}", "exe"),  # not an absolute path
    ("{port: 80, unit: 'nginx service'}", "unit"),
    ("{port: 80, unit: [nginx]}", "unit"),
])
def test_a_bad_unit_or_exe_is_one_clear_error(port: str, field: str) -> None:
    from runner.core.spec import scenario_from_text
    with pytest.raises(InvalidInput) as info:
        scenario_from_text(SPEC.replace("{PORT}", port), "t.yaml")
    assert info.value.path == "t.yaml" and field in str(info.value), str(info.value)


def test_params_of_a_probe_built_in_code() -> None:
    assert HttpProbe("http://x/").to_params() == {"url": "http://x/"}
    assert HttpProbe("http://x/", from_="host").to_params() == {"url": "http://x/", "from": "host"}
    assert FileProbe("/x", exists=False).to_params() == {"path": "/x", "exists": False}


@pytest.mark.parametrize("params", [
    {"run": "true", "stdout": "x"},  # not a key of the kind
    {"exit_code": 0},  # the required key missing
    {"run": "true", "from_": "host"},  # the Python name is not a spec key
    ["run", "true"],  # not a mapping
])
def test_bad_params_are_a_type_error(params: Any) -> None:
    with pytest.raises(TypeError):
        CommandProbe.from_params(params)


# --- run_probes ----------------------------------------------------------------------------

class StepClock(Clock):
    """A clock that moves only when something sleeps: deterministic retries."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps = 0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.t += seconds


def probe(condition: ProbeKind, within: float | None = None, name: str | None = None) -> Probe:
    return Probe(condition=condition, name=name or condition.describe(), within=within)


def test_run_probes_names_kinds_and_one_line_details() -> None:
    guest = CannedGuest({"nginx -t": ok("line one\n\x1b[31mline two\x1b[0m\n", 1), SS_80: ok("")})
    results = run_probes(guest, [probe(CommandProbe("nginx -t"), name="config ok"),
                                 probe(PortProbe(80))], StepClock(), rules=V1, wait=False)
    assert [r.to_dict() for r in results] == [
        {"name": "config ok", "kind": "command", "outcome": "fail",
         "detail": "exit 1, wanted 0: line one [31mline two [0m", "attempts": 1},
        {"name": "port 80/tcp", "kind": "port", "outcome": "fail",
         "detail": "port 80: not listening", "attempts": 1}]
    assert all(isinstance(r.outcome, ProbeOutcome) for r in results)


def test_run_probes_retries_within_until_it_passes() -> None:
    guest = CannedGuest({SYSTEMCTL_NGINX: [ok("activating\n"), ok("activating\n"), ok("active\n")]})
    clock = StepClock()
    [result] = run_probes(guest, [probe(ServiceProbe("nginx", active=True), within=5)], clock, rules=V1)
    assert (result.outcome, result.detail, result.attempts) == (PASS, "nginx: active, ?", 3)
    assert clock.sleeps == 2


def test_run_probes_gives_up_when_within_runs_out() -> None:
    guest = CannedGuest({SS_80: ok("")})
    clock = StepClock()
    [result] = run_probes(guest, [probe(PortProbe(80), within=2)], clock, rules=V1)
    assert result.outcome is FAIL and result.attempts == 5 and clock.t == 2.0


def test_run_probes_does_not_wait_once_a_plain_probe_failed() -> None:
    guest = CannedGuest({SS_80: ok(""), "nginx -t": ok("", 1)})
    clock = StepClock()
    results = run_probes(guest, [probe(PortProbe(80), within=5), probe(CommandProbe("nginx -t"))],
                         clock, rules=V1)
    assert [r.attempts for r in results] == [1, 1] and clock.sleeps == 0


def test_an_error_is_retried_too_but_never_becomes_a_fail() -> None:
    guest = CannedGuest({SS_80: NOT_FOUND})
    [result] = run_probes(guest, [probe(PortProbe(80), within=1)], StepClock(), rules=V1)
    assert result.outcome is ERROR and result.attempts == 3


def test_rules_2_judge_a_plain_probe_after_the_within_probes_settled() -> None:
    """The log a service writes once started is looked for after the service had its time."""
    guest = CannedGuest({"answers": [ok("", 7), ok("", 7), ok("")],
                         "test -s /var/log/x.log": [ok("", 1), ok("")]})
    clock = StepClock()
    waits, plain = probe(CommandProbe("answers"), within=5), probe(CommandProbe("test -s /var/log/x.log"))
    results = run_probes(guest, [waits, plain], clock, rules=V2)
    assert [(r.outcome, r.attempts) for r in results] == [(PASS, 3), (PASS, 2)]
    # Rules 1 stopped at the first failed plain probe, as their cassettes recorded.
    guest = CannedGuest({"answers": [ok("", 7), ok("")], "test -s /var/log/x.log": [ok("", 1), ok("")]})
    results = run_probes(guest, [waits, plain], StepClock(), rules=V1)
    assert [(r.outcome, r.attempts) for r in results] == [(FAIL, 1), (FAIL, 1)]


def test_rules_2_still_wait_no_longer_than_within_and_recheck_nothing_without_a_wait() -> None:
    guest = CannedGuest({"answers": ok("", 7), "nginx -t": ok("", 1)})
    clock = StepClock()
    results = run_probes(guest, [probe(CommandProbe("answers"), within=2), probe(CommandProbe("nginx -t"))],
                         clock, rules=V2)
    assert [(r.outcome, r.attempts) for r in results] == [(FAIL, 5), (FAIL, 2)] and clock.t == 2.0
    clock = StepClock()
    [result] = run_probes(guest, [probe(CommandProbe("nginx -t"))], clock, rules=V2)
    assert result.attempts == 1 and clock.sleeps == 0


# --- through the real replayer ---------------------------------------------------------------

def test_each_kind_through_a_replayed_cassette() -> None:
    """The same checks, served by ReplayGuest from recorded events (old op name included)."""
    events = [
        clean_event("nginx -t", ok("", 1), op="probe"),  # cassettes before the rename say "probe"
        clean_event(CURL_LOCALHOST, curl_said("Welcome to nginx!", 0, "200")),
        {"type": "guest", "op": "http", "input": {"port": 80, "path": "/", "timeout": PROBE_TIMEOUT},
         "result": {"status": 403, "body": "Forbidden", "error": None, "duration": 0.01}},
        clean_event(SYSTEMCTL_NGINX, ok("active\nenabled\n")),
        clean_event(SS_80, ok(NGINX_ON_80)),
        clean_event(STAT_X, TIMED_OUT),
    ]
    guest = ReplayGuest(replayed(events))
    checks = [CommandProbe("nginx -t"), HttpProbe("http://localhost/", body_contains="Welcome"),
              HttpProbe("http://localhost/", from_="host"), ServiceProbe("nginx", active=True),
              PortProbe(80, process="nginx"), FileProbe("/srv/x")]
    assert [c.check(guest, V1) for c in checks] == [
        (FAIL, "exit 1, wanted 0: "), (PASS, "status 200"), (FAIL, "status 403, wanted 200"),
        (PASS, "nginx: active, enabled"), (PASS, "port 80: listening (nginx)"),
        (ERROR, "probe timed out after 20s")]


def test_a_changed_command_is_a_replay_mismatch() -> None:
    """Why the command strings are frozen: the replayer refuses any other."""
    guest = ReplayGuest(replayed([clean_event(SS_80, ok(""))]))
    with pytest.raises(ReplayMismatch, match="guest exchange 1"):
        PortProbe(80, protocol="udp").check(guest, V1)


def _oracle_cassettes() -> Iterator[Path]:
    """The oracle runs whose exchanges follow the plain order below: a spec that re-checks after
    a pause or a reboot adds the wait's and the reboot's exchanges, and a run judged by rules 3
    adds its state reads and its reboot (tests/vm/test_lasting.py, tests/unit/test_statediff.py
    and the replay tests cover those runs)."""
    for path in sorted(ORACLE.glob("*.jsonl")):
        cassette = Cassette.load(path)
        scenario = cassette.header["scenario"]
        if cassette.head.rules >= Rules.V3:
            continue
        if not (scenario.get("recheck_after") or scenario.get("reboot")):
            yield path


def _as_recorded(results: list[ProbeResult], recorded: list[dict[str, Any]]) -> bool:
    """Whether re-checked results are the recorded ones, each detail the recorded text.

    A detail now keeps a long output's end from a word, marked "…" (core.text.tail);
    a recording made before kept the last 120 characters as they fell. So where the
    new detail has that mark, the recorded one must be the same text around it: the
    words before the mark and the output's end after it.
    """
    def same(now: dict[str, Any], was: dict[str, Any]) -> bool:
        if {**now, "detail": ""} != {**was, "detail": ""}:
            return False
        if now["detail"] == was["detail"] or "…" not in now["detail"]:
            return bool(now["detail"] == was["detail"])
        before, after = now["detail"].split("…", 1)
        return bool(was["detail"].startswith(before) and was["detail"].endswith(after))

    return len(results) == len(recorded) and all(
        same(r.to_dict(), was) for r, was in zip(results, recorded, strict=True))


@pytest.mark.parametrize("path", list(_oracle_cassettes()), ids=lambda p: p.stem)
def test_recorded_probe_exchanges_recheck_to_the_recorded_results(path: Path) -> None:
    """Every probe phase of a committed oracle run, re-checked through the typed kinds.

    The episode runs, in order: the invariants (baseline), the setup, the
    success probes (pre-check), the agent, then the success probes and the
    invariants again, these two waiting for their ``within``. Each phase's
    exchanges are cut from the cassette and served back by ReplayGuest; the
    results must equal the ones recorded in the verdict, detail text included
    (the output a detail keeps was cut mid-word until 2026-12-05; see :func:`_as_recorded`).
    """
    cas = Cassette.load(path)
    rules = cas.head.rules
    scenario = scenario_from_dict(dict(cas.head.scenario))
    verdict = cas.verdict
    assert verdict is not None
    events = [e for e in cas.events if e["type"] in ("guest", "clock")]
    guest_events = [e for e in events if e["type"] == "guest"]

    def phase(chunk: list[dict[str, Any]]) -> tuple[ReplayGuest, ReplayClock]:
        cassette = replayed(chunk, cas.header)
        return ReplayGuest(cassette), ReplayClock(cassette)

    def exhausted(guest: ReplayGuest) -> bool:
        try:
            guest.alive()
        except ReplayMismatch as exc:
            return "no more guest events" in str(exc)
        return False

    n_inv, n_setup, n_probes = len(scenario.invariants), len(scenario.setup), len(scenario.probes)
    baseline_guest, clock = phase(guest_events[:n_inv])
    baseline = run_probes(baseline_guest, scenario.invariants, clock, rules=rules, wait=False)
    assert _as_recorded(baseline, verdict["baseline"])
    assert exhausted(baseline_guest)

    start = n_inv + n_setup
    pre_guest, clock = phase(guest_events[start:start + n_probes])
    pre = run_probes(pre_guest, scenario.probes, clock, rules=rules, wait=False)
    assert _as_recorded(pre, verdict["precheck"])
    assert exhausted(pre_guest)
    assert any(r.outcome is not PASS for r in pre), "the fault landed, so a probe failed"

    # After the agent's last exchange (its commands, then the liveness check) come the
    # post-check and the invariants, with the clock readings their waits made.
    last_agent = max(i for i, e in enumerate(events)
                     if e["type"] == "guest" and e["op"] in ("exec", "alive"))
    post_guest, clock = phase(events[last_agent + 1:])
    post = run_probes(post_guest, scenario.probes, clock, rules=rules)
    invariants = run_probes(post_guest, scenario.invariants, clock, rules=rules)
    assert _as_recorded(post, verdict["probes"])
    assert _as_recorded(invariants, verdict["invariants"])
    assert exhausted(post_guest)


# --- rules 2: the guest helper answers, no guest tool runs -------------------------------------

def q(**question: Any) -> str:
    """A question exactly as a probe sends it."""
    return json.dumps(question, sort_keys=True)


def said(answer: dict[str, Any], exit_code: int = 0) -> CommandResult:
    return ok(json.dumps(answer), exit_code)


NGINX_PROC = {"pid": "811", "comm": "nginx", "exe": "/usr/sbin/nginx", "sha256": "aa",
              "cgroup": "/system.slice/nginx.service", "unit": "nginx.service"}
FAKE_PROC = {"pid": "900", "comm": "nginx", "exe": "/tmp/nginx", "sha256": "bb",
             "cgroup": "/user.slice/user-0.slice/session-1.scope", "unit": "session-1.scope"}
PIN = {"path": "/usr/sbin/nginx", "resolved": "/usr/sbin/nginx", "sha256": "aa"}
PORT_80 = q(ask="port", port=80, protocol="tcp")
PORT_80_EXE = q(ask="port", port=80, protocol="tcp", exe="/usr/sbin/nginx")


@pytest.mark.parametrize(("probe", "question", "answer", "expected"), [
    (PortProbe(80, process="nginx", unit="nginx", exe="/usr/sbin/nginx"), PORT_80_EXE,
     said({"listening": True, "processes": [NGINX_PROC], "exe": PIN}),
     (PASS, "port 80: listening (nginx [nginx.service, /usr/sbin/nginx])")),
    # A program that takes the name passes on the name alone, and on nothing else.
    (PortProbe(80, process="nginx"), PORT_80, said({"listening": True, "processes": [FAKE_PROC]}),
     (PASS, "port 80: listening (nginx [session-1.scope, /tmp/nginx])")),
    (PortProbe(80, unit="nginx.service"), PORT_80, said({"listening": True, "processes": [FAKE_PROC]}),
     (FAIL, "port 80: listening (nginx [session-1.scope, /tmp/nginx]), wanted unit nginx.service")),
    (PortProbe(80, exe="/usr/sbin/nginx"), PORT_80_EXE,
     said({"listening": True, "processes": [FAKE_PROC], "exe": PIN}),
     (FAIL, "port 80: listening (nginx [session-1.scope, /tmp/nginx]), wanted exe /usr/sbin/nginx")),
    # The right path, the right cgroup, another program: the hash tells.
    (PortProbe(80, unit="nginx", exe="/usr/sbin/nginx"), PORT_80_EXE,
     said({"listening": True, "processes": [{**NGINX_PROC, "sha256": "cc"}], "exe": PIN}),
     (FAIL, "port 80: listening (nginx [nginx.service, /usr/sbin/nginx]), "
            "wanted unit nginx.service exe /usr/sbin/nginx")),
    # One process must be all of it: a real nginx elsewhere does not lend the fake its unit.
    (PortProbe(80, process="python3", unit="nginx"), PORT_80,
     said({"listening": True, "processes": [NGINX_PROC, {**FAKE_PROC, "comm": "python3"}]}),
     (FAIL, "port 80: listening (nginx [nginx.service, /usr/sbin/nginx], "
            "python3 [session-1.scope, /tmp/nginx]), wanted process python3 unit nginx.service")),
    (PortProbe(80, exe="/usr/sbin/nginx"), PORT_80_EXE,
     said({"listening": True, "processes": [NGINX_PROC], "exe": {**PIN, "sha256": None}}),
     (FAIL, "port 80: listening (nginx [nginx.service, /usr/sbin/nginx]), "
            "and /usr/sbin/nginx was no readable file when first checked")),
    (PortProbe(80), PORT_80, said({"listening": False, "processes": []}), (FAIL, "port 80: not listening")),
    (PortProbe(80, listening=False), PORT_80, said({"listening": False, "processes": []}),
     (PASS, "port 80: not listening")),
    (PortProbe(80), PORT_80, said({"listening": True, "processes": []}),
     (PASS, "port 80: listening (unknown process)")),
    (PortProbe(80), PORT_80, said({"tampered": "/proc/net/tcp is not the kernel's"}),
     (FAIL, "tampered: /proc/net/tcp is not the kernel's")),
    (PortProbe(80), PORT_80, said({"error": "bad question: KeyError"}, 2),
     (ERROR, "the guest helper could not answer: bad question: KeyError")),
    (PortProbe(80), PORT_80, ok("this guest cannot answer inspection questions", 127),
     (ERROR, "the guest helper cannot answer: this guest cannot answer inspection questions")),
    (PortProbe(80), PORT_80, ok("{not json"), (ERROR, "could not read the guest helper's answer: {not json")),
    (PortProbe(80), PORT_80, TIMED_OUT, (ERROR, "probe timed out after 20s")),
])
def test_port_v2(probe: PortProbe, question: str, answer: CommandResult,
                 expected: tuple[ProbeOutcome, str]) -> None:
    guest = CannedGuest(inspect={question: answer})
    assert probe.check(guest, V2) == expected
    assert guest.sent == [question]


def test_unit_and_exe_are_refused_under_rules_1() -> None:
    """Rules 1 read ``ss``, which knows neither: such a probe cannot judge, so it errs."""
    outcome, detail = PortProbe(80, unit="nginx").check(CannedGuest(), V1)
    assert outcome is ERROR and "rules 2" in detail


@pytest.mark.parametrize(("probe", "answer", "expected"), [
    (ServiceProbe("nginx", active=True, enabled=True), {"active": "active", "enabled": "enabled"},
     (PASS, "nginx: active, enabled")),
    (ServiceProbe("nginx", active=True), {"active": "failed", "enabled": "enabled"},
     (FAIL, "nginx: failed, enabled")),
    (ServiceProbe("nginx", enabled=True), {"active": "active", "enabled": "masked"},
     (FAIL, "nginx: active, masked")),
    (ServiceProbe("nginx", active=True), {"tampered": "/run/systemd/private is served by pid 900"},
     (FAIL, "tampered: /run/systemd/private is served by pid 900")),
])
def test_service_v2(probe: ServiceProbe, answer: dict[str, Any],
                    expected: tuple[ProbeOutcome, str]) -> None:
    assert probe.check(CannedGuest(inspect={q(ask="service", name="nginx"): said(answer)}), V2) == expected


@pytest.mark.parametrize(("probe", "answer", "expected"), [
    (FileProbe("/srv/x", mode="644", owner="root", group="www-data"),
     {"exists": True, "mode": 0o644, "owner": "root", "group": "www-data", "type": "regular file"},
     (PASS, "/srv/x: regular file, mode 0644, root:www-data")),
    (FileProbe("/srv/x", mode="0600"),
     {"exists": True, "mode": 0o4755, "owner": "root", "group": "root", "type": "regular file"},
     (FAIL, "/srv/x: regular file, mode 4755, root:root, wanted mode 0600")),
    (FileProbe("/srv/x"), {"exists": False}, (FAIL, "/srv/x does not exist")),
    (FileProbe("/srv/x", exists=False), {"exists": False}, (PASS, "/srv/x does not exist")),
])
def test_file_v2(probe: FileProbe, answer: dict[str, Any], expected: tuple[ProbeOutcome, str]) -> None:
    question = q(ask="file", content=False, path="/srv/x")
    assert probe.check(CannedGuest(inspect={question: said(answer)}), V2) == expected


def test_file_v2_reads_the_content_only_when_asked() -> None:
    answer = {"exists": True, "mode": 0o640, "owner": "www-data", "group": "www-data",
              "type": "regular file", "content": base64.b64encode(b"listen 80;").decode()}
    guest = CannedGuest(inspect={q(ask="file", content=True, path="/srv/x"): said(answer)})
    assert FileProbe("/srv/x", contains="listen 80;").check(guest, V2)[0] is PASS
    assert FileProbe("/srv/x", contains="listen 81;").check(guest, V2) == \
        (FAIL, "/srv/x: regular file, mode 0640, www-data:www-data, content lacks 'listen 81;'")


@pytest.mark.parametrize(("answer", "expected"), [
    ({"status": 200, "body": base64.b64encode(b"Welcome to nginx!").decode()}, (PASS, "status 200")),
    ({"status": 200, "body": ""}, (FAIL, "status 200 but the body lacks 'Welcome'")),
    ({"status": None, "why": "ConnectionRefusedError"}, (FAIL, "no HTTP answer: ConnectionRefusedError")),
])
def test_http_from_guest_v2(answer: dict[str, Any], expected: tuple[ProbeOutcome, str]) -> None:
    guest = CannedGuest(inspect={q(ask="http", url="http://localhost/"): said(answer)})
    assert HttpProbe("http://localhost/", body_contains="Welcome").check(guest, V2) == expected


def test_command_probes_run_their_command_under_both_rules() -> None:
    guest = CannedGuest({"nginx -t": ok()})
    assert CommandProbe("nginx -t").check(guest, V2) == CommandProbe("nginx -t").check(guest, V1)


def test_an_inspection_is_recorded_and_replayed_like_any_exchange() -> None:
    """The question is the recorded input: a replay that asks another one is a mismatch."""
    result = said({"listening": False, "processes": []})
    event = {"type": "guest", "op": "inspect", "input": {"question": PORT_80, "timeout": PROBE_TIMEOUT},
             "result": {"exit_code": 0, "output": result.output, "duration": 0.01,
                        "timed_out": False, "truncated": False}}
    assert PortProbe(80).check(ReplayGuest(replayed([event])), V2) == (FAIL, "port 80: not listening")
    from runner.core.cassette import _parse_event
    assert _parse_event(json.dumps(event), "<memory>", 2) == event  # the cassette schema knows it
    with pytest.raises(InvalidInput, match="command"):
        _parse_event(json.dumps({**event, "input": {"command": "x", "timeout": 1}}), "<memory>", 2)
    with pytest.raises(ReplayMismatch, match="input.question"):
        PortProbe(81).check(ReplayGuest(replayed([event])), V2)


# --- rules 2 against the real helper, run here: real sockets, real /proc --------------------

class LocalHelperGuest(Guest):
    """The guest helper started on this machine, asked through its real protocol."""

    def __init__(self, rb: Path) -> None:
        from test_framing import LocalHelper
        self.helper = LocalHelper(rb)

    def inspect(self, question: str, timeout: float) -> CommandResult:
        from runner.backends.framing import parse_frame, request_text
        h = self.helper
        h.n += 1
        sentinel = f"i{h.n}"
        h.stdin.write(request_text(question, timeout, 1 << 20, sentinel, True, "i").encode())
        h.stdin.flush()
        result = parse_frame(h.stdout.readline(), sentinel, 0.0, 1 << 20)
        assert result is not None
        return result

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        return self.helper.run(command, timeout, clean=True)

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        raise AssertionError("a probe must never use the agent's shell")

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        raise AssertionError("not asked here")

    def alive(self) -> bool:
        return True

    def reboot(self, timeout: float) -> RebootResult:
        raise AssertionError("a probe never reboots the guest")


def test_the_real_helper_answers_port_file_and_http_questions(tmp_path: Path) -> None:
    import http.server
    import os
    import sys
    import threading

    served = tmp_path / "site"
    served.mkdir()
    (served / "index.html").write_text("hello from the helper test")
    os.chmod(served / "index.html", 0o640)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, directory=str(served), **kw)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    guest = LocalHelperGuest(tmp_path / "rb")
    try:
        port = server.server_address[1]
        me = os.path.realpath(sys.executable)
        comm = Path("/proc/self/comm").read_text().strip()
        assert PortProbe(port, process=comm, exe=me).check(guest, V2)[0] is PASS
        outcome, detail = PortProbe(port, exe="/bin/sh").check(guest, V2)
        assert outcome is FAIL and "wanted exe /bin/sh" in detail and me in detail, detail
        assert PortProbe(port, listening=False).check(guest, V2)[0] is FAIL
        assert PortProbe(port, protocol="udp").check(guest, V2) == (FAIL, f"port {port}: not listening")
        url = f"http://localhost:{port}/index.html"
        assert HttpProbe(url, body_contains="hello from the helper").check(guest, V2) == (PASS, "status 200")
        assert HttpProbe(f"http://127.0.0.1:{port}/nope").check(guest, V2) == (FAIL, "status 404, wanted 200")
        page = str(served / "index.html")
        assert FileProbe(page, mode="640", contains="hello").check(guest, V2)[0] is PASS
        assert FileProbe(page, mode="644").check(guest, V2)[0] is FAIL
        assert FileProbe(page + ".gone", exists=False).check(guest, V2)[0] is PASS
        # A bad question never takes the helper down: it answers, then runs commands as before.
        assert guest.inspect("not json", PROBE_TIMEOUT).exit_code == 2
        assert guest.run_clean("echo still here", 10).output == "still here\n"
    finally:
        guest.helper.close()
        server.shutdown()
        thread.join(10)


# --- on a real VM: a root that lies through the guest's tools ------------------------------


