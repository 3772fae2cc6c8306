"""Two machines on a private network: they reach each other by name (and by ssh), nothing
else, and two fleets side by side never see each other's machines."""

from __future__ import annotations

import os

import pytest

from runner.backends.fleet import Fleet
from runner.core.machines import Access, Machine, Machines, configure

pytestmark = pytest.mark.vm

PAIR = (Machine("web", "debian-12-nginx", 0), Machine("db", "debian-12-postgres", 1))


def test_two_machines_reach_each_other_by_name_and_nothing_else(
        host_server: tuple[int, list[bytes]]) -> None:
    port, seen = host_server
    with Fleet(PAIR) as fleet:
        assert {b.info.restore for b in fleet.boxes.values()} <= {"template", "full-state"}
        guests = Machines(fleet.guests())
        configure(guests, PAIR, Access.SSH)
        web, db = guests.on("web"), guests.on("db")
        assert web.exec("hostname", 20).output == "web\n"
        assert db.run_clean("hostname", 20).output == "db\n"
        # by name, both ways: db's sshd from web, web's nginx from db
        r = web.exec("timeout 5 bash -c 'echo > /dev/tcp/db/22' && echo open", 30)
        assert r.output.strip() == "open", r.output
        r = db.run_clean("curl -sS -m 5 -o /dev/null -w '%{http_code}' http://web/", 30)
        assert r.output == "200", r.output
        # the agent's shell (web) is root on db over ssh: key authorized, host key known
        r = web.exec("ssh -o BatchMode=yes db 'hostname; cat /etc/hostname'", 30)
        assert r.exit_code == 0 and r.output == "db\ndb\n", r.output
        assert fleet.lan is not None and fleet.lan.frames > 0
        # nothing beyond the two: no other address on the private network, not the host
        r = web.exec("curl -sS -m 3 http://10.77.0.1/; echo rc=$?", 30)
        assert "rc=0" not in r.output
        r = web.exec(f"nc -z -w 3 10.0.2.2 {port}; echo rc=$?", 30)
        assert "rc=0" not in r.output
        r = db.run_clean(f"nc -z -w 3 10.0.2.2 {port}; echo rc=$?", 30)
        assert "rc=0" not in r.output
        r = web.exec("ip route get 1.1.1.1 || echo unroutable", 30)
        assert "10.77.0." not in r.output  # the private network is no way out
        assert web.alive() and db.alive()
        qemus = [b.pid for b in fleet.boxes.values()]
    assert seen == []  # no guest connected to the host's loopback
    assert all(p is not None for p in qemus)
    for pid in qemus:  # every QEMU ended with the fleet
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_two_fleets_side_by_side_are_isolated() -> None:
    with Fleet(PAIR) as a, Fleet(PAIR) as b:
        ga, gb = Machines(a.guests()), Machines(b.guests())
        for g in (ga, gb):
            configure(g, PAIR, Access.SSH)
        ga.on("db").run_clean("echo fleet-a > /root/marker", 20)
        gb.on("db").run_clean("echo fleet-b > /root/marker", 20)
        # same names and addresses in both: each web reaches its own db only
        for g, mine in ((ga, "fleet-a"), (gb, "fleet-b")):
            r = g.exec("ssh -o BatchMode=yes db cat /root/marker", 30)
            assert r.output.strip() == mine, r.output
        assert a.lan is not None and b.lan is not None and a.lan.dir != b.lan.dir
