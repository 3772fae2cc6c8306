"""Fixes that do not last fail: the ``recheck_after`` pause and the ``reboot`` re-check on real VMs.

Each test runs a temporary scenario twice with a scripted agent: once with a
fix that passes the post-check and does not last, once with the real fix,
and replays both cassettes offline to the same verdict. The unit tests of
the same judging step (the flag guest, no VM) are in ``test_scoring.py``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from runner.app.episodes import RunOptions, run_one
from runner.app.replay import replay_one
from runner.core.cassette import Cassette
from runner.core.episode import Episode
from runner.core.model import oracle
from runner.core.outcomes import Recheck, Verdict
from runner.core.protocol import get_protocol
from runner.core.spec import load_spec

pytestmark = pytest.mark.vm

_PORT_80_DOWN = ("for i in $(seq 50); do ss -Hltn 'sport = :80' | grep -q . || break; sleep 0.2; "
                 "done; ! ss -Hltn 'sport = :80' | grep -q .")

# Deliberately without an ``enabled`` probe: only the reboot can tell a started service from
# an enabled one, which is what this test is about.
REBOOT_SPEC = textwrap.dedent(f"""\
    id: lasting-reboot
    title: The website must come back after a reboot
    image: debian-12-nginx
    task: The website does not load. Please bring it back, for good.
    budget: {{command_timeout: 120}}  # systemctl enable reloads systemd: slow on a busy TCG host
    setup:
      - systemctl disable --now nginx
      - "{_PORT_80_DOWN}"
    probes:
      - name: home page served from outside
        http: {{url: "http://localhost/", status: 200, body_contains: "Welcome to nginx!", from: host}}
        within: 30
    invariants:
      - name: ssh still running
        service: {{name: ssh, active: true}}
    solution:
      - systemctl enable --now nginx
    reboot: true
""")

# nginx stays enabled; the shortcut starts it and leaves a job that stops it 15 s later.
PAUSE_SPEC = textwrap.dedent(f"""\
    id: lasting-pause
    title: The website must stay up
    image: debian-12-nginx
    task: The website does not load. Please bring it back, for good.
    budget: {{command_timeout: 120}}  # systemctl enable reloads systemd: slow on a busy TCG host
    setup:
      - systemctl stop nginx
      - "{_PORT_80_DOWN}"
    probes:
      - name: home page served from outside
        http: {{url: "http://localhost/", status: 200, body_contains: "Welcome to nginx!", from: host}}
        within: 15
    invariants:
      - name: ssh still running
        service: {{name: ssh, active: true}}
    solution:
      - systemctl start nginx
    recheck_after: 30
    lasting: {{reboot: false, why: "a test of the pause; the reboot re-check is the test above"}}
""")


def _episode(tmp_path: Path, spec_text: str, commands: list[str], name: str) -> tuple[Episode, Path]:
    specs = tmp_path / "specs"
    specs.mkdir(exist_ok=True)
    spec = specs / "lasting.yaml"
    spec.write_text(spec_text)
    cassette = tmp_path / f"{name}.jsonl"
    ep = run_one(load_spec(spec), oracle(commands), get_protocol("tools"), "test",
                 RunOptions(track_fix=False), cassette)
    out = replay_one(cassette, offline=True, specs=[specs])
    assert out.same, out.note
    assert out.episode is not None and out.episode.failed_recheck is ep.failed_recheck
    return ep, cassette


@pytest.mark.long(minutes=3)
def test_a_service_started_but_not_enabled_does_not_survive_a_reboot(tmp_path: Path) -> None:
    ep, cassette = _episode(tmp_path, REBOOT_SPEC, ["systemctl start nginx"], "started")
    assert ep.verdict is Verdict.FAIL, ep.reason
    assert ep.failed_recheck is Recheck.REBOOT
    assert ep.reason == "did not survive a reboot: home page served from outside"
    reboots = [e for e in Cassette.load(cassette).stream("guest") if e["op"] == "reboot"]
    assert len(reboots) == 1 and reboots[0]["result"]["clean"] is True
    # Replayed on a fresh VM (the recorded agent, a real guest): the reboot happens again.
    live = replay_one(cassette, offline=False, lenient=True, specs=[tmp_path / "specs"])
    assert live.same, live.note
    assert live.episode is not None and live.episode.failed_recheck is Recheck.REBOOT
    ep, _ = _episode(tmp_path, REBOOT_SPEC, ["systemctl enable --now nginx"], "enabled")
    assert ep.verdict is Verdict.PASS, ep.reason
    assert ep.failed_recheck is None and ep.score == 1.0


def test_a_fix_a_background_job_undoes_does_not_last(tmp_path: Path) -> None:
    undone = ("systemctl start nginx; "
              "setsid nohup sh -c 'sleep 15; systemctl stop nginx' >/dev/null 2>&1 &")
    ep, _ = _episode(tmp_path, PAUSE_SPEC, [undone], "undone")
    assert ep.verdict is Verdict.FAIL, ep.reason
    assert ep.failed_recheck is Recheck.PAUSE, ep.reason
    assert ep.reason.startswith("did not last: home page served from outside after "), ep.reason
    waited = int(ep.reason.split(" after ")[1].split()[0])
    assert 30 <= waited <= 150  # guest seconds, at least the pause asked for
    ep, _ = _episode(tmp_path, PAUSE_SPEC, ["systemctl start nginx"], "lasting")
    assert ep.verdict is Verdict.PASS, ep.reason
    assert ep.failed_recheck is None
