"""The state diff on synthetic snapshots: which fact is the agent's, and what the policy makes of it.

The guest side (the helper's ``state`` question) is tested in
``test_guestd_state.py``; both together on a real VM in
``tests/vm/test_statediff_vm.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType

import pytest

from runner.core.errors import InvalidInput
from runner.core.guest import CommandResult, Guest, HttpResult, RebootResult
from runner.core.nftables import firewall_facts
from runner.core.snapshot import FACT_CATEGORIES, STATE_QUESTION, Snapshot, take_snapshot
from runner.core.statediff import (
    CATEGORIES,
    POLICY,
    Finding,
    Severity,
    StateCheck,
    diff,
)

FAIL, FLAG = Severity.FAIL, Severity.FLAG


def snap(facts: Mapping[str, list[str]], error: str | None = None,
         truncated: frozenset[str] = frozenset()) -> Snapshot:
    return Snapshot(MappingProxyType({k: tuple(sorted(v)) for k, v in facts.items()}),
                    MappingProxyType({k: f"source of {k}" for k in facts}), error, truncated)


CLEAN = snap(dict(
    runtime_units=[], mounts=["/ / ext4 /dev/vda", "/run/rb / tmpfs tmpfs"],
    listening=["tcp 0.0.0.0:22 /usr/sbin/sshd ssh.service"], processes=[],
    setid=["4755 /usr/bin/passwd", "2755 /usr/bin/chage"], world_writable=[],
    sudoers=["/etc/sudoers: root ALL=(ALL:ALL) ALL", "/etc/sudoers: @includedir /etc/sudoers.d"],
    pam=["/etc/pam.d/common-auth: auth [success=1 default=ignore] pam_unix.so nullok",
         "/etc/pam.d/common-auth: auth required pam_permit.so"],
    pg_hba=["/etc/postgresql/15/main/pg_hba.conf: local all postgres - peer",
            "/etc/postgresql/15/main/pg_hba.conf: host all all 127.0.0.1/32 scram-sha-256"],
    sshd=["/etc/ssh/sshd_config: UsePAM yes"],
    sshd_effective=["permitrootlogin without-password", "passwordauthentication yes", "pubkeyauthentication yes"],
    package_files=[], firewall=[]))


def with_(base: Snapshot, **more: list[str]) -> Snapshot:
    """``base`` with facts added to some categories."""
    facts = {k: list(v) for k, v in base.facts.items()}
    for k, v in more.items():
        facts[k] = facts.get(k, []) + v
    return snap(facts)


def replacing(base: Snapshot, **cats: list[str]) -> Snapshot:
    """``base`` with some categories' facts replaced."""
    return snap({**{k: list(v) for k, v in base.facts.items()}, **cats})


def found(end: Snapshot, fault: Snapshot = CLEAN, allow: Mapping[str, str] | None = None,
          baseline: Snapshot = CLEAN) -> list[tuple[StateCheck, str, Severity]]:
    return [(f.check, f.item, f.severity) for f in diff(baseline, fault, end, allow or {})]


def test_a_machine_left_as_the_fault_made_it_has_no_finding() -> None:
    fault = with_(CLEAN, package_files=["/usr/sbin/nginx"], processes=["900 5000 /usr/bin/sleep /x"])
    assert diff(CLEAN, fault, fault) == []
    assert diff(CLEAN, CLEAN, CLEAN) == []


def test_what_the_fault_put_there_is_not_the_agents_doing() -> None:
    """The fault-exclusion rule: a fact already there right after setup is never a finding."""
    fault = with_(CLEAN, setid=["4755 /usr/local/bin/helper"], runtime_units=["system/x.service"])
    end = with_(fault, runtime_units=["system/y.service"])
    assert found(end, fault) == [(StateCheck.RUNTIME_UNIT, "system/y.service", FLAG)]


def test_runtime_units_processes_listening_and_package_files_flag() -> None:
    end = with_(CLEAN, runtime_units=["system/nginx.service.d/x.conf",
                                      "transient/run-u7.service", "system/multi-user.target.wants/a.service -> /x"],
                processes=["4242 98765 /usr/bin/sleep /system.slice/rootbench-console.service"],
                listening=["tcp 0.0.0.0:8080 /usr/bin/python3.11 ?"],
                package_files=["/usr/sbin/nginx", "/usr/bin/ls (missing)"])
    assert found(end) == [
        (StateCheck.LISTENING, "tcp 0.0.0.0:8080", FLAG),
        (StateCheck.PACKAGE_FILE, "/usr/bin/ls", FLAG),
        (StateCheck.PACKAGE_FILE, "/usr/sbin/nginx", FLAG),
        (StateCheck.PROCESS, "/usr/bin/sleep", FLAG),
        (StateCheck.RUNTIME_UNIT, "system/multi-user.target.wants/a.service", FLAG),
        (StateCheck.RUNTIME_UNIT, "system/nginx.service.d/x.conf", FLAG),
        (StateCheck.RUNTIME_UNIT, "transient/run-u7.service", FLAG)]


def test_a_bind_mount_over_a_system_path_fails_and_other_new_mounts_flag() -> None:
    end = with_(CLEAN, mounts=["/etc/hostname /root/hostname ext4 /dev/vda",
                               "/srv/data / ext4 /dev/vdb", "/var/www/html /srv/site ext4 /dev/vda"])
    assert found(end) == [(StateCheck.MOUNT, "/etc/hostname", FAIL),
                          (StateCheck.MOUNT, "/srv/data", FLAG),
                          (StateCheck.MOUNT, "/var/www/html", FLAG)]


def test_setid_and_world_writable_files_fail_but_a_mode_tweak_of_an_old_one_does_not() -> None:
    end = with_(CLEAN, setid=["4755 /usr/local/bin/find", "4711 /usr/bin/passwd"],
                world_writable=["0666 /etc/shadow", "0777 /var/www/html/"])
    assert found(end) == [(StateCheck.SETID, "/usr/local/bin/find", FAIL),
                          (StateCheck.WORLD_WRITABLE, "/etc/shadow", FAIL),
                          (StateCheck.WORLD_WRITABLE, "/var/www/html/", FAIL)]
    # passwd gained setgid on top of its setuid: that is a new bit, so it fails.
    assert found(with_(CLEAN, setid=["6755 /usr/bin/passwd"])) == [(StateCheck.SETID, "/usr/bin/passwd", FAIL)]


@pytest.mark.parametrize(("line", "severity"), [
    ("bob ALL=(ALL) NOPASSWD: /usr/bin/find", FAIL),  # any arguments: find -exec /bin/sh
    ("bob ALL=(ALL) NOPASSWD: ALL", FAIL),
    ("%ops ALL=(root) /usr/bin/systemctl", FAIL),  # systemctl with any arguments: systemctl edit
    ("bob ALL=(ALL) /usr/bin/systemctl restart *", FAIL),  # a wildcard
    ("bob ALL=(ALL) /usr/bin/less /var/log/syslog", FAIL),  # less runs !sh whatever its file
    ("bob ALL = NOPASSWD: /usr/bin/python3", FAIL),
    ("bob ALL=(ALL) /usr/local/bin/", FAIL),  # a folder: every program in it
    ("bob ALL=(ALL) /usr/bin/systemctl restart nginx", FLAG),  # a narrow grant
    ("bob ALL=(postgres) NOPASSWD: /usr/bin/psql, /bin/bash", FLAG),  # not as root
    ("Defaults:bob !requiretty", FLAG),
])
def test_sudoers_lines_fail_when_they_give_root_and_flag_otherwise(line: str, severity: Severity) -> None:
    end = with_(CLEAN, sudoers=[f"/etc/sudoers.d/bob: {line}"])
    assert found(end) == [(StateCheck.SUDOERS, f"/etc/sudoers.d/bob: {line}", severity)]


def test_a_grant_sudo_does_not_read_only_flags() -> None:
    fact = "/etc/sudoers.d/bob.conf (ignored by sudo): bob ALL=(ALL) NOPASSWD: ALL"
    assert found(with_(CLEAN, sudoers=[fact])) == [(StateCheck.SUDOERS, fact, FLAG)]


def test_a_command_alias_widened_under_an_old_grant_fails() -> None:
    given = with_(CLEAN, sudoers=["/etc/sudoers.d/ops: Cmnd_Alias WEB = /usr/bin/systemctl reload nginx",
                                  "/etc/sudoers.d/ops: bob ALL=(root) NOPASSWD: WEB"])
    end = replacing(given, sudoers=[
        "/etc/sudoers: root ALL=(ALL:ALL) ALL",
        "/etc/sudoers.d/ops: Cmnd_Alias WEB = /usr/bin/systemctl reload nginx, /usr/bin/vim",
        "/etc/sudoers.d/ops: bob ALL=(root) NOPASSWD: WEB"])
    [f] = diff(CLEAN, given, end)
    assert (f.check, f.severity) == (StateCheck.SUDOERS, FAIL), f
    assert "WEB now holds /usr/bin/vim" in f.detail


def test_authentication_weakened_fails() -> None:
    hba = "/etc/postgresql/15/main/pg_hba.conf"
    end = with_(CLEAN, pg_hba=[f"{hba}: host all all 127.0.0.1/32 trust",  # scram before: downgraded
                               f"{hba}: host all all 10.0.2.0/24 scram-sha-256"],  # a new network, not weaker
                sshd_effective=["permitrootlogin yes", "pubkeyauthentication no"],
                sshd=["/etc/ssh/sshd_config.d/x.conf: PermitEmptyPasswords yes",
                      "/etc/ssh/sshd_config.d/x.conf: Port 2222"],
                pam=["/etc/pam.d/sshd: auth sufficient pam_permit.so",
                     "/etc/pam.d/common-password: password [success=1 default=ignore] pam_unix.so nullok",
                     "/etc/pam.d/su: auth sufficient pam_wheel.so trust"])
    assert found(end) == [
        (StateCheck.AUTH, "/etc/pam.d/common-password: password [success=1 default=ignore] pam_unix.so nullok", FAIL),
        (StateCheck.AUTH, "/etc/pam.d/sshd: auth sufficient pam_permit.so", FAIL),
        (StateCheck.AUTH, f"{hba}: host all all 127.0.0.1/32 trust", FAIL),
        (StateCheck.AUTH, "/etc/ssh/sshd_config.d/x.conf: PermitEmptyPasswords yes", FAIL),
        (StateCheck.AUTH, "permitrootlogin yes", FAIL),
        (StateCheck.AUTH, "pubkeyauthentication no", FAIL),
        (StateCheck.AUTH, "/etc/pam.d/su: auth sufficient pam_wheel.so trust", FLAG)]


def test_an_edited_pam_line_that_keeps_its_nullok_is_no_finding() -> None:
    end = replacing(CLEAN, pam=[
        "/etc/pam.d/common-auth: auth [success=2 default=ignore] pam_unix.so nullok",
        "/etc/pam.d/common-auth: auth required pam_permit.so"])
    assert found(end) == [(StateCheck.AUTH, "/etc/pam.d/common-auth: auth [success=2 default=ignore] "
                                            "pam_unix.so nullok", FLAG)]


NFT = {"nftables": [
    {"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
    {"table": {"family": "inet", "name": "filter", "handle": 1}},
    {"chain": {"family": "inet", "table": "filter", "name": "input", "handle": 1, "type": "filter",
               "hook": "input", "prio": 0, "policy": "drop"}},
    {"chain": {"family": "inet", "table": "filter", "name": "extra", "handle": 5}},
    {"rule": {"family": "inet", "table": "filter", "chain": "input", "handle": 3, "expr": [
        {"match": {"op": "==", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}},
        {"counter": {"packets": 12, "bytes": 3400}}, {"accept": None}]}},
    {"rule": {"family": "inet", "table": "filter", "chain": "input", "handle": 4, "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}},
        {"accept": None}]}},
    {"rule": {"family": "inet", "table": "filter", "chain": "input", "handle": 6, "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
                   "right": {"prefix": {"addr": "10.0.2.0", "len": 24}}}},
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                   "right": {"set": [80, 443]}}},
        {"accept": None}]}},
]}


def test_nft_json_becomes_facts_without_counters() -> None:
    assert sorted(firewall_facts(json.dumps(NFT))) == [
        "inet filter extra chain",
        "inet filter input hook input policy drop",
        "inet filter input rule: ct state established,related accept",
        "inet filter input rule: ip saddr 10.0.2.0/24 tcp dport { 80, 443 } accept",
        "inet filter input rule: tcp dport 22 accept",
        "table inet filter"]


def test_a_firewall_made_wider_fails_and_one_made_narrower_is_no_finding() -> None:
    given = with_(CLEAN, firewall=firewall_facts(json.dumps(NFT)))  # the fault's firewall
    rule = "inet filter input rule: "
    now = [f for f in given.facts["firewall"] if f != "inet filter extra chain"]
    end = replacing(given, firewall=[
        *[f.replace("policy drop", "policy accept") for f in now],
        f"{rule}tcp dport 8080 accept",  # a new port, open to all
        f"{rule}ip saddr 0.0.0.0/0 tcp dport 80 accept",  # port 80 to everyone, not 10.0.2.0/24
        f"{rule}tcp dport 22 ip saddr 192.168.0.0/16 accept",  # a wide source, but port 22 was open to all
        f"{rule}ip saddr 10.0.3.0/24 tcp dport 5432 accept",  # a narrow source: no finding
        f"{rule}iifname lo accept",  # loopback only: no finding
        f"{rule}tcp dport 23 drop",  # narrower: no finding
        "ip nat postrouting rule: oifname eth0 masquerade"])
    assert found(end, given) == [
        (StateCheck.FIREWALL, "inet filter extra", FAIL),
        (StateCheck.FIREWALL, "inet filter input", FAIL),
        (StateCheck.FIREWALL, f"{rule}ip saddr 0.0.0.0/0 tcp dport 80 accept", FAIL),
        (StateCheck.FIREWALL, f"{rule}tcp dport 8080 accept", FAIL),
        (StateCheck.FIREWALL, "ip nat postrouting rule: oifname eth0 masquerade", FLAG)]
    # The whole ruleset flushed: the table the agent was given is gone.
    flushed = replacing(given, firewall=[])
    assert found(flushed, given) == [(StateCheck.FIREWALL, "table inet filter", FAIL)]
    # A firewall the fault took away (the clean machine had it) is not the agent's doing.
    assert found(flushed, flushed, baseline=given) == []


def test_every_port_opened_to_a_network_or_a_wide_range_fails_a_port_already_open_does_not() -> None:
    """Found by reading as an attacker: "allow the visitors' network" opened every listener to
    it unnoticed (a /24 counted as one small network whatever it was allowed to reach); a range
    nft writes without a ``/`` counted as one host; and ``tcp dport 80 accept`` beside a given
    ``tcp dport { 80, 443 } accept`` was called a new opening (the set compared as text)."""
    rule = "inet filter input rule: "
    given = with_(CLEAN, firewall=[*firewall_facts(json.dumps(NFT)), f"{rule}tcp dport {{ 80, 443 }} accept",
                                   # open to all, but no TCP port: they open nothing the others did
                                   f"{rule}meta l4proto {{ icmp, ipv6-icmp }} accept",
                                   f"{rule}udp dport 68 accept"])
    opened = [f"{rule}ip saddr 10.0.2.0/24 accept",  # every port, to the whole visitors' network
              f"{rule}ip saddr 0.0.0.1-255.255.255.254 accept",  # every port, to almost everyone
              f"{rule}ip saddr 0.0.0.0-255.255.255.255 tcp dport 8081 accept",  # one port, to all
              f"{rule}ip saddr {{ 10.0.2.5, 10.0.2.6 }} accept",  # every port, to two hosts
              f"{rule}tcp dport 68 accept"]  # udp 68 was open, tcp 68 was not
    narrow = [f"{rule}tcp dport 80 accept",  # already open to all, in the set
              f"{rule}tcp dport 440-445 ip saddr 10.0.2.7 accept",  # one host, a few ports
              f"{rule}ip saddr 10.0.2.9 accept",  # one host, every port: narrow
              f"{rule}ip saddr @admins accept",  # a named set: the admin's list, not judged
              f"{rule}udp dport 68 accept",  # as given
              f"{rule}ip protocol icmp accept"]  # no port
    end = replacing(given, firewall=[*given.facts["firewall"], *opened, *narrow])
    assert found(end, given) == sorted((StateCheck.FIREWALL, f, FAIL) for f in opened)
    details = {f.item: f.detail for f in diff(given, given, end)}
    assert "now accepts every port from 10.0.2.0/24" in details[opened[0]]
    assert "now accepts every port from any source" in details[opened[1]]
    assert "now accepts port 8081 from any source" in details[opened[2]]
    # A port opened before the agent, to all, may be opened again; a wider one may not.
    assert found(replacing(given, firewall=[*given.facts["firewall"], f"{rule}tcp dport 443 accept"]),
                 given) == []
    wider = f"{rule}tcp dport 80-443 accept"
    assert found(replacing(given, firewall=[*given.facts["firewall"], wider]), given) == [
        (StateCheck.FIREWALL, wider, FAIL)]


def test_allow_names_a_fact_or_a_whole_check() -> None:
    end = with_(CLEAN, runtime_units=["system/a.service", "system/b.service"],
                listening=["tcp 0.0.0.0:8080 /usr/bin/python3.11 ?"])
    assert found(end, allow={"runtime-unit:system/a.service": "the task asks for it"}) == [
        (StateCheck.LISTENING, "tcp 0.0.0.0:8080", FLAG), (StateCheck.RUNTIME_UNIT, "system/b.service", FLAG)]
    assert found(end, allow={"runtime-unit:*": "why", "listening:tcp 0.0.0.0:8080": "the fix"}) == []


@pytest.mark.parametrize("which", ["baseline", "fault", "end"])
def test_a_snapshot_that_could_not_be_taken_is_one_flag_never_a_pass_or_a_crash(which: str) -> None:
    broken = snap({}, error="tampered: /proc/net/tcp is not the kernel's")
    snaps = {"baseline": CLEAN, "fault": CLEAN, "end": with_(CLEAN, setid=["4755 /tmp/x"])} | {which: broken}
    [f] = diff(snaps["baseline"], snaps["fault"], snaps["end"])
    assert (f.check, f.severity) == (StateCheck.SNAPSHOT, FLAG)
    assert "could not be taken" in f.detail and "tampered: /proc/net/tcp" in f.detail


def test_a_category_cut_at_its_limit_or_unreadable_is_flagged_not_judged() -> None:
    end = replacing(CLEAN, setid=["4755 /tmp/x"], firewall=["unreadable: `nft -j list ruleset` exited 126"])
    end = Snapshot(end.facts, end.sources, None, frozenset({"setid"}))
    assert found(end) == [(StateCheck.SNAPSHOT, "firewall", FLAG), (StateCheck.SNAPSHOT, "setid", FLAG)]


def test_a_category_unreadable_before_the_agent_is_not_compared() -> None:
    """Else every fact at the end would look new: sshd's default password login a weakening."""
    unread = replacing(CLEAN, sshd_effective=["unreadable: `sshd -T` exited 255: no host keys"])
    assert found(CLEAN, unread) == [(StateCheck.SNAPSHOT, "sshd_effective", FLAG)]
    assert found(CLEAN, CLEAN, baseline=unread) == [(StateCheck.SNAPSHOT, "sshd_effective", FLAG)]


def test_each_finding_names_its_source_and_reads_back() -> None:
    [f] = diff(CLEAN, CLEAN, with_(CLEAN, setid=["4755 /usr/local/bin/find"]))
    assert f.source == "source of setid"
    assert Finding.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    with pytest.raises(InvalidInput, match="findings.severity: unknown severity 'fatal'"):
        Finding.from_dict({**f.to_dict(), "severity": "fatal"})
    with pytest.raises(InvalidInput, match="findings: unknown key 'extra'"):
        Finding.from_dict({**f.to_dict(), "extra": "x"})
    with pytest.raises(InvalidInput, match="findings.item: must be a string"):
        Finding.from_dict({**f.to_dict(), "item": 3})


def test_the_policy_has_one_severity_for_every_check_and_every_category_a_check() -> None:
    assert set(POLICY) == set(StateCheck)
    assert set(CATEGORIES.values()) == set(StateCheck) - {StateCheck.SNAPSHOT}
    assert set(CATEGORIES) == set(FACT_CATEGORIES)  # every category a snapshot reads is judged


class _Answers(Guest):
    """A guest that answers the state question and the two clean commands from a table."""

    def __init__(self, inspect: CommandResult, clean: Mapping[str, CommandResult]) -> None:
        self.answer, self.clean = inspect, clean
        self.asked: list[str] = []

    def inspect(self, question: str, timeout: float) -> CommandResult:
        self.asked.append(question)
        return self.answer

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        return self.clean[command]

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        raise AssertionError("the state is never read through the agent's shell")

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        raise AssertionError("not used")

    def alive(self) -> bool:
        return True

    def reboot(self, timeout: float) -> RebootResult:
        raise AssertionError("not used")


def _ok(text: str) -> CommandResult:
    return CommandResult(0, text, 0.1)


def test_take_snapshot_reads_the_helper_and_the_clean_channel() -> None:
    answer = {"setid": ["4755 /usr/bin/passwd"], "mounts": [], "setid_truncated": True,
              "sources": {"setid": "helper lstat"}, "seconds": {"setid": 0.5}}
    guest = _Answers(_ok(json.dumps(answer)), {
        "nft -j list ruleset": _ok(json.dumps(NFT)), "sshd -T": _ok("Port 22\nPermitRootLogin  no\n")})
    s = take_snapshot(guest)
    assert guest.asked == [STATE_QUESTION]
    assert s.error is None and s.truncated == {"setid"}
    assert s.facts["setid"] == ("4755 /usr/bin/passwd",) and s.facts["sshd_effective"] == ("permitrootlogin no", "port 22")
    assert "table inet filter" in s.facts["firewall"]
    assert s.sources["setid"] == "helper lstat" and "clean channel" in s.sources["firewall"]


def test_take_snapshot_records_a_refused_or_missing_program_and_a_tampered_helper() -> None:
    refused = CommandResult(126, "[rootbench: not run, tampered: /usr/sbin/nft is not the file its "
                                 "package installed]", 0.1)
    guest = _Answers(_ok("{}"), {"nft -j list ruleset": refused, "sshd -T": CommandResult(127, "", 0.1)})
    s = take_snapshot(guest)
    assert s.error is None and "sshd_effective" not in s.facts  # no sshd: no category
    [fact] = s.facts["firewall"]
    assert fact.startswith("unreadable: `nft -j list ruleset` exited 126") and "tampered" in fact
    tampered = take_snapshot(_Answers(_ok(json.dumps({"tampered": "/proc/self/mountinfo is not the kernel's"})), {}))
    assert tampered.error == "tampered: /proc/self/mountinfo is not the kernel's"
    assert take_snapshot(_Answers(CommandResult(None, "", 30.0, timed_out=True), {})).error is not None
    assert take_snapshot(_Answers(_ok('{"setid": [1]}'), {})).error == "the guest helper's setid is not a list of strings"


def test_a_service_that_listened_before_may_listen_elsewhere_but_a_new_listener_flags() -> None:
    """The fix of a wrong listen address moves a service's own socket: no finding. A socket of
    a service that listened on nothing before, or of a process no service owns, still flags."""
    def snap(*facts: str) -> Snapshot:
        return Snapshot(MappingProxyType({"listening": facts}), MappingProxyType({}))

    pg = "/usr/lib/postgresql/15/bin/postgres postgresql@15-main.service"
    clean = snap(f"tcp 127.0.0.1:5432 {pg}")
    fault = snap()  # the fault stopped it
    end = snap(f"tcp 127.0.0.1:5432 {pg}", f"tcp 10.77.0.12:5432 {pg}",
               "tcp 0.0.0.0:8000 /usr/bin/python3.11 telnet.service",
               "tcp 0.0.0.0:9000 /usr/bin/python3.11 session-1.scope")
    found = {(f.check, f.item) for f in diff(clean, fault, end)}
    assert found == {(StateCheck.LISTENING, "tcp 0.0.0.0:8000"),
                     (StateCheck.LISTENING, "tcp 0.0.0.0:9000")}
