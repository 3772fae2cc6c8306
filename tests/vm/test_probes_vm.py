"""Rules-2 probes on a real VM whose root tampers with the tools the probes could have trusted."""

from __future__ import annotations

import shlex

import pytest

from runner.backends.images import BuiltImage
from runner.core.guest import Guest
from runner.core.outcomes import ProbeOutcome
from runner.core.probes import (
    FileProbe,
    HttpProbe,
    PortProbe,
    ServiceProbe,
)
from runner.core.rules import Rules

PASS, FAIL = ProbeOutcome.PASS, ProbeOutcome.FAIL
V1, V2 = Rules.V1, Rules.V2

# Each stands in for a tool the rules-1 probes run, and answers what a fixed guest would.
_LIARS = {
    "/usr/bin/ss": "echo 'LISTEN 0 511 0.0.0.0:80 0.0.0.0:* users:((\"nginx\",pid=1,fd=6))'",
    "/usr/bin/systemctl": "printf 'active\\nenabled\\n'",
    "/usr/bin/curl": ('while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done; '
                      'echo "Welcome to nginx!" > "$out"; printf 200'),
    "/usr/bin/stat": "echo '644|root|root|regular file'",
}


def _sh(guest: Guest, command: str) -> str:
    r = guest.exec(command, 60)
    assert r.exit_code == 0, f"{command!r} exited {r.exit_code}: {r.output[-300:]}"
    return r.output


@pytest.mark.vm
def test_rules_2_probes_are_not_fooled_by_a_root_that_tampers(image: BuiltImage, no_new_qemu: None) -> None:
    """Tools replaced, a fake ``nginx``, a mount over /proc, a fake systemd: rules 2 see through all.

    The replaced tools are shown lying to the agent's own shell first, so the
    test proves the threat as well as the defence; rules 1, which run those
    tools, are refused by the clean channel (they are not their packages' files).
    """
    from runner.backends.sandbox import Sandbox

    site = "http://localhost/"
    nginx = PortProbe(80, process="nginx", unit="nginx", exe="/usr/sbin/nginx")
    honest = [ServiceProbe("nginx", active=True, enabled=True), nginx,
              HttpProbe(site, body_contains="Welcome to nginx!"),
              FileProbe("/etc/nginx/nginx.conf", mode="644", owner="root", contains="http {")]
    with Sandbox(image.name, accel="auto") as box:
        guest = box.guest
        # The real nginx passes every probe, under both rules (and pins /usr/sbin/nginx's hash).
        assert [p.check(guest, V2)[0] for p in honest] == [PASS] * 4, \
            [p.check(guest, V2) for p in honest]
        assert [p.check(guest, V1)[0] for p in honest if p is not nginx] == [PASS] * 3

        # Break it all, then make the tools lie about it.
        _sh(guest, "systemctl disable --now nginx && chmod 600 /etc/nginx/nginx.conf && "
                   "cp -a /usr/sbin/nginx /root/nginx.real")
        for path, body in _LIARS.items():
            _sh(guest, f"printf '%s\\n' '#!/bin/sh' {shlex.quote(body)} > {path}")
        lied = [ServiceProbe("nginx", active=True, enabled=True), PortProbe(80, process="nginx"),
                HttpProbe(site, body_contains="Welcome to nginx!"), FileProbe("/etc/nginx/nginx.conf", mode="644")]
        assert _sh(guest, "systemctl is-active nginx; stat -c %a /etc/nginx/nginx.conf") == "active\nenabled\n" \
            "644|root|root|regular file\n", "the tools lie"
        believed = [p.check(guest, V1) for p in lied]
        assert all(o is not PASS for o, _d in believed), believed  # details cut short: not all show why
        assert "tampered: /usr/bin/systemctl is not the file its package installed" in believed[0][1], believed
        seen = [p.check(guest, V2) for p in lied]
        assert [s[0] for s in seen] == [FAIL] * 4, seen
        assert seen[0][1] == "nginx: inactive, disabled"
        assert seen[1][1] == "port 80: not listening"
        assert seen[3][1].endswith("mode 0600, root:root, wanted mode 644")

        # Another program named nginx on port 80: the name passes, the unit and the executable do not.
        _sh(guest, "cp /usr/bin/python3 /tmp/nginx && cd /tmp && "
                   "setsid -f /tmp/nginx -m http.server 80 >/dev/null 2>&1; "
                   "for i in $(seq 50); do grep -q ':0050 00000000:0000 0A' /proc/net/tcp && exit 0; "
                   "sleep 0.2; done; exit 1")
        assert PortProbe(80, process="nginx").check(guest, V2)[0] is PASS
        outcome, detail = nginx.check(guest, V2)
        assert outcome is FAIL and "nginx [" in detail and "/tmp/nginx" in detail, detail
        assert PortProbe(80, unit="nginx.service").check(guest, V2)[0] is FAIL
        assert PortProbe(80, exe="/usr/sbin/nginx").check(guest, V2)[0] is FAIL
        # A file mounted over the fake's /proc/<pid>/cgroup, naming nginx's unit: not the kernel's.
        _sh(guest, "echo 0::/system.slice/nginx.service > /tmp/cg && "
                   "mount --bind /tmp/cg /proc/$(pgrep -x nginx)/cgroup && cat /proc/$(pgrep -x nginx)/cgroup")
        outcome, detail = PortProbe(80, unit="nginx").check(guest, V2)
        assert outcome is FAIL and detail.startswith("tampered: /proc/") and "cgroup" in detail, detail
        # ...even from nginx's own path, moved into nginx.service's cgroup: the hash tells.
        _sh(guest, "pkill -x nginx; sleep 0.5; cp /usr/bin/python3 /usr/sbin/nginx && cd /tmp && "
                   "setsid -f /usr/sbin/nginx -m http.server 80 >/dev/null 2>&1; "
                   "for i in $(seq 50); do grep -q ':0050 00000000:0000 0A' /proc/net/tcp && break; "
                   "sleep 0.2; done; pid=$(pgrep -x nginx) && "
                   "mkdir -p /sys/fs/cgroup/system.slice/nginx.service && "
                   "echo $pid > /sys/fs/cgroup/system.slice/nginx.service/cgroup.procs")
        assert PortProbe(80, unit="nginx").check(guest, V2)[0] is PASS, "a cgroup is no proof alone"
        outcome, detail = nginx.check(guest, V2)
        assert outcome is FAIL and "nginx.service, /usr/sbin/nginx" in detail, detail
        # A fake systemd at its private socket: not PID 1, so not asked.
        _sh(guest, "rm /run/systemd/private && setsid -f python3 -c 'import socket,time\n"
                   "s=socket.socket(socket.AF_UNIX); s.bind(\"/run/systemd/private\"); s.listen()\n"
                   "time.sleep(600)' >/dev/null 2>&1; "
                   "for i in $(seq 100); do [ -S /run/systemd/private ] && exit 0; sleep 0.2; done; exit 1")
        outcome, detail = ServiceProbe("nginx", active=True).check(guest, V2)
        assert outcome is FAIL and "not systemd (pid 1)" in detail, detail


@pytest.mark.vm
def test_a_command_probe_is_not_fooled_by_a_program_hidden_on_its_path(image: BuiltImage,
                                                                       no_new_qemu: None) -> None:
    """A ``command`` probe runs the guest's programs: root can hide ``grep`` behind a liar in
    /usr/sbin (first on the clean PATH) without touching a package's file, preload a library
    into every program, rewrite ``grep`` itself or point a link (awk's alternative) at another
    program. The clean channel then refuses to run, and the probe fails naming the cause; the
    agent's own shell is not judged."""
    from runner.backends.sandbox import Sandbox
    from runner.core.probes import CommandProbe

    absent = CommandProbe("grep -q 'no such text' /etc/hostname", exit_code=0)
    with Sandbox(image.name, accel="auto") as box:
        guest = box.guest
        assert absent.check(guest, V2)[0] is FAIL  # the honest grep finds nothing
        _sh(guest, "printf '#!/bin/sh\\nexit 0\\n' > /usr/sbin/grep && chmod 755 /usr/sbin/grep")
        assert _sh(guest, "grep -q 'no such text' /etc/hostname && echo lied") == "lied\n"
        outcome, detail = absent.check(guest, V2)
        assert outcome is FAIL and detail.endswith("tampered: /usr/sbin/grep hides /usr/bin/grep]"), detail
        _sh(guest, "rm /usr/sbin/grep && ln -s /usr/bin/grep /usr/sbin/grep")  # the same file: fine
        assert absent.check(guest, V2)[0] is FAIL
        assert CommandProbe("grep -q rootbench /etc/hostname").check(guest, V2)[0] is PASS
        _sh(guest, "echo /nonexistent/liar.so > /etc/ld.so.preload")
        outcome, detail = CommandProbe("true").check(guest, V2)
        assert outcome is FAIL and "tampered: /etc/ld.so.preload" in detail, detail
        _sh(guest, "rm /etc/ld.so.preload")
        assert CommandProbe("true").check(guest, V2)[0] is PASS
        # No name added: grep's own file rewritten in place, then awk's alternative pointed at
        # another program. Put back, each is trusted again.
        _sh(guest, "cp -a /usr/bin/grep /root/grep.real && printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/grep")
        assert _sh(guest, "grep -q 'no such text' /etc/hostname && echo lied") == "lied\n"
        outcome, detail = absent.check(guest, V2)
        assert outcome is FAIL and detail.endswith("tampered: /usr/bin/grep is not the file its package installed]"), \
            detail
        _sh(guest, "cat /root/grep.real > /usr/bin/grep")
        assert absent.check(guest, V2)[0] is FAIL
        assert CommandProbe("grep -q rootbench /etc/hostname").check(guest, V2)[0] is PASS
        _sh(guest, "ln -sfn /usr/bin/true /etc/alternatives/awk")
        outcome, detail = CommandProbe("true").check(guest, V2)
        assert outcome is FAIL and detail.endswith("tampered: /usr/bin/awk is not the program it was]"), detail
        _sh(guest, "ln -sfn /usr/bin/mawk /etc/alternatives/awk")
        assert CommandProbe("true").check(guest, V2)[0] is PASS
