"""Multi-machine scenarios: the spec's ``machines:``, its validation, its cassette header, and the
per-machine recording and replay of guest exchanges (no VM: real files, real recorder)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from flag_guest import FlagGuest

from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.machines import Access, Machine, hosts_block, network_commands
from runner.core.spec import load_spec, scenario_from_dict, scenario_to_dict

TWO = textwrap.dedent("""\
    id: two
    title: Two machines
    task: The shop cannot reach its database.
    machines:
      - name: web
        image: debian-12-nginx
      - name: db
        image: debian-12-postgres
    access: ssh
    setup:
      - systemctl stop nginx
      - machine: db
        run: systemctl stop postgresql
    probes:
      - machine: db
        port: {port: 5432, listening: true}
      - service: {name: nginx, active: true}
    invariants:
      - machine: db
        service: {name: ssh, active: true}
    solution: [systemctl start nginx, ssh db systemctl start postgresql]
""")


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "x.yaml"
    p.write_text(text)
    return p


def test_machines_are_read_with_stable_addresses(tmp_path: Path) -> None:
    s = load_spec(_write(tmp_path, TWO))
    assert [(m.name, m.image, m.address, m.mac) for m in s.machines] == [
        ("web", "debian-12-nginx", "10.77.0.11", "52:54:00:77:00:0b"),
        ("db", "debian-12-postgres", "10.77.0.12", "52:54:00:77:00:0c")]
    assert s.image == "debian-12-nginx"  # the first machine's: what a one-image reader sees
    assert s.access is Access.SSH and s.agent_machine is None
    assert s.setup_steps() == [(None, "systemctl stop nginx"), ("db", "systemctl stop postgresql")]
    assert [p.machine for p in s.probes] == ["db", None]
    assert s.invariants[0].machine == "db"


def test_a_multi_machine_header_round_trips(tmp_path: Path) -> None:
    s = load_spec(_write(tmp_path, TWO))
    d = json.loads(json.dumps(scenario_to_dict(s)))
    assert d["machines"] == [{"name": "web", "image": "debian-12-nginx"},
                             {"name": "db", "image": "debian-12-postgres"}]
    assert d["access"] == "ssh" and d["setup_on"] == [None, "db"] and "agent_machine" not in d
    assert d["probes"][0]["machine"] == "db" and "machine" not in d["probes"][1]
    back = scenario_from_dict(d)
    assert back == s and json.loads(json.dumps(scenario_to_dict(back))) == d


def test_a_single_machine_header_has_none_of_the_new_keys(tmp_path: Path) -> None:
    one = load_spec(Path(__file__).parents[2] / "specs" / "nginx-stopped.yaml")
    d = scenario_to_dict(one)
    assert not {"machines", "access", "agent_machine", "setup_on"} & set(d)
    assert all("machine" not in p for p in d["probes"] + d["invariants"])
    assert one.setup_steps() == [(None, c) for c in one.setup]


@pytest.mark.parametrize(("edit", "field", "says"), [
    (lambda t: t.replace("access: ssh\n", ""), "machines", "access: ssh or access: network"),
    (lambda t: t.replace("machines:\n", "image: debian-12-nginx\nmachines:\n"), "image", "not both"),
    (lambda t: t.replace("name: db", "name: web"), "machines[1].name", "used twice"),
    (lambda t: t.replace("  - machine: db\n    port", "  - machine: dbx\n    port"),
     "probes[0].machine", "no machine 'dbx'"),
    (lambda t: t.replace("  - machine: db\n    run", "  - machine: cache\n    run"),
     "setup[1].machine", "no machine 'cache'"),
    (lambda t: t + "agent_machine: mail\n", "agent_machine", "no machine 'mail'"),
    (lambda t: t.replace("image: debian-12-postgres", "image: no-such-image"), "machines[1].image",
     "no image recipe"),
    (lambda t: t.replace("access: ssh", "access: telnet"), "access", "'telnet' is not one of"),
    (lambda t: t.replace("name: db", "name: DB"), "machines[1].name", "does not match"),
    (lambda t: t.replace("  - machine: db\n    run: systemctl stop postgresql\n",
                         "  - machine: db\n"), "setup[1]", "'run' is a required property"),
])
def test_bad_machines_are_one_line_naming_the_field(tmp_path: Path, edit: Callable[[str], str],
                                                    field: str, says: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_spec(_write(tmp_path, edit(TWO)))
    text = str(err.value)
    assert "\n" not in text and text.startswith(str(tmp_path / "x.yaml"))
    assert f" {field}: " in text or f"{field}:" in text, text
    assert says in text, text


def test_machine_references_need_machines(tmp_path: Path) -> None:
    one = textwrap.dedent("""\
        id: one
        title: One
        image: debian-12-nginx
        task: t
        setup: [systemctl stop nginx]
        probes:
          - machine: db
            service: {name: nginx, active: true}
        solution: [systemctl start nginx]
    """)
    with pytest.raises(InvalidInput, match=r"probes\[0\]\.machine: machine: needs machines:"):
        load_spec(_write(tmp_path, one))
    with pytest.raises(InvalidInput, match=r"access: access needs machines:"):
        load_spec(_write(tmp_path, one.replace("  - machine: db\n    ", "  - ") + "access: ssh\n"))
    with pytest.raises(InvalidInput, match="give the image the scenario runs on"):
        load_spec(_write(tmp_path, one.replace("image: debian-12-nginx\n", "")))


@pytest.mark.parametrize("damage", [
    {"machines": "web"},
    {"machines": [{"name": "web"}]},
    {"access": "telnet"},
    {"agent_machine": "nowhere"},
    {"setup_on": ["db"]},
])
def test_a_damaged_multi_machine_header_is_invalid_input(tmp_path: Path, damage: dict[str, object]) -> None:
    d = {**scenario_to_dict(load_spec(_write(tmp_path, TWO))), **damage}
    with pytest.raises(InvalidInput, match="the cassette's scenario is unreadable"):
        scenario_from_dict(d)


def test_network_commands_name_every_machine() -> None:
    machines = (Machine("web", "debian-12-nginx", 0), Machine("db", "debian-12-postgres", 1))
    assert hosts_block(machines).splitlines()[1:] == ["10.77.0.11 web", "10.77.0.12 db"]
    script = network_commands(machines[1], machines)
    assert "hostname db" in script and "Address=10.77.0.12/24" in script
    assert "MACAddress=52:54:00:77:00:0c" in script and "10.77.0.11 web" in script


def test_the_hub_sends_each_frame_to_every_other_machine_only() -> None:
    import socket

    from runner.backends.lan import Lan

    with Lan(3) as lan:
        ends = []
        for i in range(3):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.bind(str(lan.machine_path(i)))
            s.settimeout(3)
            ends.append(s)
        ends[0].sendto(b"frame from 0", str(lan.hub_path(0)))
        assert ends[1].recv(100) == b"frame from 0" and ends[2].recv(100) == b"frame from 0"
        ends[0].settimeout(0.3)
        with pytest.raises(TimeoutError):
            ends[0].recv(100)  # a hub does not echo
        port = lan.port(1, "52:54:00:77:00:0c")
        assert port.netdev() == (f"dgram,id=lan,local.type=unix,local.path={lan.machine_path(1)},"
                                 f"remote.type=unix,remote.path={lan.hub_path(1)}")
        assert lan.frames == 1 and oct(lan.dir.stat().st_mode)[-3:] == "700"
        for s in ends:
            s.close()
    assert not lan.dir.exists()


def test_single_machine_qemu_arguments_are_unchanged_by_the_lan_option() -> None:
    from runner.backends.images import BuiltImage
    from runner.backends.lan import LanPort
    from runner.backends.qemu import machine_digest, qemu_args

    image = BuiltImage(name="x", dir=Path("."), base=Path("b"), kernel=Path("k"), initrd=Path("i"),
                       ssh_key=Path("s"), sha256="0" * 64, memory_mib=256, cmdline="c",
                       built_at="now")
    plain = qemu_args(image, Path("d"), "tcg", None, Path("c"), Path("q"), {22: 1, 80: 2})
    assert "lan" not in " ".join(plain)
    with_lan = qemu_args(image, Path("d"), "tcg", None, Path("c"), Path("q"), {22: 1, 80: 2},
                         LanPort(Path("m"), Path("h"), "52:54:00:77:00:0b"))
    assert with_lan[:len(plain) - 8] == plain[:len(plain) - 8]
    assert "virtio-net-pci,netdev=lan,mac=52:54:00:77:00:0b" in with_lan
    assert machine_digest(image, "tcg") != machine_digest(image, "tcg", lan=True)


# --- a multi-machine episode, recorded and replayed (flag guests: no VM) --------------------

FLAGS = textwrap.dedent("""\
    id: two-flags
    title: Two machines of flags
    task: db has lost its flag.
    machines:
      - name: web
        image: debian-12-nginx
      - name: db
        image: debian-12-postgres
    access: network
    agent_machine: db
    setup:
      - machine: db
        run: rm db-ok
      - touch web-touched
    probes:
      - machine: db
        command: {run: test -e db-ok}
    invariants:
      - command: {run: test -e web-ok}
    solution: [touch db-ok]
""")


def _record_two(tmp_path: Path, text: str = FLAGS) -> tuple[Episode, Path, FlagGuest, FlagGuest]:
    from runner.app.episodes import RunOptions, header
    from runner.core.cassette import CassetteWriter
    from runner.core.clock import Clock
    from runner.core.episode import run_episode
    from runner.core.machines import Machines
    from runner.core.model import oracle
    from runner.core.protocol import get_protocol
    from runner.core.recording import RecordingGuest, RecordingModel

    spec = tmp_path / "two-flags.yaml"
    spec.write_text(text)
    scenario = load_spec(spec)
    web, db = FlagGuest({"web-ok"}), FlagGuest({"db-ok"})
    model, protocol = oracle(list(scenario.solution)), get_protocol("tools")
    cassette = tmp_path / "two-flags.r0.jsonl"
    with CassetteWriter(cassette) as writer:
        writer.write(header(scenario, model, protocol, "test", RunOptions(track_fix=False), 0, {}))
        guests = Machines({"web": RecordingGuest(web, writer), "db": RecordingGuest(db, writer, "db")},
                          scenario.agent_machine)
        ep = run_episode(scenario, guests, RecordingModel(model, writer), protocol, Clock(writer),
                         writer)
    return ep, cassette, web, db


def test_each_machine_gets_its_own_setup_probes_and_the_agent_its_shell(tmp_path: Path) -> None:
    ep, cassette, web, db = _record_two(tmp_path)
    assert ep.verdict.value == "pass", ep.reason
    assert "web-touched" in web.flags and "db-ok" in db.flags and "db-ok" not in web.flags
    events = [json.loads(line) for line in cassette.read_text().splitlines()]
    guest = [e for e in events if e["type"] == "guest"]
    # the network is set up first, one clean command per machine, each naming its machine
    assert "machine" not in guest[0] and "hostname web" in guest[0]["input"]["command"]
    assert guest[1]["machine"] == "db" and "hostname db" in guest[1]["input"]["command"]
    setup = [e for e in guest if e["input"].get("command") in ("rm db-ok", "touch web-touched")]
    assert [e.get("machine") for e in setup] == ["db", None]
    execs = [e for e in guest if e["op"] == "exec"]
    assert [e.get("machine") for e in execs] == ["db"]  # the agent's shell is on db
    alive = [e for e in guest if e["op"] == "alive"]
    assert [e.get("machine") for e in alive] == [None, "db"]  # the judge asks every machine


def test_a_multi_machine_cassette_replays_the_same_and_a_wrong_machine_is_named(
        tmp_path: Path) -> None:
    from runner.app.html_report import load_trajectory
    from runner.app.replay import replay_one

    _ep, cassette, _web, _db = _record_two(tmp_path)
    out = replay_one(cassette, offline=True, specs=[tmp_path])
    assert out.same, out.note
    traj = load_trajectory(cassette)
    assert traj.machines == ["web", "db"] and traj.agent_machine == "db"
    assert [(s.machine, s.command) for s in traj.setup] == [("db", "rm db-ok"),
                                                            ("web", "touch web-touched")]
    assert [(c.machine, c.command) for t in traj.turns for c in t.commands] == [("db", "touch db-ok")]
    # an exchange moved to the other machine: the replay says where, and which machine
    lines = cassette.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if '"op": "exec"' in line)
    moved = json.loads(lines[i])
    del moved["machine"]
    lines[i] = json.dumps(moved)
    cassette.write_text("\n".join(lines) + "\n")
    out = replay_one(cassette, offline=True, specs=[tmp_path])
    assert not out.same and "machine: the run wanted exec" in out.note and "on db" in out.note


def test_machines_reboot_side_by_side_and_replay_in_either_order(tmp_path: Path) -> None:
    from runner.app.replay import replay_one

    ep, cassette, web, db = _record_two(tmp_path, FLAGS + "reboot: true\n")
    assert ep.verdict.value == "pass", ep.reason
    assert web.reboots == 1 and db.reboots == 1
    lines = cassette.read_text().splitlines()
    reboots = [i for i, line in enumerate(lines) if '"op": "reboot"' in line]
    assert len(reboots) == 2 and reboots[1] == reboots[0] + 1
    assert replay_one(cassette, offline=True, specs=[tmp_path]).same
    # recorded in the order they ended, which is either: both orders replay the same
    lines[reboots[0]], lines[reboots[1]] = lines[reboots[1]], lines[reboots[0]]
    cassette.write_text("\n".join(lines) + "\n")
    out = replay_one(cassette, offline=True, specs=[tmp_path])
    assert out.same, out.note


def test_the_html_report_shows_each_command_after_its_machine(tmp_path: Path) -> None:
    from runner.app.html_report import write_cassette_report

    _ep, cassette, _web, _db = _record_two(tmp_path)
    page = write_cassette_report([cassette], tmp_path / "report.html").read_text()
    assert "db$ touch db-ok" in page and "db$ rm db-ok" in page and "web$ touch web-touched" in page
    assert "Machines: web, db on one private network; the agent's shell is on db" in page
    one = tmp_path / "one"
    one.mkdir()  # a single-machine report shows no machine

    single = Path(__file__).parents[2] / "recordings" / "oracle" / "nginx-stopped.jsonl"
    page = write_cassette_report([single], one / "report.html").read_text()
    assert "Machines:" not in page and "$ systemctl" in page and "None$" not in page
