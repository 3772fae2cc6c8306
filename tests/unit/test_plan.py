"""The bench's plan and its driver loop, without a VM or a model (runner.app.plan, runner.app.driver).

What runs next, what is replayed, what is done and in which order results
are written is a plain object: these tests build it from the bundled specs
and hand-made episodes. The driver is fed real executors: the in-process
one and a pool of child processes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

import pytest

from runner.app.agents import AgentChoice
from runner.app.bench import run_bench
from runner.app.driver import Job, Start, drive
from runner.app.episodes import RunOptions
from runner.app.events import BenchListener, Step
from runner.app.executors import Done, InProcess, ProcessPool
from runner.app.plan import Arm, BenchPlan, Round, levels, matrix
from runner.core import layout
from runner.core.cassette import RecordMode
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.outcomes import AgentKind, Verdict
from runner.core.paths import default_spec_dirs, repo_root
from runner.core.selection import pick_ids
from runner.core.spec import Scenario, load_specs

ORACLE = AgentChoice(kind=AgentKind.ORACLE)
LIVE_05B = repo_root() / "recordings" / "live" / "qwen2.5-coder-0.5b-json"


def _scenarios(*ids: str) -> list[Scenario]:
    return pick_ids(load_specs(default_spec_dirs()), list(ids))


def _ended(rd: Round, level: int, verdict: Verdict) -> Episode:
    return Episode(rd.scenario.id, AgentKind.ORACLE, "", "json", round=rd.number, verdict=verdict,
                   hint_level=level, arm=rd.arm.label)


def test_a_ladder_climbs_after_each_failure_and_stops_at_a_pass() -> None:
    [s] = _scenarios("rogue-port-80")
    assert len(s.hints) >= 2
    plan = BenchPlan([s], [Arm(ORACLE)], RunOptions(ladder=True), [])
    [rd] = plan.rounds
    assert levels(s, RunOptions(ladder=True)) == list(range(len(s.hints) + 1))
    assert plan.next_step(rd, retry=False) == 0
    plan.record(rd.key(0), _ended(rd, 0, Verdict.FAIL))
    assert plan.next_step(rd, retry=False) == 1
    plan.record(rd.key(1), _ended(rd, 1, Verdict.PASS))
    assert plan.next_step(rd, retry=False) is None
    assert plan.todo(None, retry=False) == []


def test_an_infra_error_does_not_climb_and_runs_again_only_on_a_retry() -> None:
    [s] = _scenarios("rogue-port-80")
    plan = BenchPlan([s], [Arm(ORACLE)], RunOptions(ladder=True), [])
    [rd] = plan.rounds
    plan.record(rd.key(0), _ended(rd, 0, Verdict.FAIL))
    plan.record(rd.key(1), _ended(rd, 1, Verdict.INFRA_ERROR))
    assert plan.next_step(rd, retry=False) is None  # says nothing about the help needed
    assert plan.next_step(rd, retry=True) == 1  # --retry-infra or a resume: that level again
    assert plan.todo(None, retry=True) == [rd]


def test_without_the_ladder_a_round_is_one_episode_at_its_capped_level() -> None:
    [s] = _scenarios("rogue-port-80")
    plan = BenchPlan([s], [Arm(ORACLE, hints=99)], RunOptions(hints=99), [])
    [rd] = plan.rounds
    assert plan.next_step(rd, retry=False) == len(s.hints)
    plan.record(rd.key(len(s.hints)), _ended(rd, len(s.hints), Verdict.FAIL))
    assert plan.next_step(rd, retry=False) is None  # a failure ends it: no ladder


def test_rounds_come_arm_by_arm_then_round_by_round_then_as_given() -> None:
    a, b = _scenarios("rogue-port-80", "permission-403")
    arms = matrix([ORACLE], ["json", "tools"], [0])
    plan = BenchPlan([b, a], arms, RunOptions(repeat=2), [])
    assert [(rd.arm.label, rd.number, rd.scenario.id) for rd in plan.rounds] == [
        (arms[0].label, 0, b.id), (arms[0].label, 0, a.id), (arms[0].label, 1, b.id),
        (arms[0].label, 1, a.id), (arms[1].label, 0, b.id), (arms[1].label, 0, a.id),
        (arms[1].label, 1, b.id), (arms[1].label, 1, a.id)]
    assert plan.models() == [ORACLE]  # one server for both protocols
    # results in that order whatever order they ended in; a resume's extra episodes after
    stray = Episode("gone", AgentKind.ORACLE, "", "json", arm=arms[0].label)
    done = BenchPlan([b, a], arms, RunOptions(repeat=2), [stray])
    for rd in reversed(done.rounds):
        done.record(rd.key(0), _ended(rd, 0, Verdict.PASS))
    assert [(e.arm, e.round, e.scenario) for e in done.ordered()] == [
        *((rd.arm.label, rd.number, rd.scenario.id) for rd in plan.rounds),
        (arms[0].label, 0, "gone")]


def test_a_resume_counts_what_is_done(tmp_path: Path) -> None:
    a, b = _scenarios("rogue-port-80", "permission-403")
    first = BenchPlan([a, b], [Arm(ORACLE)], RunOptions(), [])
    rd_a = first.rounds[0]
    plan = BenchPlan([a, b], [Arm(ORACLE)], RunOptions(), [_ended(rd_a, 0, Verdict.FAIL)])
    assert [rd.scenario.id for rd in plan.todo(None, retry=True)] == [b.id]


def test_recordings_decide_what_is_replayed_and_what_runs_live(tmp_path: Path) -> None:
    a, b = _scenarios("rogue-port-80", "permission-403")
    (tmp_path / layout.oracle_cassette_name(a.id)).write_text("{}\n")  # verify's name, level 0
    (tmp_path / layout.cassette_name(b.id, 0, 1)).write_text("{}\n")  # b only at level 1
    opts = RunOptions(ladder=True)
    plan = BenchPlan([a, b], [Arm(ORACLE)], opts, [], tmp_path, RecordMode.ONCE)
    rd_a, rd_b = plan.rounds
    assert plan.recorded(rd_a, 0) == tmp_path / f"{a.id}.jsonl"
    assert plan.recorded(rd_b, 0) is None and plan.recorded(rd_b, 1) is not None
    assert plan.live(None, retry=False) == [rd_a, rd_b]  # a's level 0 is replayed, not its 1 and 2
    for level in levels(a, opts)[1:]:
        (tmp_path / layout.cassette_name(a.id, 0, level)).write_text("{}\n")
    assert plan.live(None, retry=False) == [rd_b]  # a's whole ladder replays: no model for it
    # --record-mode all runs everything live, whatever is recorded
    everything = BenchPlan([a, b], [Arm(ORACLE)], opts, [], tmp_path, RecordMode.ALL)
    assert everything.live(None, retry=False) == everything.rounds
    everything.check(resume=False)  # nothing to refuse


def test_a_recorded_pass_ends_the_climb_so_no_model_is_needed(tmp_path: Path) -> None:
    """Committed ladders of the 1.5B: ssh-stopped passed at level 0 and cron-stopped at level 2,
    so their higher levels were never recorded and need no model; a ladder whose last
    recording failed, or passed under another version of the spec, may still climb live."""
    live_15b = LIVE_05B.parent / "qwen2.5-coder-1.5b-json"
    passed0, passed2 = _scenarios("ssh-stopped", "cron-stopped")
    for name in ("ssh-stopped.r0.jsonl", "cron-stopped.r0.jsonl", "cron-stopped.r0.h1.jsonl",
                 "cron-stopped.r0.h2.jsonl"):
        (tmp_path / name).write_bytes((live_15b / name).read_bytes())
    assert not (live_15b / "cron-stopped.r0.h3.jsonl").exists()  # the ladder stopped at its pass
    opts = RunOptions(ladder=True)
    plan = BenchPlan([passed0, passed2], [Arm(ORACLE)], opts, [], tmp_path, RecordMode.ONCE)
    assert plan.live(None, retry=False) == []
    # without its level-2 pass, cron-stopped's level 2 and 3 may run live
    (tmp_path / "cron-stopped.r0.h2.jsonl").unlink()
    plan = BenchPlan([passed0, passed2], [Arm(ORACLE)], opts, [], tmp_path, RecordMode.ONCE)
    assert [rd.scenario.id for rd in plan.live(None, retry=False)] == ["cron-stopped"]
    # a pass of an older spec is no proof: its replay may not pass today
    # another version of the spec: one the recorded run was not judged by (a forbidden pattern more)
    older = dataclasses.replace(passed0, spec_hash="0" * len(passed0.spec_hash),
                                forbidden=(*passed0.forbidden, "never-typed"))
    plan = BenchPlan([older], [Arm(ORACLE)], opts, [], tmp_path, RecordMode.ONCE)
    assert [rd.scenario.id for rd in plan.live(None, retry=False)] == ["ssh-stopped"]


def test_record_mode_none_is_refused_before_anything_runs_naming_what_is_missing(
        tmp_path: Path) -> None:
    a, b = _scenarios("rogue-port-80", "permission-403")
    (tmp_path / layout.cassette_name(a.id)).write_text("{}\n")
    plan = BenchPlan([a, b], [Arm(ORACLE)], RunOptions(), [], tmp_path, RecordMode.NONE)
    with pytest.raises(InvalidInput) as info:
        plan.check(resume=False)
    assert info.value.field == "--record-mode"
    assert f"missing: {b.id} (round 0)" in str(info.value) and f"{a.id} (round" not in str(info.value)
    nowhere = BenchPlan([a], [Arm(ORACLE)], RunOptions(), [], None, RecordMode.NONE)
    with pytest.raises(InvalidInput, match=f"missing: {a.id} \\(round 0\\)"):
        nowhere.check(resume=False)  # no --record-to: nothing is recorded


# --- the driver ----------------------------------------------------------------------------------

def _square(x: int) -> int:
    return x * x


def test_the_driver_runs_in_order_submits_follow_ups_first_and_skips_work_done_in_place() -> None:
    order: list[object] = []

    def start(key: int) -> Start:
        def go() -> Job | None:
            order.append(("start", key))
            return None if key == 2 else Job(key, _square, (key,), timeout=30)
        return go

    def on_done(done: Done) -> Job | None:
        order.append(("done", done.key, done.value))
        if done.key == 1:  # a ladder's next level: submitted before the work still waiting
            return Job("1+", _square, (10,), timeout=30)
        return None

    drive(InProcess(), [start(1), start(2), start(3)], on_done)
    assert order == [("start", 1), ("done", 1, 1), ("done", "1+", 100), ("start", 2),
                     ("start", 3), ("done", 3, 9)]


def test_the_driver_keeps_every_slot_of_a_pool_busy_and_raises_what_on_done_raises() -> None:
    seen: dict[object, int] = {}  # key: the pid that ran it

    def on_done(done: Done) -> Job | None:
        assert done.error is None, done.error
        seen[done.key] = done.value
        return None

    with ProcessPool(2) as pool:
        # os.getpid: a child imports the job's function by name, and this test module is not
        # importable from a child
        drive(pool, [functools.partial(Job, k, os.getpid, (), timeout=60) for k in range(4)],
              on_done)
    assert set(seen) == {0, 1, 2, 3}
    assert os.getpid() not in seen.values()  # each ran in a child, not here

    class Stop(Exception):
        pass

    def refuse(done: Done) -> Job | None:
        raise Stop(done.key)

    with pytest.raises(Stop), InProcess() as ex:
        drive(ex, [lambda: Job("x", _square, (2,), timeout=30)], refuse)


# --- a bench run from recordings: the plan, the driver and the listeners together ---------------

class _Heard(BenchListener):
    """Everything a bench tells a listener, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Step | None]] = []

    def episode_started(self, step: Step) -> None:
        self.events.append(("started", step))

    def episode_finished(self, step: Step, episode: Episode) -> None:
        assert (episode.scenario, episode.round, episode.hint_level) == step.key[1:]
        self.events.append(("finished", step))

    def bench_ended(self, episodes: list[Episode], *, interrupted: bool) -> None:
        self.events.append(("interrupted" if interrupted else "ended", None))


def test_a_replayed_ladder_tells_its_listeners_each_step_and_estimates_whole_rounds(
        tmp_path: Path) -> None:
    # The 0.5B's committed ladder: it fails every level of these three scenarios, so each round is
    # four episodes, all replayed (--record-mode none: no model server, no VM).
    ids = ["bad-execstart", "cron-stopped", "env-wrong-port"]
    scenarios = _scenarios(*ids)
    assert all(len(s.hints) == 3 for s in scenarios)
    model = AgentChoice(kind=AgentKind.MODEL, model="qwen2.5-coder-0.5b")
    heard = _Heard()
    episodes = run_bench(scenarios, model, RunOptions(protocol="json", ladder=True),
                         tmp_path / "run", record_to=LIVE_05B, record_mode=RecordMode.NONE,
                         listeners=[heard])
    assert [(e.scenario, e.hint_level) for e in episodes] == [
        (s, level) for s in ids for level in range(4)]
    kinds = [kind for kind, _ in heard.events]
    assert kinds == ["started", "finished"] * 12 + ["ended"]
    firsts = [step for kind, step in heard.events if kind == "started" and step and step.level == 0]
    # The estimate's count: before any round ended, a round counts one episode; after the first
    # ladder ended at four, each round not started counts four.
    assert [s.remaining for s in firsts] == [1 + 2, 1 + 4, 1]
    assert all(s.replayed and s.total == 3 for kind, s in heard.events if s is not None)
    assert (tmp_path / "run" / layout.RESULTS).is_file()
    assert not (tmp_path / "run" / layout.REPORT).exists()  # the report is a listener the CLI adds
