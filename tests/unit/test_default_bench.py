"""The default bench (issue #47 item 2, #49 items 6-7), no VM, no model: the committed facts
file is what the recordings give; the rule of docs/running.md picks the subset (one scenario
per area and measured tier, single-machine, the main image first, the cheapest) and it ends
within about an hour on 2 cores; the order that needs the fewest builds first; the "N
episodes, about T" line; the builds made as the episodes come; and the commands a user types
(`bench` runs the subset, `--all` the suite, `list` shows label, tier and the subset)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from conftest import Cli

from runner.app import suite_facts
from runner.app.agents import AgentChoice
from runner.app.builds import Builds, Need, in_order, needs_of
from runner.app.episodes import RunOptions
from runner.app.estimate import estimate
from runner.app.plan import Arm, Round
from runner.app.results import live_dirs
from runner.backends.llama import DEFAULT_MODEL
from runner.core import measured
from runner.core.errors import InvalidInput
from runner.core.measured import ORACLE, Measured
from runner.core.outcomes import AgentKind, Tier
from runner.core.paths import repo_root
from runner.core.selection import AREA_MIN, Selection, area, build_order, choose, default_subset
from runner.core.spec import Scenario, load_specs

ROOT = repo_root()
SUITE = load_specs([ROOT / "specs"])
FACTS = measured.load()
HOUR = 3600.0


def _default() -> list[Scenario]:
    return choose(SUITE, Selection(default=True, build_order=True), FACTS)


# --- the facts file -------------------------------------------------------------------------------

def test_the_committed_facts_are_what_the_recordings_give(monkeypatch: pytest.MonkeyPatch) -> None:
    # As the README's results block: a facts file that drifted from its recordings would pick
    # the default bench, and state tiers, from numbers nobody measured.
    monkeypatch.chdir(ROOT)  # the recordings are found where `make` runs, the checkout's root
    made = suite_facts.gather(live_dirs([]), suite_facts.ORACLE_DIR, [ROOT / "specs"])
    assert made == FACTS, "python -m runner.app.suite_facts --write makes specs/measured.json again"
    assert set(FACTS) == {s.id for s in SUITE}
    text = measured.render(made, suite_facts.ABOUT)
    assert (ROOT / "specs" / measured.FILE_NAME).read_text(encoding="utf-8") == text


def test_a_damaged_facts_file_is_bad_input_naming_its_field(tmp_path: Path) -> None:
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"format": 1, "scenarios": {"x": {"tier": "trivial"}}}))
    with pytest.raises(InvalidInput, match=r"scenarios\.x\.tier: not a tier .*'trivial'"):
        measured.load(bad)
    bad.write_text(json.dumps({"format": 1, "scenarios": {"x": {"seconds": {"oracle": -1}}}}))
    with pytest.raises(InvalidInput, match=r"scenarios\.x\.seconds\.oracle: must be seconds"):
        measured.load(bad)
    bad.write_text("{")
    with pytest.raises(InvalidInput, match="not JSON"):
        measured.load(bad)


# --- the rule -----------------------------------------------------------------------------------

def test_the_default_bench_has_each_area_at_each_measured_tier_once() -> None:
    chosen = default_subset(SUITE, FACTS)
    areas = {a for a in {area(s) for s in SUITE} if sum(area(s) == a for s in SUITE) >= AREA_MIN}
    candidates = [s for s in SUITE if not s.machines and area(s) in areas]
    measured_areas = {area(s) for s in candidates if FACTS[s.id].tier is not Tier.UNMEASURED}
    wanted = {(area(s), FACTS[s.id].tier) for s in candidates
              if FACTS[s.id].tier is not Tier.UNMEASURED or area(s) not in measured_areas}
    got = [(area(s), FACTS[s.id].tier) for s in chosen]
    assert sorted(got, key=str) == sorted(wanted, key=str)  # every pair, each once
    assert all(not s.machines for s in chosen)
    # Each pick is the cheapest of its pair by the oracle's time, the main image first.
    for s in chosen:
        rivals = [c for c in candidates if (area(c), FACTS[c.id].tier) == (area(s), FACTS[s.id].tier)]
        best = min(rivals, key=lambda c: (c.image != "debian-12-nginx",
                                          FACTS[c.id].seconds[ORACLE], c.id))
        assert best.id == s.id, (s.id, best.id)
    # The two measured-easy scenarios are both in it: a first run shows a pass.
    assert {s.id for s in SUITE if FACTS[s.id].tier is Tier.EASY} <= {s.id for s in chosen}


def test_the_default_bench_ends_within_about_an_hour_on_two_cores() -> None:
    chosen = _default()
    # as the line before a bench counts it: a scenario with no recorded time at the others' mean
    model = estimate(_rounds(AgentChoice(kind=AgentKind.MODEL, model=DEFAULT_MODEL), chosen), False,
                     FACTS).seconds
    assert 10 <= len(chosen) < len(SUITE) / 2
    assert model <= HOUR, f"{len(chosen)} scenarios take {model / 60:.0f} min of {DEFAULT_MODEL}"
    whole = estimate(_rounds(AgentChoice(kind=AgentKind.MODEL, model=DEFAULT_MODEL), SUITE),
                     False, FACTS).seconds
    assert whole > 3 * HOUR  # why the suite is one flag away, not the default


def test_the_rule_prefers_the_main_image_then_the_cheapest_and_skips_several_machines() -> None:
    base = next(s for s in SUITE if s.id == "ssh-stopped")
    pair = next(s for s in SUITE if s.machines)

    def spec(sid: str, image: str = "debian-12-nginx", machines: bool = False) -> Scenario:
        return dataclasses.replace(base, id=sid, tags=("web", "x"), image=image,
                                   machines=pair.machines if machines else ())

    suite = [spec("a-slow"), spec("b-fast"), spec("c-other-image", "debian-12-tls"),
             spec("d-two-machines", machines=True), spec("e-new"),
             dataclasses.replace(spec("f-alone"), tags=("lonely",))]
    facts = {"a-slow": Measured(Tier.HARD, {ORACLE: 50.0}),
             "b-fast": Measured(Tier.HARD, {ORACLE: 5.0}),
             "c-other-image": Measured(Tier.MEDIUM, {ORACLE: 1.0}),
             "d-two-machines": Measured(Tier.EASY, {ORACLE: 1.0}),
             "f-alone": Measured(Tier.EASY, {ORACLE: 1.0})}
    # web/hard: b-fast (cheaper than a-slow); web/medium: only c; web/easy: only on two
    # machines, so none; e-new is unmeasured in an area whose measured scenarios show its
    # tiers (left to --all); "lonely" is one scenario, no area.
    assert [s.id for s in default_subset(suite, facts)] == ["b-fast", "c-other-image"]
    # In an area nothing of which is measured yet, an unmeasured scenario is its tier: a new
    # kind of scenario still gets a place (the main image's first by id, none has a time).
    assert [s.id for s in default_subset(suite, {})] == ["a-slow"]
    two = dataclasses.replace(spec("g-tls-cheaper", "debian-12-tls"))
    facts["g-tls-cheaper"] = Measured(Tier.HARD, {ORACLE: 0.1})
    # The main image wins over a cheaper scenario on another image.
    assert "b-fast" in [s.id for s in default_subset([*suite, two], facts)]


def test_the_run_order_needs_the_fewest_builds_first() -> None:
    ordered = build_order(SUITE)
    groups = [needs_of(s) for s in ordered]
    assert groups[0] == [("debian-12-nginx", False)]  # the image most scenarios use
    seen: list[list[Need]] = []
    for g in groups:  # each group's scenarios together
        if not seen or seen[-1] != g:
            assert g not in seen, g
            seen.append(g)
    assert all(any(lan for _i, lan in g) for g in groups[groups.index(seen[-1]):])  # several last
    same = [s.id for s in ordered if needs_of(s) == [("debian-12-nginx", False)]]
    assert same == sorted(same)  # the given order within a group
    # `bench --all --limit 1` is a one-machine scenario on the main image, not a two-VM one.
    assert not choose(SUITE, Selection(build_order=True, limit=1), FACTS)[0].machines


# --- what a bench says before it starts ----------------------------------------------------------

def _rounds(choice: AgentChoice, scenarios: list[Scenario]) -> list[Round]:
    return [Round(Arm(choice), s, 0) for s in scenarios]


def test_the_line_before_a_bench_sums_the_recorded_times_of_its_agent() -> None:
    chosen = _default()
    model = AgentChoice(kind=AgentKind.MODEL, model=DEFAULT_MODEL)
    line = estimate(_rounds(model, chosen), False, FACTS).text()
    known = [FACTS[s.id].seconds[DEFAULT_MODEL] for s in chosen if DEFAULT_MODEL in FACTS[s.id].seconds]
    total = sum(known) + (len(chosen) - len(known)) * sum(known) / len(known)
    assert line.startswith(f"{len(chosen)} episodes, about {round(total / 60)} min on a 2-core "
                           "machine"), line
    assert f"the recorded times of {DEFAULT_MODEL}" in line
    oracle = estimate(_rounds(AgentChoice(kind=AgentKind.ORACLE), chosen), False, FACTS)
    assert oracle.seconds == sum(FACTS[s.id].seconds[ORACLE] for s in chosen)
    ladder = estimate(_rounds(model, chosen), True, FACTS, slots=2)
    timed = [s for s in chosen if DEFAULT_MODEL in FACTS[s.id].ladder_seconds]
    if len(timed) == len(chosen):
        assert ladder.seconds == sum(FACTS[s.id].ladder_seconds[DEFAULT_MODEL] for s in chosen)
    assert "hint ladders" in ladder.text() and "2 at once" in ladder.text()
    hosted = estimate(_rounds(AgentChoice(kind=AgentKind.MODEL, endpoint="http://h:1",
                                          model="big"), chosen), False, FACTS).text()
    assert f"{DEFAULT_MODEL}, standing in for big" in hosted
    # A scenario with no recorded time counts at the mean of the others, and says so.
    new = dataclasses.replace(chosen[0], id="brand-new")
    pair = [s for s in chosen if DEFAULT_MODEL in FACTS[s.id].seconds][:2]
    some = estimate(_rounds(model, [*pair, new]), False, FACTS)
    a, b = (FACTS[s.id].seconds[DEFAULT_MODEL] for s in pair)
    assert some.seconds == a + b + (a + b) / 2 and "1 without one" in some.text()
    assert "none has a recorded time" in estimate(_rounds(model, [new]), False, FACTS).text()
    assert "nothing to run live" in estimate([], False, FACTS).text()


def test_builds_are_made_as_the_episodes_need_them_each_once_in_order() -> None:
    made: list[list[Need]] = []
    chosen = _default()
    needs = in_order(chosen)
    assert needs[0] == ("debian-12-nginx", False) and len(needs) == len(set(needs))
    builds = Builds(needs, RunOptions(), lambda n, _o: made.append(n))
    for s in chosen:
        builds.ready(s)
    assert made == [[n] for n in needs]  # each once, when its first episode comes
    assert builds.left() == []


# --- the commands ---------------------------------------------------------------------------------

def test_bench_runs_the_default_subset_and_all_the_suite(cli: Cli, tmp_path: Path) -> None:
    # Replayed from the committed oracle recordings (--record-mode none): no VM, no model.
    rec = tmp_path / "rec"
    shutil.copytree(ROOT / "recordings" / "oracle", rec)
    common = ["bench", "--agent", "oracle", "--record-to", str(rec), "--record-mode", "none",
              "--runs-dir", str(tmp_path / "runs"), "--format", "json"]
    r = cli(*common)
    assert r.returncode == 0, r.stderr
    ran = [row["scenario"] for row in json.loads(r.stdout)["episodes"]]
    assert ran == [s.id for s in _default()]
    assert "nothing to run live" in r.stderr
    r = cli(*common, "--all", "--limit", "2")
    assert r.returncode == 0, r.stderr
    assert [row["scenario"] for row in json.loads(r.stdout)["episodes"]] == [
        s.id for s in build_order(SUITE)[:2]]


def test_list_shows_label_tier_and_the_default_bench(cli: Cli) -> None:
    r = cli("list", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    assert set(rows) == {s.id for s in SUITE}
    default = {s.id for s in _default()}
    for s in SUITE:
        assert rows[s.id]["difficulty"] == s.difficulty
        assert rows[s.id]["tier"] == FACTS[s.id].tier.value
        assert rows[s.id]["default"] is (s.id in default)  # typed JSON: a boolean
    # The label and the measurement disagree on many scenarios: both are shown.
    assert any(rows[i]["difficulty"] != rows[i]["tier"] for i in rows)
