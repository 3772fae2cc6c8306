"""One conformance suite for every guest: serial console, SSH, and the replayed cassette.

The replay variant runs each check twice: first on a real serial guest while
recording, then on a ReplayGuest fed that cassette; both must pass the same
assertions, so a replay is as faithful as the real channel.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runner.backends.images import GUEST_HOSTNAME
from runner.backends.sandbox import Sandbox
from runner.backends.serial import _NEW_SHELL
from runner.core.cassette import Cassette, CassetteWriter
from runner.core.guest import Guest
from runner.core.recording import RecordingGuest
from runner.core.replay import ReplayGuest

pytestmark = pytest.mark.vm

Check = Callable[[Guest], None]
# A cassette header the reader accepts: these cassettes hold guest exchanges only.
_HEADER = {"type": "header", "format": 1, "scenario": {
    "id": "conformance", "title": "guest conformance", "image": "debian-12-nginx", "task": "",
    "budget": {}, "probes": [], "invariants": []}}


@pytest.fixture(scope="module", params=["serial", "ssh", "replay"])
def conform(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Callable[[Check], None]]:
    kind = request.param
    transport = "ssh" if kind == "ssh" else "serial"
    with Sandbox("debian-12-nginx", accel="auto", transport=transport) as box:
        if kind != "replay":
            yield lambda check: check(box.guest)
            return
        counter = iter(range(10_000))

        def record_then_replay(check: Check) -> None:
            path: Path = tmp_path_factory.mktemp("cassette") / f"c{next(counter)}.jsonl"
            with CassetteWriter(path) as w:
                w.write(_HEADER)
                check(RecordingGuest(box.guest, w))
            check(ReplayGuest(Cassette.load(path)))

        yield record_then_replay


def test_exit_codes(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        assert g.exec("true", 10).exit_code == 0
        assert g.exec("false", 10).exit_code == 1
        r = g.exec("echo out; echo err >&2; exit 42", 10)
        assert r.exit_code == 42 and r.output == "out\nerr\n"
    conform(check)


def test_large_output_is_capped_not_desynced(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        r = g.exec("seq 1 100000", 30, output_limit=4000)
        assert r.exit_code == 0 and r.truncated
        assert r.output.startswith("1\n2\n3\n") and 4000 <= len(r.output) <= 4 * 4000
        assert g.exec("echo next", 10).output == "next\n"
    conform(check)


def test_binary_output_and_escapes_come_back_intact(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        r = g.exec(r"printf '\x1b[31mred\x1b[0m \x1b]0;title\x07 nul:\x00: bell\x07'", 10)
        assert r.output == "\x1b[31mred\x1b[0m \x1b]0;title\x07 nul:\x00: bell\x07"
        r = g.exec("head -c 4096 /dev/urandom", 10)
        assert r.exit_code == 0 and len(r.output) > 1000
        assert g.exec("echo still in sync", 10).output == "still in sync\n"
    conform(check)


def test_fake_sentinels_and_prompts_cannot_forge_a_frame(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        fake = "RBdeadbeefdeadbeef:3:aGk=:0:RBdeadbeefdeadbeef\nroot@rootbench:~# \nRBSYNC0\n"
        r = g.exec(f"printf '%s' '{fake}'; exit 5", 10)
        assert r.exit_code == 5 and r.output == fake
        r = g.exec("printf 'RB%s\\n' $(cat /proc/sys/kernel/random/uuid)", 10)
        assert r.exit_code == 0 and r.output.startswith("RB")
    conform(check)


def test_timeout_kills_the_command_and_the_shell_survives(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        r = g.exec("sleep 300", 2)
        assert r.timed_out and r.exit_code is None
        r = g.exec("tail -f /dev/null", 2)
        assert r.timed_out
        assert g.exec("pgrep -x 'sleep|tail' || echo none", 10).output.strip() == "none"
        assert g.exec("echo alive", 10).output == "alive\n"
    conform(check)


def test_exit_124_and_137_are_exit_codes_not_timeouts(conform: Callable[[Check], None]) -> None:
    """``timeout``'s own codes, returned by the command itself: the timeout did not fire."""
    def check(g: Guest) -> None:
        r = g.exec("exit 124", 10)
        assert r.exit_code == 124 and not r.timed_out
        r = g.exec("echo dying; kill -9 $BASHPID", 10)
        assert r.exit_code == 137 and not r.timed_out and r.output == "dying\n"
        assert g.run_clean("exit 124", 10).exit_code == 124
        r = g.exec("sleep 30", 2)
        assert r.timed_out and r.exit_code is None and r.duration < 15
        # The clock the helper measures with is monotonic: setting the date does not fool it.
        r = g.exec("date -s '+1 hour' >/dev/null; exit 124", 10)
        g.run_clean("date -s '-1 hour' >/dev/null", 10)
        assert r.exit_code == 124 and not r.timed_out
    conform(check)


def test_killing_its_own_shell_is_reported_and_the_next_command_runs(
        conform: Callable[[Check], None]) -> None:
    """``$$`` is the agent's shell, as in an interactive login: killing it loses the exit code, not the channel."""
    def check(g: Guest) -> None:
        r = g.exec("cd /tmp; echo before; kill -9 $$; echo after", 10)
        assert r.exit_code is None and not r.timed_out
        assert r.output.startswith("before\nafter\n") and "its exit code is unknown" in r.output
        r = g.exec("echo next; pwd; cd /root", 10)
        assert r.exit_code == 0 and r.output == "next\n/tmp\n"  # the command itself ran to its end
    conform(check)


def test_an_agent_killing_python_or_its_parent_keeps_the_channel(conform: Callable[[Check], None]) -> None:
    """The command helper in the guest is python3: ``pkill python3`` must not cut the channel,
    and a command that kills the helper itself (``kill $PPID`` is it) gets a new one."""
    def check(g: Guest) -> None:
        r = g.exec("pkill python3; pkill -f python; echo still-here", 10)
        assert r.exit_code == 0 and r.output == "still-here\n"
        r = g.exec("kill -9 $PPID", 10)
        assert r.exit_code is None and not r.timed_out and "restarted" in r.output
        assert g.exec("echo next", 10).output == "next\n"
        assert g.run_clean("echo clean", 10).output == "clean\n"
    conform(check)


def test_the_prompt_the_serial_guest_watches_for_is_the_guest_hostname(
        conform: Callable[[Check], None]) -> None:
    """One hostname for the image and the serial guest's new-shell prompt."""
    def check(g: Guest) -> None:
        assert g.run_clean("hostname; cat /etc/hostname", 10).output.split() == [GUEST_HOSTNAME] * 2
        assert _NEW_SHELL.search(b"\x1b[?2004hroot@" + GUEST_HOSTNAME.encode() + b":~# ")
    conform(check)


def test_commands_reading_stdin_do_not_hang(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        r = g.exec("cat; read x; echo \"[$x]\"", 10)
        assert not r.timed_out and r.output == "[]\n"
    conform(check)


def test_backgrounded_daemon_returns_at_once(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        r = g.exec("sleep 120 & echo started", 10)
        assert r.exit_code == 0 and r.output == "started\n" and r.duration < 8
        r = g.exec("setsid python3 -m http.server 8099 >/dev/null 2>&1 < /dev/null & "
                   "for i in $(seq 100); do ss -Hltn 'sport = :8099' | grep -q . && break; sleep 0.2; done; "
                   "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8099/", 40)
        assert r.output == "200"
        g.exec("pkill -f 'http.server 8099'; pkill -x sleep; true", 10)
    conform(check)


def test_pkill_f_does_not_find_the_shell_running_it(conform: Callable[[Check], None]) -> None:
    """As in a real interactive shell: the command's text is in no argv, so the second half runs."""
    def check(g: Guest) -> None:
        r = g.exec("sleep 77 & pkill -f 'sleep 77'; echo survived", 10)
        assert r.exit_code == 0 and r.output == "survived\n"
        assert g.exec("pgrep -f 'sleep 77' || echo gone", 10).output == "gone\n"
    conform(check)


def test_exit_ends_only_the_command(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        assert g.exec("exit 7", 10).exit_code == 7
        assert g.exec("exec bash -c 'exit 3'", 10).exit_code == 3
        assert g.exec("echo after exit", 10).output == "after exit\n"
    conform(check)


def test_cwd_persists_and_long_commands_work(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        g.exec("cd /etc/nginx", 10)
        assert g.exec("pwd", 10).output == "/etc/nginx\n"
        long = "echo " + "x" * 9000 + " | wc -c"
        assert g.exec(long, 20).output.strip() == "9001"
        assert g.exec("echo 'héllo ✓ ünïcode'", 10).output == "héllo ✓ ünïcode\n"
        g.exec("cd /root", 10)
    conform(check)


def test_probe_channel_ignores_what_the_agent_defined(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        g.exec("printf '#!/bin/sh\\necho active\\n' > /usr/local/bin/systemctl; "
               "chmod +x /usr/local/bin/systemctl; echo 'alias curl=true' >> /root/.bashrc; "
               "echo 'export PATH=/usr/local/bin:$PATH' >> /root/.bashrc", 10)
        r = g.run_clean("command -v systemctl; echo $PATH; type curl", 10)
        assert r.output.splitlines()[0] == "/usr/bin/systemctl"
        assert "/usr/local" not in r.output and "alias" not in r.output
        g.exec("rm -f /usr/local/bin/systemctl; sed -i '/alias curl/d;/usr\\/local\\/bin:/d' /root/.bashrc", 10)
    conform(check)


def test_output_flood_is_bounded(conform: Callable[[Check], None]) -> None:
    def check(g: Guest) -> None:
        r = g.exec("yes", 5, output_limit=4000)
        assert r.truncated and r.output.startswith("y\ny\n")
        r = g.exec("cat /dev/urandom", 5, output_limit=4000)
        assert r.truncated
        assert g.exec("df --output=avail /run/rb | tail -1", 10).exit_code == 0
        assert g.exec("echo ok", 10).output == "ok\n"
    conform(check)


def test_a_reboot_keeps_the_disk_loses_the_rest_and_the_channel_comes_back(
        conform: Callable[[Check], None]) -> None:
    """Last in this module: it reboots the module's VM (each transport's own, and the replay's)."""
    def check(g: Guest) -> None:
        boot_id = "cat /proc/sys/kernel/random/boot_id"
        before = g.run_clean(boot_id, 15).output.strip()
        g.exec("cd /etc; touch /root/rb-kept /run/rb-lost", 10)
        r = g.reboot(420)
        assert r.clean and r.seconds > 0  # systemctl reboot, not a reset from outside
        after = g.run_clean(f"{boot_id}; ls /root/rb-kept /run/rb-lost 2>&1; date +%s", 15)
        lines = after.output.splitlines()
        assert lines[0] != before and len(lines[0]) == 36, after.output
        assert "/root/rb-kept" in lines and any("/run/rb-lost" in x and "No such" in x for x in lines)
        assert abs(int(lines[-1]) - time.time()) < 120  # the clock was set (replay: just recorded)
        assert g.exec("pwd; echo back", 10).output == "/root\nback\n"  # a fresh agent shell
        assert g.alive()
        g.run_clean("rm -f /root/rb-kept", 10)
    conform(check)
