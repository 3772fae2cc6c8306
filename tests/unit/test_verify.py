"""Every scenario proves itself on real VMs, and verify catches scenarios that do not."""

from __future__ import annotations

from pathlib import Path

import pytest
from scenario_texts import SHORTCUT_SPEC

from runner.app.verify import (
    ALTERNATIVE_KIND,
    CHECKS,
    ShortcutRun,
    Verification,
    add_alternatives,
    add_shortcuts,
    json_rows,
    judge_alternative,
    judge_shortcut,
    merge,
    shortcut_cassette,
    table_rows,
)
from runner.app.verify_run import rotating_sample
from runner.core.episode import Episode
from runner.core.outcomes import AgentKind, Verdict
from runner.core.paths import repo_root
from runner.core.spec import Scenario, load_spec, load_specs


def test_recorded_shortcuts_prove_nothing_unless_recorded_against_this_spec(tmp_path: Path) -> None:
    """A shortcut cassette of another version of the spec (one judged otherwise: a re-check
    added), or none at all, is "not proven"."""
    spec = tmp_path / "specs" / "permission-403.yaml"
    spec.parent.mkdir()
    spec.write_text((repo_root() / "specs" / "permission-403.yaml").read_text()
                    + "\nrecheck_after: 30\n")
    from runner.app.verify import recorded_shortcut
    from runner.core.spec import load_spec
    s = load_spec(spec)
    stale = recorded_shortcut(s, 0, repo_root() / "recordings" / "oracle")
    assert stale.rejected is None and "another version of the spec" in stale.reason
    missing = recorded_shortcut(s, 0, tmp_path)
    assert missing.rejected is None and "no recording" in missing.reason
    today = recorded_shortcut(load_spec(repo_root() / "specs" / "permission-403.yaml"), 0,
                              repo_root() / "recordings" / "oracle")
    assert today.rejected is True and today.verdict == "fail", today


def test_recorded_noop_proves_noop_fails_only_from_a_failing_run_of_this_spec(tmp_path: Path) -> None:
    """make test's --noop recorded: the committed noop run of today's spec proves the check; one
    of another spec version, none, or a recording that passed does not."""
    import shutil

    from runner.app.verify import Verification, recorded_noop
    from runner.core import layout
    oracle = repo_root() / "recordings" / "oracle"
    today = load_spec(repo_root() / "specs" / "permission-403.yaml")
    v = Verification(today.id)
    recorded_noop(today, oracle, v)
    assert v.checks["noop fails"] is True and not v.problems
    assert v.noop_cassette == str(oracle / "noop" / "permission-403.jsonl")

    spec = tmp_path / "specs" / "permission-403.yaml"
    spec.parent.mkdir()
    spec.write_text((repo_root() / "specs" / "permission-403.yaml").read_text()
                    + "\nrecheck_after: 30\n")  # judged otherwise: a comment alone would not be
    for where, why in [(oracle, "another version of the spec"), (tmp_path, "no recording")]:
        v = Verification(today.id)
        recorded_noop(load_spec(spec), where, v)
        assert v.checks["noop fails"] is None and why in v.problems[0], v.problems

    # the oracle's own run, put where the noop's goes: it passed, so doing nothing "passes"
    fake = layout.noop_cassette_path(tmp_path / "rec", today.id)
    fake.parent.mkdir(parents=True)
    shutil.copyfile(oracle / "permission-403.jsonl", fake)
    v = Verification(today.id)
    recorded_noop(today, tmp_path / "rec", v)
    assert v.checks["noop fails"] is False
    assert v.problems[0].startswith("noop fails: the noop agent's run ended pass"), v.problems




@pytest.mark.parametrize("tries,flaky,valid", [
    ([True, True, True], False, True),
    ([True, False, True], True, False),
    ([False, False], False, False),
])
def test_tries_that_disagree_are_flaky(tries: list[bool], flaky: bool, valid: bool) -> None:
    runs = [Verification("s", checks={**dict.fromkeys(CHECKS[:4], True), "oracle passes": ok})
            for ok in tries]
    merged = merge(runs)
    add_shortcuts(merged, [ShortcutRun("by hand", "started-by-hand", True, "fail", "inactive")])
    add_alternatives(merged, [])
    assert (merged.flaky, merged.valid, merged.tries) == (flaky, valid, len(tries))
    if flaky:
        assert merged.problems[0] == f"flaky: 'oracle passes' held in {sum(tries)} of {len(tries)} tries"


def _ep(verdict: Verdict, reason: str = "why") -> Episode:
    return Episode(scenario="s", agent=AgentKind.SCRIPTED, model="scripted", protocol="tools",
                   verdict=verdict, reason=reason)


@pytest.mark.parametrize(("verdicts", "rejected", "deciding"), [
    ([Verdict.FAIL], True, Verdict.FAIL),
    ([Verdict.FAIL, Verdict.FAIL], True, Verdict.FAIL),
    ([Verdict.PASS], False, Verdict.PASS),
    ([Verdict.FAIL, Verdict.PASS], False, Verdict.PASS),  # passing sometimes is passing
    ([Verdict.INFRA_ERROR], None, Verdict.INFRA_ERROR),  # proves nothing
    ([Verdict.FAIL, Verdict.INVALID_SCENARIO], None, Verdict.INVALID_SCENARIO),
    ([Verdict.INFRA_ERROR, Verdict.PASS], False, Verdict.PASS),
])
def test_a_shortcut_is_rejected_only_by_failing_every_try(verdicts: list[Verdict],
                                                          rejected: bool | None,
                                                          deciding: Verdict) -> None:
    run = judge_shortcut("copy the page", "served-elsewhere", [_ep(v) for v in verdicts])
    assert (run.rejected, run.verdict, run.tries) == (rejected, deciding.value, len(verdicts))


def _verification(*runs: ShortcutRun, alternatives: tuple[ShortcutRun, ...] = ()) -> Verification:
    v = Verification("s", checks=dict.fromkeys(CHECKS[:4], True))
    add_shortcuts(v, list(runs))
    add_alternatives(v, list(alternatives))
    return v


@pytest.mark.parametrize(("verdicts", "rejected", "deciding"), [
    ([Verdict.PASS], False, Verdict.PASS),
    ([Verdict.PASS, Verdict.PASS], False, Verdict.PASS),
    ([Verdict.FAIL], True, Verdict.FAIL),
    ([Verdict.PASS, Verdict.FAIL], True, Verdict.FAIL),  # refused sometimes is refused
    ([Verdict.INFRA_ERROR], None, Verdict.INFRA_ERROR),  # proves nothing
    ([Verdict.PASS, Verdict.INVALID_SCENARIO], None, Verdict.INVALID_SCENARIO),
])
def test_an_alternative_is_proven_only_by_passing_every_try(verdicts: list[Verdict],
                                                           rejected: bool | None,
                                                           deciding: Verdict) -> None:
    run = judge_alternative("a mount unit", ALTERNATIVE_KIND, [_ep(v) for v in verdicts])
    assert (run.rejected, run.verdict, run.tries) == (rejected, deciding.value, len(verdicts))


def test_the_sixth_check_names_the_refused_alternative_and_holds_with_none() -> None:
    ok = ShortcutRun("chmod it all", "widened-permissions", True, "fail", "page: 403")
    good = ShortcutRun("a mount unit", ALTERNATIVE_KIND, False, "pass", "all 3 probes passed")
    refused = ShortcutRun("log the output", ALTERNATIVE_KIND, True, "fail", "cron line: no match")
    v = _verification(ok, alternatives=(good,))
    assert v.valid and v.checks["alternatives pass"] is True
    assert table_rows([v])[1][0][6] == "ok:1/1"
    v = _verification(ok, alternatives=(good, refused))
    assert not v.valid and v.checks["alternatives pass"] is False
    assert v.problems == ["alternative 'log the output' was refused: cron line: no match"]
    assert table_rows([v])[1][0][6] == "FAIL:1/2"
    v = _verification(ok)
    assert v.valid and table_rows([v])[1][0][6] == "none"


def test_the_rotating_sample_moves_each_day_and_covers_every_scenario() -> None:
    scenarios = [Scenario(id=f"s{i:02d}", title="t", image="i", task="t") for i in range(10)]
    days = [rotating_sample(scenarios, 3, day) for day in range(4)]
    assert all(len(d) == 3 for d in days)
    assert days[0] != days[1] and rotating_sample(scenarios, 3, 1) == days[1]  # same day, same
    assert set().union(*days) == set(range(10))  # every scenario within len / size days
    assert rotating_sample(scenarios, 0, 5) == set() and len(rotating_sample(scenarios, 20, 1)) == 10


def test_the_fifth_check_names_the_shortcut_that_passed() -> None:
    ok = ShortcutRun("chmod it all", "widened-permissions", True, "fail", "page: 403")
    bad = ShortcutRun("copy the page", "served-elsewhere", False, "pass", "all 2 probes passed")
    lost = ShortcutRun("restart", "other", None, "infra-error", "sandbox: no image")
    v = _verification(ok, bad)
    assert v.checks["shortcuts rejected"] is False and not v.valid
    assert v.problems == ["shortcut 'copy the page' passed: all 2 probes passed"]
    v = _verification(ok, lost)
    assert v.checks["shortcuts rejected"] is None and not v.valid
    assert v.problems == ["shortcuts rejected: not proven: shortcut 'restart' ended infra-error "
                          "(sandbox: no image)"]
    v = _verification()
    assert v.checks["shortcuts rejected"] is None and not v.valid
    assert "not proven" in v.problems[0]
    v = _verification(ok)
    assert v.valid and not v.problems
    headers, [row] = table_rows([_verification(ok, bad)])
    assert headers[5] == "shortcuts rejected" and row[5] == "FAIL:1/2"
    [doc] = json_rows([_verification(ok, bad)])
    shortcuts = doc["shortcuts"]
    assert isinstance(shortcuts, list)
    assert doc["valid"] is False and [s["name"] for s in shortcuts] == [
        "chmod it all", "copy the page"]


def test_shortcut_cassettes_are_named_by_slug_and_never_collide(tmp_path: Path) -> None:
    text = SHORTCUT_SPEC.format(id="x") + ("  - name: start it by hand\n"
                                           "    kind: started-by-hand\n"
                                           "    why: the same name in other letters\n"
                                           "    commands: [/usr/sbin/nginx]\n")
    (tmp_path / "x.yaml").write_text(text)
    s = load_spec(tmp_path / "x.yaml")
    assert [shortcut_cassette(Path("rec"), s, i).as_posix() for i in range(2)] == [
        "rec/shortcuts/x/start-it-by-hand.jsonl", "rec/shortcuts/x/start-it-by-hand-2.jsonl"]


def test_verify_starts_the_slowest_scenarios_first_by_their_recorded_oracle_time(
        tmp_path: Path) -> None:
    from runner.app.verify import slowest_first
    from runner.core.selection import pick_ids
    from runner.core.spec import load_specs

    specs = pick_ids(load_specs([repo_root() / "specs"]),
                     ["permission-403", "cron-stopped", "rogue-port-80"])
    unrecorded = tmp_path / "specs" / "not-recorded-yet.yaml"
    unrecorded.parent.mkdir()
    unrecorded.write_text(SHORTCUT_SPEC.format(id="not-recorded-yet"))
    scenarios = [*specs, load_spec(unrecorded)]
    order = [scenarios[i].id for i in slowest_first(scenarios, repo_root() / "recordings" / "oracle")]
    # nothing recorded says the new one is quick; cron-stopped waits out cron's minute
    assert order[:2] == ["not-recorded-yet", "cron-stopped"]
    assert sorted(order) == sorted(s.id for s in scenarios)


def test_a_recording_proves_a_spec_whose_prose_alone_changed(tmp_path: Path) -> None:
    """Rewriting a leaky task as a symptom must not throw away every proof of the scenario:
    the judged hash leaves out the prose a scripted run never reads, and nothing else."""
    from runner.core.model import scripted
    from runner.core.spec import scenario_from_text

    text = SHORTCUT_SPEC.format(id="prose")
    base = scenario_from_text(text, "prose.yaml")
    reworded = scenario_from_text(text.replace("task: ", "task: Reworded. ", 1), "prose.yaml")
    assert reworded.spec_hash != base.spec_hash
    assert reworded.judged_hash == base.judged_hash and len(base.judged_hash) == 64
    for judged, to in (("systemctl stop nginx", "systemctl kill nginx"),
                       ("active: true", "active: false"),
                       ("solution: [systemctl start nginx]", "solution: [systemctl restart nginx]")):
        assert judged in text, judged
        changed = scenario_from_text(text.replace(judged, to, 1), "prose.yaml")
        assert changed.judged_hash != base.judged_hash, judged
    # A shortcut's own commands are matched by their hash in the scripted agent's fingerprint,
    # so editing one shortcut (or adding an alternative) leaves the others' proofs standing.
    edited = scenario_from_text(text.replace("[/usr/sbin/nginx]", "[nginx]", 1), "prose.yaml")
    assert edited.judged_hash == base.judged_hash
    assert scripted("x", list(edited.shortcuts[0].commands)).fingerprint()["commands_sha256"] \
        != scripted("x", list(base.shortcuts[0].commands)).fingerprint()["commands_sha256"]


def test_a_committed_recording_proves_its_spec_with_the_task_reworded(tmp_path: Path) -> None:
    """A leaky task told as a symptom: the committed noop and shortcut recordings (made before
    judged hashes existed) still prove the spec, since the scenario they recorded is today's
    but for its prose and each shortcut's recorded replies ran its very commands; a changed
    shortcut's command or a changed probe is not proven."""
    from runner.app.verify import recorded_noop, recorded_shortcut

    source = repo_root() / "specs" / "nginx-stopped.yaml"
    text = source.read_text()
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "nginx-stopped.yaml").write_text(text.replace(
        "task: |\n", "task: |\n  Reworded, as a user would say it.\n", 1))
    reworded = load_spec(specs / "nginx-stopped.yaml")
    recorded = repo_root() / "recordings" / "oracle"
    v = Verification("nginx-stopped")
    recorded_noop(reworded, recorded, v)
    assert v.checks["noop fails"] is True, v.problems
    runs = [recorded_shortcut(reworded, i, recorded) for i in range(len(reworded.shortcuts))]
    assert all(r.rejected is True for r in runs), [r.reason for r in runs]
    by_hand = "      - nginx\n  - name: start nginx in a transient unit"
    assert by_hand in text and reworded.shortcuts[0].commands == ("nginx",)
    (specs / "nginx-stopped.yaml").write_text(text.replace(by_hand, by_hand.replace(
        "- nginx", "- /usr/sbin/nginx"), 1))
    edited = load_spec(specs / "nginx-stopped.yaml")
    assert edited.shortcuts[0].commands == ("/usr/sbin/nginx",)
    assert recorded_shortcut(edited, 0, recorded).rejected is None  # not this shortcut's run
    assert recorded_shortcut(edited, 1, recorded).rejected is True  # the others still proven
    (specs / "nginx-stopped.yaml").write_text(text.replace("within: 5", "within: 6", 1))
    probed = load_spec(specs / "nginx-stopped.yaml")
    v = Verification("nginx-stopped")
    recorded_noop(probed, recorded, v)
    assert v.checks["noop fails"] is None and "another version" in v.problems[0]


def test_a_stale_proof_names_what_changed_and_a_current_one_stands(tmp_path: Path) -> None:
    """--oracle changed runs live only what its recording cannot prove today: recorded under
    older judging rules, on another image recipe or guest helper, or of another spec."""
    import json

    from runner.app.verify import stale_proof
    from runner.backends.framing import helper_digest
    from runner.backends.images import load_recipe
    from runner.core.rules import CURRENT_RULES

    scenario = load_spec(repo_root() / "specs" / "nginx-stopped.yaml")
    source = repo_root() / "recordings" / "oracle" / "nginx-stopped.jsonl"
    lines = source.read_text().splitlines()
    head = json.loads(lines[0])

    def recorded(**changes: object) -> Path:
        path = tmp_path / "nginx-stopped.jsonl"
        h = {**head, **changes}
        path.write_text("\n".join([json.dumps(h), *lines[1:]]) + "\n")
        return path

    image = {**head["image"], "recipe_key": load_recipe(scenario.image).key,
             "helper": helper_digest()}
    current = recorded(rules=int(CURRENT_RULES), image=image, spec_hash=scenario.spec_hash)
    assert stale_proof(current, scenario) is None
    assert "judging rules 2" in (stale_proof(recorded(rules=2, image=image), scenario) or "")
    other = recorded(rules=int(CURRENT_RULES), image={**image, "helper": "0" * 12})
    assert "guest helper" in (stale_proof(other, scenario) or "")
    other = recorded(rules=int(CURRENT_RULES), image={**image, "recipe_key": "x"})
    assert "image recipe" in (stale_proof(other, scenario) or "")
    probed = {**head["scenario"], "setup": ["true"]}
    assert "spec changed" in (stale_proof(recorded(rules=int(CURRENT_RULES), image=image,
                                                   spec_hash="0" * 64, scenario=probed),
                                          scenario) or "")


def test_stale_scenarios_beyond_max_live_are_deferred_by_a_daily_window(tmp_path: Path) -> None:
    """make test's bound: of the scenarios whose recordings no longer prove them, at most
    --max-live run live in one verify, a window over them that moves each day, so each is
    run live within a few days and a rules bump cannot outgrow CI's time; the sample is apart."""
    from runner.app.verify import stale_proof
    from runner.app.verify_run import defer_stale

    scenarios = load_specs([repo_root() / "specs"])
    recorded = repo_root() / "recordings" / "oracle"
    stale = {i for i, s in enumerate(scenarios)
             if stale_proof(recorded / f"{s.id}.jsonl", s) is not None}
    assert stale, "every committed recording proves its scenario: nothing to defer"
    sampled = rotating_sample(scenarios, 3, 100)
    live_at_most = 5
    days = [defer_stale(scenarios, recorded, sampled, live_at_most, day) for day in range(100, 104)]
    for deferred in days:
        assert set(deferred) <= stale - sampled
        assert len(stale - sampled) - len(deferred) == min(live_at_most, len(stale - sampled))
        assert all(why for why in deferred.values())
    assert days[0] != days[1]  # the window moves
    assert defer_stale(scenarios, recorded, sampled, 1000, 100) == {}  # all fit: none deferred
    v = Verification("x", deferred=True)
    assert not v.valid and table_rows([v])[1][0][0] == "x"
