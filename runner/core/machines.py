"""Several machines in one scenario: their names, their private network, and the guests by name.

A scenario with ``machines:`` runs on two or more VMs that share a private
network (see docs/machines.md): machine ``i`` (from 0, in the spec's order)
is ``10.77.0.<11+i>`` with the MAC ``52:54:00:77:00:<11+i>``, and every
machine's ``/etc/hosts`` names them all. The harness sets that up at restore
with ordinary commands on each machine's clean channel (:func:`configure`),
recorded like every other guest exchange, so a replay checks it too; then it
gives the agent's machine the access the spec says (``access: ssh``: a root
key of its own, authorized on the others, their host keys known).

:class:`Machines` is the guests of one run by name. It is a :class:`Guest`
that is the agent's machine (its ``exec`` is the agent's shell), and
:meth:`Machines.on` gives any machine's guest, the first for ``None``: the
episode loop sends each setup command, probe and invariant to the machine
it names, and everything else is the code a single machine runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

from runner.core.errors import InfraError
from runner.core.guest import CommandResult, Guest, HttpResult, RebootResult

MAX_MACHINES = 4  # each is a VM of its own (256-384 MiB); four is a rack, not a benchmark host
LAN_NET = "10.77.0.0/24"
_FIRST_HOST = 11  # machine 0 is 10.77.0.11: low addresses look like routers and are not used
# The LAN NIC's MAC in every golden snapshot with one (the restore sets each machine's own).
SNAPSHOT_LAN_MAC = "52:54:00:77:00:00"
LAN_FILE = "/etc/systemd/network/05-rootbench-lan.network"  # before the image's 10-wired.network
HOSTS_MARK = "# rootbench machines"  # the /etc/hosts block the harness owns
CONFIGURE_TIMEOUT = 60.0  # seconds each configuration command may take (TCG, busy host)


# Names every guest's /etc/hosts gives its own loopback (the image writes localhost,
# ip6-localhost and ip6-loopback; Debian's resolver knows the others): a machine so named would
# be reached on the agent's own machine, never over the private network, so the scenario
# would not test what it says.
RESERVED_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback", "ip6-allnodes",
                            "ip6-allrouters", "ip6-localnet", "ip6-mcastprefix"})


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a machine of a scenario, or None when it can.

    The schema checks the shape (``[a-z][a-z0-9-]*``, at most 20); this is what a shape cannot
    say: a name the guests' /etc/hosts already gives to loopback (:data:`RESERVED_NAMES`).
    The spec loader asks it of each ``machines[i].name`` and says the reason in one line.
    """
    if name in RESERVED_NAMES:
        return (f"{name!r} is a reserved name: every machine's /etc/hosts gives it to its own "
                "loopback, so it would never reach another machine (choose another)")
    return None


class Access(str, Enum):
    """How the agent's shell reaches the other machines (the spec's ``access``)."""

    SSH = "ssh"  # `ssh NAME` as root: a key of the agent machine's root, authorized on each other
    NETWORK = "network"  # only their services over the network (psql -h db, curl http://web/)

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Machine:
    """One VM of a multi-machine scenario: its name (also its hostname) and its image recipe."""

    name: str
    image: str
    index: int  # its place in the spec's list, which fixes its address

    @property
    def address(self) -> str:
        return f"10.77.0.{_FIRST_HOST + self.index}"

    @property
    def mac(self) -> str:
        return f"52:54:00:77:00:{_FIRST_HOST + self.index:02x}"


def hosts_block(machines: tuple[Machine, ...]) -> str:
    """The lines every machine's /etc/hosts gets: each machine's address and name."""
    return "\n".join([HOSTS_MARK, *(f"{m.address} {m.name}" for m in machines)]) + "\n"


def network_commands(machine: Machine, machines: tuple[Machine, ...]) -> str:
    """One shell script that makes ``machine`` itself on the private network.

    Its hostname; ``/etc/hosts`` with the image's lines (127.0.1.1 renamed) and
    the machines' block; the LAN NIC (found by the snapshot's MAC, or already
    its own after a re-run) given its own MAC and its address, at once with
    ``ip`` and in a systemd-networkd file matched by that MAC, so a restart of
    networkd or a reboot keeps it (``networkctl reload`` would apply the file
    now too, at about a second under TCG: ``ip`` is 50 ms).
    """
    name, addr, mac = machine.name, machine.address, machine.mac
    hosts = hosts_block(machines)
    return f"""set -e
echo {name} > /etc/hostname && hostname {name}
{{ grep -v -e '^127\\.0\\.1\\.1[[:space:]]' -e '^10\\.77\\.0\\.' -e '^{HOSTS_MARK}' /etc/hosts
  echo '127.0.1.1 {name}'; printf '%s' {shlex.quote(hosts)}; }} > /etc/hosts.rb && mv /etc/hosts.rb /etc/hosts
dev=
for d in /sys/class/net/*; do
  case "$(cat "$d/address")" in {SNAPSHOT_LAN_MAC}|{mac}) dev=${{d##*/}};; esac
done
test -n "$dev" || {{ echo "no private network interface"; exit 1; }}
printf '[Match]\nMACAddress={mac}\n\n[Network]\nAddress={addr}/24\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' > {LAN_FILE}
ip link set dev "$dev" address {mac}
ip addr replace {addr}/24 dev "$dev"
echo "$dev {addr} {name}"
"""


SSH_KEYGEN = ("test -s /root/.ssh/id_ed25519 || ssh-keygen -q -t ed25519 -N '' "
              "-C \"root@$(hostname)\" -f /root/.ssh/id_ed25519 && cat /root/.ssh/id_ed25519.pub")
HOST_KEY = "cat /etc/ssh/ssh_host_ed25519_key.pub"


def authorize_command(public_key: str) -> str:
    """Add the agent machine's root key to this machine's root authorized_keys (once)."""
    key = shlex.quote(public_key.strip())
    return (f"mkdir -p /root/.ssh && chmod 700 /root/.ssh && "
            f"{{ grep -qxF {key} /root/.ssh/authorized_keys 2>/dev/null || "
            f"echo {key} >> /root/.ssh/authorized_keys; }} && chmod 600 /root/.ssh/authorized_keys")


def known_hosts_command(entries: list[str]) -> str:
    """Write the other machines' host keys (``name,address keytype key``) to known_hosts."""
    text = "".join(f"{e}\n" for e in entries)
    return (f"mkdir -p /root/.ssh && printf '%s' {shlex.quote(text)} >> /root/.ssh/known_hosts && "
            "chmod 600 /root/.ssh/known_hosts")


def _check(result: CommandResult, machine: str, what: str) -> CommandResult:
    if result.timed_out or result.exit_code != 0:
        out = " ".join(result.output.split())[-160:]
        raise InfraError(f"machine {machine}: {what} failed "
                         f"({'timed out' if result.timed_out else f'exit {result.exit_code}'}): {out}")
    return result


def configure(guests: Machines, machines: tuple[Machine, ...], access: Access) -> None:
    """Put every machine on the private network, then give the agent's machine its access.

    Each step is a clean command on one machine, so a recording holds them
    and a replay must make the same ones. A step that fails is the
    harness's problem (``InfraError``), never the agent's.
    """
    for m in machines:
        _check(guests.on(m.name).run_clean(network_commands(m, machines), CONFIGURE_TIMEOUT),
               m.name, "joining the private network")
    if access is not Access.SSH:
        return
    agent = guests.agent_name
    key = _check(guests.on(agent).run_clean(SSH_KEYGEN, CONFIGURE_TIMEOUT), agent,
                 "making the root key").output.strip().splitlines()
    public = next((line for line in key if line.startswith("ssh-")), "")
    if not public:
        raise InfraError(f"machine {agent}: no public key in ssh-keygen's output")
    known: list[str] = []
    for m in machines:
        if m.name == agent:
            continue
        g = guests.on(m.name)
        _check(g.run_clean(authorize_command(public), CONFIGURE_TIMEOUT), m.name,
               "authorizing the agent's key")
        host = _check(g.run_clean(HOST_KEY, CONFIGURE_TIMEOUT), m.name, "reading its host key")
        words = host.output.split()
        if len(words) < 2 or not words[0].startswith("ssh-"):
            raise InfraError(f"machine {m.name}: no ssh host key in {HOST_KEY!r}")
        known.append(f"{m.name},{m.address} {words[0]} {words[1]}")
    _check(guests.on(agent).run_clean(known_hosts_command(known), CONFIGURE_TIMEOUT), agent,
           "writing known_hosts")


class Machines(Guest):
    """The guests of one multi-machine run by name; as a :class:`Guest`, the agent's machine."""

    def __init__(self, guests: Mapping[str, Guest], agent: str | None = None) -> None:
        if not guests:
            raise ValueError("no machines")
        self.guests = dict(guests)
        self.first = next(iter(self.guests))
        self.agent_name = agent or self.first
        self.agent = self.guests[self.agent_name]

    def on(self, machine: str | None) -> Guest:
        """The guest of ``machine``; the first machine's for None (the spec's default)."""
        return self.guests[machine or self.first]

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        return self.agent.exec(command, timeout, output_limit)

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        return self.agent.run_clean(command, timeout)

    def inspect(self, question: str, timeout: float) -> CommandResult:
        return self.agent.inspect(question, timeout)

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        return self.agent.host_http(guest_port, path, timeout)

    def alive(self) -> bool:
        """Every machine runs and answers (each asked, in order, so a recording says which)."""
        return all([g.alive() for g in self.guests.values()])

    def reboot(self, timeout: float) -> RebootResult:
        """Reboot every machine side by side (a boot is minutes under TCG: one after the other
        would be their sum); clean only if each was, as long as the slowest. The machines'
        reboot exchanges are recorded in the order they end, which a replay does not hold
        them to (:class:`~runner.core.replay.ReplayGuest`)."""
        guests = list(self.guests.values())
        with ThreadPoolExecutor(max_workers=len(guests), thread_name_prefix="rootbench-reboot") as pool:
            futures = [pool.submit(g.reboot, timeout) for g in guests]
            results = [f.result() for f in futures]  # the first machine's failure, if any
        return RebootResult(clean=all(r.clean for r in results),
                            seconds=round(max(r.seconds for r in results), 3))

    def close(self) -> None:
        for g in self.guests.values():
            g.close()
