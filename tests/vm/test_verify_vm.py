"""verify on real VMs: the whole suite valid, a broken scenario's failing check named, repeats
agreeing, a passing shortcut named.
"""

from __future__ import annotations

import json
import textwrap
from datetime import date
from pathlib import Path

import pytest
from conftest import CliResult, run_cli
from scenario_texts import SHORTCUT_SPEC

from runner.app.verify import (
    CHECKS,
    stale_proof,
)
from runner.app.verify_run import defer_stale, rotating_sample
from runner.core import layout
from runner.core.outcomes import ReplayResult
from runner.core.paths import repo_root
from runner.core.spec import load_specs


def _verify(*args: str, jobs: int = 2, timeout: float = 3600) -> CliResult:
    return run_cli("verify", "--jobs", str(jobs), *args, timeout=timeout)


@pytest.mark.vm
@pytest.mark.long(minutes=20)
def test_the_whole_suite_is_valid(tmp_path: Path) -> None:
    """Every scenario proven valid, live only where something changed (make test's way).

    ``make verify`` runs every oracle, noop, shortcut and alternative live
    and records them. Here the noop, the shortcuts and the alternatives are
    proven from those committed recordings (each must be of today's spec and
    replay offline to its verdict), and so is the oracle of every scenario
    whose recording still stands for a live run (``verify --oracle
    changed``: the same spec, judging rules, image recipe and guest helper);
    the others run live on real VMs, with a sample of SAMPLE that rotates
    daily, so every recording is re-proven live within about a month and a
    recording that no longer matches the machine cannot hide for long.
    Running all 69 live with their reboot re-checks took most of ``make
    test``'s time (41 of 54.5 minutes on 12-06) and grew with every scenario.

    Of the scenarios whose recordings no longer prove them, at most MAX_LIVE
    run live a day (a window that moves daily; the daily sample beside it);
    the rest are deferred and
    reported apart: after a judging-rules bump made every recording stale,
    until ``make verify`` records them all again, this keeps the test within
    CI's time and still proves each of them live within a few days.

    On a fresh cache this test also builds the images the live scenarios need.
    """
    r = _verify("--record-to", str(tmp_path), "--shortcuts", "recorded", "--noop", "recorded",
                "--alternatives", "recorded", "--oracle", "changed", "--sample", str(SAMPLE),
                "--max-live", str(MAX_LIVE), jobs=3)
    scenarios = load_specs([repo_root() / "specs"])
    recorded = repo_root() / "recordings" / "oracle"
    day = date.today().toordinal()
    sampled = rotating_sample(scenarios, SAMPLE, day)
    deferred = defer_stale(scenarios, recorded, sampled, MAX_LIVE, day)
    stale = {s.id for i, s in enumerate(scenarios) if i not in deferred
             and stale_proof(recorded / layout.oracle_cassette_name(s.id), s) is not None}
    checked = len(scenarios) - len(deferred)
    # The scenarios known not to be valid under rules 3 fail here exactly when they are checked
    # (live, in today's window): the test holds the suite to what is known, never hides it.
    failing = {i for i in KNOWN_INVALID if i in stale}
    assert r.returncode == (1 if failing else 0), r.stdout + r.stderr[-3000:]
    assert f"{checked - len(failing)}/{checked} scenarios valid" in r.stdout, r.stdout[-3000:]
    for scenario_id in failing:
        assert f"  {scenario_id}: " in r.stdout and KNOWN_INVALID[scenario_id] in r.stdout
    assert (f"; {len(deferred)} deferred" in r.stdout) is bool(deferred)
    # live exactly where something changed (up to --max-live), and the sample: their oracle
    # cassettes are new; the deferred ones ran nothing
    assert {p.name.removesuffix(".jsonl") for p in tmp_path.glob("*.jsonl")} == \
        stale | {scenarios[i].id for i in sampled}
    assert len(sampled) == SAMPLE and len(stale - {scenarios[i].id for i in sampled}) <= MAX_LIVE
    kept = [s for i, s in enumerate(scenarios) if i not in deferred]
    shortcuts = sum(len(s.shortcuts) + len(s.alternatives) for s in kept)
    # proven from the recordings, not re-recorded
    assert not (tmp_path / "shortcuts").exists() and not (tmp_path / "noop").exists()
    # verify ends by writing an HTML report of its noop, oracle, shortcut and alternative episodes
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("[verify] report: ")]
    page = Path(line.split(": ", 1)[1]).read_text()
    assert page.count('class="episode"') == 2 * len(kept) + shortcuts
    assert all(s.id in page for s in kept)


# make test's bound on the scenarios whose recordings no longer prove them (a judging-rules
# bump makes every one stale): run live a window of this many a day, the rest deferred, so the
# whole-suite verify stays within CI's time while `make verify` re-records them.
MAX_LIVE = 1
# The rotating daily sample of scenarios proven live although their recordings stand: two a day
# go round the 69 in about five weeks. Each live scenario costs a few minutes of TCG with its
# reboot re-check, on 2 cores beside the rest of make test.
SAMPLE = 2

# Scenarios whose oracle does not pass under judging rules 3 yet, each with the text of why
# verify says so. Each is a fault of the scenario (not of the harness) to mend in its spec and
# record again; this list only keeps make test honest about them until then. None today: the
# seven whose fault lived in what `setup` made at run time (a tmpfs or a network namespace that
# the reboot re-check took away) keep it in files that outlive a reboot since 2026-12-07 (an
# fstab-mounted ext4 image; units that rebuild the partner network at boot).
KNOWN_INVALID: dict[str, str] = {}


BROKEN = {
    "fault-does-not-land": ("setup: ['true']\nsolution: ['true']\n", "fault lands"),
    "wrong-solution": ("setup: [systemctl stop nginx]\nsolution: ['echo not a fix']\n", "oracle passes"),
    "bad-invariant": ("setup: [systemctl stop nginx]\nsolution: [systemctl start nginx]\n"
                      "invariants: [{service: {name: no-such-unit, active: true}}]\n", "baseline"),
    "invariant-needs-the-fix": ("setup: [systemctl stop nginx]\nsolution: [systemctl start nginx]\n"
                                "invariants: [{port: {port: 80}}]\n", "noop fails"),
}


@pytest.mark.vm
def test_verify_names_the_failing_check(tmp_path: Path) -> None:
    for name, (extra, _check) in BROKEN.items():
        (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(f"""\
            id: {name}
            title: broken on purpose
            image: debian-12-nginx
            task: The site is down.
            probes:
              - service: {{name: nginx, active: true}}
            """) + extra)
    r = _verify(str(tmp_path), "--record-to", str(tmp_path / "rec"))
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    for name, (_extra, check) in BROKEN.items():
        line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(f"{name}:"))
        assert check in line, line
    assert f"0/{len(BROKEN)} scenarios valid" in r.stdout


PASSING = ("  - name: the fix itself\n"
           "    kind: other\n"
           "    why: not a shortcut at all; verify must say it passed\n"
           "    commands: [systemctl start nginx]\n")


@pytest.mark.vm
def test_repeat_runs_the_checks_again_and_agreeing_tries_are_not_flaky(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "by-hand.yaml").write_text(SHORTCUT_SPEC.format(id="by-hand"))
    r = _verify(str(tmp_path / "specs"), "--repeat", "2", "--record-to", str(tmp_path / "rec"),
                "--format", "plain")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("by-hand"))
    assert row.split()[1:9] == ["ok", "ok", "ok", "ok", "ok:1/1", "none", "2", "no"], row
    assert "try 2 of 2" in r.stderr and len(list((tmp_path / "rec").glob("*.jsonl"))) == 1
    assert sorted(p.relative_to(tmp_path / "rec").as_posix()
                  for p in (tmp_path / "rec").rglob("*.jsonl")) == [
        "by-hand.jsonl", "noop/by-hand.jsonl", "shortcuts/by-hand/start-it-by-hand.jsonl"]
    # make test's way: the oracle live, the noop and the shortcut proven from those recordings
    r = _verify(str(tmp_path / "specs"), "--noop", "recorded", "--shortcuts", "recorded",
                "--recorded-from", str(tmp_path / "rec"), "--record-to", str(tmp_path / "again"),
                "--format", "plain")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("by-hand"))
    assert row.split()[1:7] == ["ok", "ok", "ok", "ok", "ok:1/1", "none"], row
    assert "noop agent" not in r.stderr and "oracle agent" in r.stderr
    assert [p.name for p in (tmp_path / "again").rglob("*.jsonl")] == ["by-hand.jsonl"]


@pytest.mark.vm
def test_a_shortcut_that_passes_makes_the_scenario_invalid_and_is_named(tmp_path: Path) -> None:
    from runner.app.replay import replay_one

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "proven.yaml").write_text(SHORTCUT_SPEC.format(id="proven"))
    (specs / "fooled.yaml").write_text(SHORTCUT_SPEC.format(id="fooled") + PASSING)
    (specs / "unproven.yaml").write_text(SHORTCUT_SPEC.format(id="unproven").split("shortcuts:")[0])
    rec = tmp_path / "rec"
    r = _verify(str(specs), "--record-to", str(rec), "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    rows = {row["scenario"]: row for row in json.loads(r.stdout)}
    assert rows["proven"]["valid"] is True and rows["proven"]["shortcuts rejected"] == "ok:1/1"
    assert rows["fooled"]["valid"] is False and rows["fooled"]["shortcuts rejected"] == "FAIL:1/2"
    assert rows["unproven"]["valid"] is False and rows["unproven"]["shortcuts rejected"] == "none"
    assert all(rows[s][c] == "ok" for s in rows for c in CHECKS[:4])  # only the fifth differs
    [passed] = [p for p in rows["fooled"]["problems"] if p.startswith("shortcut ")]
    assert passed.startswith("shortcut 'the fix itself' passed: all 1 probes passed"), passed
    by_hand, itself = rows["fooled"]["shortcuts"]
    assert (by_hand["rejected"], by_hand["verdict"], itself["rejected"]) == (True, "fail", False)
    assert "not proven: the spec lists no shortcuts" in rows["unproven"]["problems"][0]
    # every shortcut's cassette is beside the oracle's, and replays offline the same
    for sid, stem in [("proven", "start-it-by-hand"), ("fooled", "start-it-by-hand"),
                      ("fooled", "the-fix-itself")]:
        path = rec / "shortcuts" / sid / f"{stem}.jsonl"
        assert replay_one(path, offline=True, specs=[specs]).result is ReplayResult.SAME, path
    assert rows["fooled"]["shortcuts"][1]["cassette"] == str(rec / "shortcuts/fooled/the-fix-itself.jsonl")
    # the table names the shortcut that passed
    r = _verify(str(specs / "fooled.yaml"), "--record-to", str(rec), "--format", "plain")
    assert "fooled: shortcut 'the fix itself' passed: " in r.stdout, r.stdout
