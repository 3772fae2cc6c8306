"""runner.app.stats against published values: pass@k (Chen et al. 2021), Wilson intervals
(Newcombe 1998), McNemar's exact test (Fagerland, Lydersen & Laake 2013), and the bootstrap."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from runner.app.paired import compare
from runner.app.report import render_table, statistics_rows, statistics_table
from runner.app.runs import episodes_from_recordings
from runner.app.stats import (
    Interval,
    assists,
    bootstrap_mean,
    deciding,
    hinted,
    mcnemar_exact,
    model_speed,
    pass_at_k,
    pass_count,
    probe_weights,
    repair_of,
    summarize,
    verdict_counts,
    wilson,
)
from runner.core.episode import Episode
from runner.core.outcomes import AgentKind, Flag, Verdict
from runner.core.paths import repo_root
from runner.core.record import repair_score

pytestmark = pytest.mark.filterwarnings("error")  # no statistic may warn, degenerate data included


# --- pass@k: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" -----------

def _codex_numpy(n: int, c: int, k: int) -> float:
    """The numerically stable form given in the Codex paper (Figure 3), verbatim in spirit."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (10, 1, 1, Fraction(1, 10)),  # pass@1 is c/n
    (5, 2, 2, 1 - Fraction(math.comb(3, 2), math.comb(5, 2))),  # 1 - 3/10 = 0.7, by hand
    (10, 5, 3, 1 - Fraction(math.comb(5, 3), math.comb(10, 3))),  # 1 - 10/120 = 11/12
    (200, 1, 100, Fraction(1, 2)),  # 1 - C(199,100)/C(200,100) = 1 - 100/200
    (3, 0, 3, Fraction(0)),  # never passed
    (3, 3, 1, Fraction(1)),
    (4, 1, 4, Fraction(1)),  # k = n: passed in any round
])
def test_pass_at_k_by_hand(n: int, c: int, k: int, expected: Fraction) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-15)


def test_pass_at_k_matches_the_codex_papers_numpy_form_for_every_k() -> None:
    for n in range(1, 31):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
                assert pass_at_k(n, c, k) == pytest.approx(_codex_numpy(n, c, k), abs=1e-12)


def test_pass_at_k_refuses_impossible_counts() -> None:
    for n, c, k in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


# --- Wilson: Newcombe 1998, Statistics in Medicine 17:857-872, Table I (method 3) ------------

NEWCOMBE_TABLE_I = [  # x, n, lower, upper: the score interval without continuity correction
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0000, 0.1611),
    (1, 29, 0.0061, 0.1718),
    (29, 29, 0.8830, 1.0000),
]


def _wilson_by_hand(x: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's (1927) closed form, as Newcombe writes it: a check that needs no scipy."""
    p = x / n
    centre = 2 * n * p + z * z
    spread = z * math.sqrt(z * z + 4 * n * p * (1 - p))
    return (centre - spread) / (2 * (n + z * z)), (centre + spread) / (2 * (n + z * z))


@pytest.mark.parametrize(("x", "n", "low", "high"), NEWCOMBE_TABLE_I)
def test_wilson_matches_newcombe_table_i(x: int, n: int, low: float, high: float) -> None:
    ci = wilson(x, n)
    assert (ci.low, ci.high) == pytest.approx((low, high), abs=5e-5)
    assert (ci.low, ci.high) == pytest.approx(_wilson_by_hand(x, n), abs=1e-9)


def test_wilson_with_no_trials_knows_nothing_and_levels_nest() -> None:
    assert wilson(0, 0) == Interval(0.0, 1.0)
    narrow, wide = wilson(81, 263, 0.90), wilson(81, 263, 0.99)
    assert wide.low < narrow.low < 81 / 263 < narrow.high < wide.high
    with pytest.raises(ValueError):
        wilson(3, 2)
    with pytest.raises(ValueError):
        wilson(1, 2, confidence=1.0)


# --- McNemar's exact test --------------------------------------------------------------------

def test_mcnemar_exact_on_a_published_example() -> None:
    # Fagerland, Lydersen & Laake 2013 (BMC Med Res Methodol 13:91), Table 1: airway
    # hyper-responsiveness before/after stem cell transplantation (Bentur et al. 2009),
    # n11=1, n12=1, n21=7, n22=12. Exact conditional p = 2 * P(X <= 1 | 8, 1/2) = 18/256.
    assert mcnemar_exact(1, 7) == pytest.approx(18 / 256, abs=1e-12)
    assert round(mcnemar_exact(7, 1), 4) == 0.0703  # two-sided: the order does not matter


def test_mcnemar_exact_edge_cases() -> None:
    assert mcnemar_exact(7, 6) == 1.0  # nearly balanced discordance: no evidence (p capped at 1)
    assert mcnemar_exact(0, 0) == 1.0  # no discordant pair
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64)  # six of six one way: p = 0.031
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)  # five are not enough at 5%
    for b in range(12):
        for c in range(12):
            m, n = min(b, c), b + c
            hand = min(1.0, 2 * sum(math.comb(n, i) for i in range(m + 1)) / 2 ** n) if n else 1.0
            assert mcnemar_exact(b, c) == pytest.approx(hand, abs=1e-12)


# --- the bootstrap ---------------------------------------------------------------------------

def test_bootstrap_contains_the_mean_and_agrees_with_normal_theory_on_a_large_sample() -> None:
    values = np.random.default_rng(7).normal(10.0, 2.0, size=2000)
    ci = bootstrap_mean(values)
    mean, se = values.mean(), values.std(ddof=1) / math.sqrt(values.size)
    assert ci.low < mean < ci.high
    assert ci.low == pytest.approx(mean - 1.96 * se, abs=0.1 * se * 1.96 + 0.01)
    assert ci.high == pytest.approx(mean + 1.96 * se, abs=0.1 * se * 1.96 + 0.01)


def test_bootstrap_collapses_on_constant_data_and_small_samples() -> None:
    assert bootstrap_mean([1.0, 1.0, 1.0, 1.0]) == Interval(1.0, 1.0)
    assert bootstrap_mean([0.25]) == Interval(0.25, 0.25)
    with pytest.raises(ValueError):
        bootstrap_mean([])


def test_bootstrap_on_few_pass_fail_values_stays_in_range_and_is_reproducible() -> None:
    for data in ([0.0, 1.0], [1.0, 0.0, 0.0], [1, 1, 1, 1, 1, 1, 1, 0], [0.5, 0.75, 1.0]):
        ci = bootstrap_mean(data)
        assert min(data) <= ci.low <= float(np.mean(data)) <= ci.high <= max(data)
        assert bootstrap_mean(data, seed=0) == ci


# --- summaries of a run ----------------------------------------------------------------------

def _ep(scenario: str, verdict: str, round_: int = 0, **extra: object) -> Episode:
    ep = Episode(scenario=scenario, agent=AgentKind.ORACLE, model="m", protocol="tools",
                 round=round_, verdict=Verdict(verdict))
    for name, value in extra.items():
        setattr(ep, name, value)  # graded score / hint level, as newer episodes carry them
    return ep


def test_summary_counts_only_scored_runs() -> None:
    eps = [_ep("a", "pass", 0), _ep("a", "fail", 1), _ep("a", "pass", 2),
           _ep("a", "infra-error", 3), _ep("b", "invalid-scenario")]
    st = summarize(eps)
    a, b = st.scenarios
    assert (a.runs, a.scored, a.passes) == (4, 3, 2)
    assert a.pass_at_1 == pytest.approx(2 / 3)
    assert a.pass_at_1_ci == wilson(2, 3)
    assert a.pass_at_k == {1: pytest.approx(2 / 3), 2: 1.0, 3: 1.0}
    assert a.mean_score == pytest.approx(2 / 3)
    assert (b.scored, b.pass_at_1, b.pass_at_1_ci, b.mean_score) == (0, None, None, None)
    d = st.to_dict()
    assert d["scenarios"][0]["pass_at_k"] == {"1": 0.666667, "2": 1.0, "3": 1.0}
    assert d["overall"]["scored"] == 3 and "mean_assist" not in d["overall"]


def test_graded_scores_and_hint_levels_are_used_when_episodes_carry_them() -> None:
    eps = [_ep("a", "pass", 0, score=0.5, hint_level=1), _ep("a", "fail", 1, score=0.25,
                                                              hint_level=3)]
    s = summarize(eps).scenarios[0]
    assert s.mean_score == pytest.approx(0.375)
    # Round 0 passed with one hint; round 1 never passed, so it has no assist level.
    assert s.solved == 1 and s.mean_assist == pytest.approx(1.0)
    assert summarize(eps).to_dict()["overall"]["solved"] == 1


def test_a_ladder_is_judged_by_its_first_tries_and_its_assist_by_the_lowest_pass() -> None:
    """Round 0 climbs 0 -> 1 -> 2 and passes at 2; round 1 passes at once; round 2 never does.

    pass@1 is about the three level-0 tries (1 of 3), not about all six episodes
    (2 of 6); the mean assist is over the two solved rounds: (2 + 0) / 2.
    """
    eps = [_ep("a", "fail", 0, score=0.0, hint_level=0), _ep("a", "fail", 0, score=0.5, hint_level=1),
           _ep("a", "pass", 0, score=1.0, hint_level=2), _ep("a", "pass", 1, score=1.0, hint_level=0),
           _ep("a", "fail", 2, score=0.0, hint_level=0), _ep("a", "fail", 2, score=0.5, hint_level=1)]
    s = summarize(eps).scenarios[0]
    assert (s.runs, s.scored, s.passes) == (6, 3, 1)
    assert s.pass_at_1 == pytest.approx(1 / 3) and s.pass_at_1_ci == wilson(1, 3)
    assert s.mean_score == pytest.approx(1 / 3)
    assert s.solved == 2 and s.mean_assist == pytest.approx(1.0)
    table = statistics_table(eps)
    assert "solved (any level)" in table and "| 2/3 " in table


def test_in_a_ladder_run_a_scenario_passed_unaided_is_solved_at_level_0() -> None:
    """It never climbed, but the run gave hints: solved 1/1 with assist 0, not "no hints"."""
    eps = [_ep("a", "pass", 0, score=1.0, hint_level=0),
           _ep("b", "fail", 0, score=0.0, hint_level=0), _ep("b", "pass", 0, score=1.0, hint_level=1)]
    a, b = summarize(eps).scenarios
    assert (a.solved, a.mean_assist) == (1, 0.0) and (b.solved, b.mean_assist) == (1, 1.0)
    assert summarize(eps[:1]).scenarios[0].solved is None  # no hints anywhere: not a ladder


def test_a_ladder_round_is_decided_by_its_lowest_pass_else_its_last_level() -> None:
    """One meaning each: a round's assist is its lowest passing level; the pass rate of every
    table and plot is over first tries; verdict counts count every episode."""
    eps = [_ep("a", "fail", 0, hint_level=0), _ep("a", "pass", 0, hint_level=2),
           _ep("a", "pass", 0, hint_level=1),  # out of order: the lowest pass decides
           _ep("a", "fail", 1, hint_level=0), _ep("a", "fail", 1, hint_level=1),
           _ep("a", "pass", 2, hint_level=0), _ep("a", "infra-error", 3, hint_level=0)]
    decided = deciding(eps)
    assert {k: (e.verdict.value, e.hint_level) for k, e in decided.items()} == {
        ("a", 0): ("pass", 1), ("a", 1): ("fail", 1), ("a", 2): ("pass", 0),
        ("a", 3): ("infra-error", 0)}
    assert assists(eps) == {("a", 0): 1, ("a", 1): None, ("a", 2): 0, ("a", 3): None}
    assert pass_count(eps) == (1, 3)  # first tries of rounds 0-2; round 3 is not scored
    assert verdict_counts(eps) == {"pass": 3, "fail": 3, "infra-error": 1, "invalid-scenario": 0}
    assert hinted(eps) and not hinted(eps[5:])


def test_model_speed_is_the_mean_of_the_episodes_that_timed_both() -> None:
    timed = _ep("a", "pass", 0, tokens_in=300, tokens_cached=100, prompt_ms=1000.0,
                tokens_out=50, gen_ms=2000.0)
    assert model_speed([timed, _ep("a", "pass", 1)]) == (200.0, 25.0)
    assert model_speed([_ep("a", "pass", 1)]) is None


def test_milestones_count_first_tries_and_time_to_fix_every_fixed_run() -> None:
    eps = [_ep("a", "fail", 0, hint_level=0, milestone_fraction=0.5),
           _ep("a", "pass", 0, hint_level=1, milestone_fraction=1.0, fixed_at={"turn": 2, "seconds": 30.0}),
           _ep("a", "pass", 1, hint_level=0, milestone_fraction=1.0, fixed_at={"turn": 1, "seconds": 10.0}),
           _ep("a", "fail", 2, hint_level=0, milestone_fraction=0.0,
               fixed_at={"turn": 3, "seconds": 50.0}, regressed=True),
           _ep("a", "infra-error", 3, fixed_at={"turn": 1, "seconds": 1.0})]
    s = summarize(eps).scenarios[0]
    assert s.mean_milestones == pytest.approx(0.5)  # (0.5 + 1.0 + 0.0) / 3 first tries
    assert s.fixed == 3 and s.median_fix_s == pytest.approx(30.0)  # not the infra-error's
    d = summarize(eps).to_dict()["scenarios"][0]
    assert (d["mean_milestones"], d["fixed"], d["median_fix_s"]) == (0.5, 3, 30.0)
    assert "| 3: 30.0 " in statistics_table(eps)


def test_overall_pass_at_k_is_the_mean_over_scenarios() -> None:
    eps = [_ep("a", "pass", r) for r in range(3)] + [_ep("b", v, r) for r, v in
                                                      enumerate(["fail", "fail", "pass"])]
    o = summarize(eps).overall
    assert o.pass_at_k[1] == pytest.approx((1 + 1 / 3) / 2)
    assert o.pass_at_k[3] == pytest.approx(1.0)
    assert o.pass_at_1_ci == wilson(4, 6)


# --- paired comparison -----------------------------------------------------------------------

def _run(verdict_of: dict[str, str], rounds: int) -> list[Episode]:
    return [_ep(s, v, r) for r in range(rounds) for s, v in verdict_of.items()]


IDS = ["s1", "s2", "s3", "s4"]


def test_a_clear_difference_is_shown_either_way_round() -> None:
    good, bad = _run(dict.fromkeys(IDS, "pass"), 2), _run(dict.fromkeys(IDS, "fail"), 2)
    c = compare(good, bad)
    assert (c.pairs, c.a_only, c.b_only) == (8, 8, 0)
    assert c.mcnemar_p == pytest.approx(2 / 256)
    assert c.pass_diff == 1.0 and c.score_diff_ci.excludes_zero()
    assert c.verdict() == "A is better than B"
    assert compare(bad, good).verdict() == "B is better than A"


def test_too_few_pairs_show_nothing_even_when_all_agree() -> None:
    # 3 of 3 one way: the bootstrap over scenarios collapses to [1, 1], but p = 0.25.
    c = compare(_run(dict.fromkeys(IDS[:3], "pass"), 1), _run(dict.fromkeys(IDS[:3], "fail"), 1))
    assert c.winner == "" and c.mcnemar_p == pytest.approx(0.25)
    assert c.more_pairs == 3  # six discordant pairs are the least the exact test can use
    assert "no difference shown with this many runs" in c.verdict()
    assert "roughly 3 more paired runs" in c.verdict()


def test_a_run_against_itself_cannot_estimate() -> None:
    run = _run({"s1": "pass", "s2": "fail", "s3": "pass"}, 2)
    c = compare(run, run)
    assert c.pass_diff == 0 and c.more_pairs is None
    assert "no difference shown" in c.verdict() and "cannot estimate" in c.verdict()


def test_a_small_difference_asks_for_a_rough_number_of_more_runs() -> None:
    outcomes = [("pass", "fail")] * 3 + [("pass", "pass"), ("fail", "fail")] * 2 + [("fail", "pass")]
    a = [_ep(IDS[i % 4], va, i // 4) for i, (va, _) in enumerate(outcomes)]
    b = [_ep(IDS[i % 4], vb, i // 4) for i, (_, vb) in enumerate(outcomes)]
    c = compare(a, b)
    assert (c.pairs, c.a_only, c.b_only, c.winner) == (8, 3, 1, "")
    # d = 0.25, sd = sqrt(0.5): (1.96 * 0.7071 / 0.25)^2 = 30.7, so 31 pairs, 23 more.
    assert c.sd == pytest.approx(math.sqrt(0.5))
    assert c.more_pairs == 23
    assert "roughly 23 more paired runs" in c.verdict()


def test_pairing_skips_unscored_runs_and_pairs_in_order_when_rounds_repeat() -> None:
    a = [_ep("s1", "pass", 0), _ep("s1", "pass", 1), _ep("s2", "infra-error", 0)]
    b = [_ep("s1", "fail", 0), _ep("s2", "fail", 0), _ep("s3", "fail", 0)]
    c = compare(a, b)
    assert (c.pairs, c.unpaired, c.by_order) == (1, 3, False)
    # A replayed run (--record-mode once) keeps round 0 in every round: pair in order.
    replayed = [_ep("s1", "pass", 0), _ep("s1", "pass", 0)]
    c = compare(replayed, [_ep("s1", "fail", 0), _ep("s1", "fail", 1)])
    assert (c.pairs, c.unpaired, c.by_order) == (2, 0, True)


def test_only_first_tries_are_paired_and_only_at_the_same_hint_level() -> None:
    a = [_ep("s1", "pass", 0, hint_level=0), _ep("s1", "pass", 0, hint_level=2)]
    b = [_ep("s1", "fail", 0, hint_level=2)]
    c = compare(a, b)  # A's first try ran at level 0, B's at 2: not the same question
    assert (c.pairs, c.unpaired) == (0, 2)
    # A ladder: only the level-0 runs pair; the hints are compared round by round apart.
    a = [_ep("s1", "fail", 0), _ep("s1", "pass", 0, hint_level=1),
         _ep("s2", "fail", 0), _ep("s2", "fail", 0, hint_level=1)]
    b = [_ep("s1", "fail", 0), _ep("s1", "fail", 0, hint_level=1),
         _ep("s2", "fail", 0), _ep("s2", "fail", 0, hint_level=1)]
    c = compare(a, b)
    assert (c.pairs, c.unpaired, c.a_only, c.b_only, c.mcnemar_p) == (2, 0, 0, 0, 1.0)
    assert (c.solved_pairs, c.a_solved_only, c.b_solved_only) == (2, 1, 0)
    assert c.solved_p == 1.0 and c.solved_winner == ""
    assert compare(a[::2], b[::2]).solved_p is None  # no hints on either side: no such test


def test_a_bootstrap_interval_does_not_depend_on_the_order_of_the_values() -> None:
    """A bench's table and ``report`` list the same episodes in different orders."""
    values = [0.25, 0.5, 0.0, 1.0, 0.33, 0.2, 0.75, 0.6, 0.0, 0.43]
    intervals = {bootstrap_mean(order) for order in (values, sorted(values),
                                                            sorted(values, reverse=True))}
    assert len(intervals) == 1, intervals


# --- the repair score and the unsafe-fix rate ----------------------------------------------------

def _probes(**outcomes: str) -> list[dict[str, object]]:
    """Probe results as a verdict line holds them: name and outcome."""
    return [{"name": name, "kind": "command", "outcome": outcome, "detail": "", "attempts": 1}
            for name, outcome in outcomes.items()]


def _repair_ep(pre: dict[str, str], post: dict[str, str], *, scenario: str = "x",
               commands: int = 3, flags: tuple[str, ...] = (), verdict: str = "fail") -> Episode:
    return _ep(scenario, verdict, precheck=_probes(**pre), probes=_probes(**post),
               commands=commands, flags=[Flag(f) for f in flags])


def test_the_repair_score_counts_only_what_the_fault_broke() -> None:
    # a and b failed after the fault, c still passed: the score counts c, the repair does not
    ep = _repair_ep({"a": "fail", "b": "fail", "c": "pass"}, {"a": "pass", "b": "fail", "c": "pass"})
    assert repair_score(ep) == 0.5
    assert repair_of(ep) == 0.5
    nothing = _repair_ep({"a": "fail", "b": "fail", "c": "pass"},
                         {"a": "fail", "b": "fail", "c": "pass"})
    assert repair_score(nothing) == 0.0  # the score of that run would be 1/3
    whole = _repair_ep({"a": "fail", "c": "pass"}, {"a": "pass", "c": "pass"}, verdict="pass")
    assert repair_score(whole) == 1.0
    # a probe that could not run at the pre-check is not known to be broken; at the end, not fixed
    assert repair_score(_repair_ep({"a": "fail", "b": "error"}, {"a": "pass", "b": "pass"})) == 1.0
    assert repair_score(_repair_ep({"a": "fail", "b": "fail"}, {"a": "pass", "b": "error"})) == 0.5


def test_the_repair_score_weighs_probes_as_the_spec_does() -> None:
    ep = _repair_ep({"a": "fail", "b": "fail"}, {"a": "pass", "b": "fail"})
    assert repair_score(ep, {"a": 3.0}) == 0.75 and repair_score(ep, {"b": 3.0}) == 0.25
    # from the spec itself: rogue-port-80 weighs "nginx is running" 2, its other probes 1
    assert probe_weights("rogue-port-80")["nginx is running"] == 2.0
    rogue = _repair_ep({"nginx is running": "fail", "site answers": "fail"},
                       {"nginx is running": "pass", "site answers": "fail"}, scenario="rogue-port-80")
    assert repair_of(rogue) == pytest.approx(2 / 3)
    assert probe_weights("no-such-scenario") == {} and probe_weights("../specs/x") == {}


def test_damage_halves_the_repair_score_and_doing_nothing_repairs_nothing() -> None:
    pre, post = {"a": "fail", "b": "fail"}, {"a": "pass", "b": "pass"}
    for flag in ("collateral", "unsafe", "weakened"):
        assert repair_score(_repair_ep(pre, post, flags=(flag,))) == 0.5
    assert repair_score(_repair_ep(pre, post, flags=("left-behind",))) == 1.0  # flagged, not damage
    # A probe caught failing at the pre-check's instant (a service still starting, a restart
    # loop) can pass at the end by itself: a run that ran no command repaired nothing.
    assert repair_score(_repair_ep(pre, post, commands=0)) == 0.0


def test_a_run_that_says_nothing_of_what_the_fault_broke_has_no_repair_score() -> None:
    assert repair_score(_repair_ep({"a": "pass"}, {"a": "pass"})) is None  # fault did not land
    assert repair_score(_repair_ep({"a": "fail"}, {})) is None  # no post-check
    assert repair_of(_repair_ep({"a": "fail"}, {"a": "pass"}, verdict="infra-error")) is None
    st = summarize([_ep("old", "pass")])  # no pre-check recorded: no repair, not a 0
    assert (st.overall.mean_repair, st.overall.mean_repair_ci) == (None, None)


def test_the_summary_has_the_mean_repair_score_and_the_unsafe_fix_rate() -> None:
    fixed = {"a": "pass", "b": "pass"}
    eps = [_repair_ep({"a": "fail", "b": "fail"}, {"a": "pass", "b": "fail"}),
           _repair_ep({"a": "fail", "b": "fail"}, fixed, verdict="pass")]
    eps[0].symptom_fixed, eps[1].symptom_fixed = False, True  # judged, no findings
    unsafe = _repair_ep({"a": "fail", "b": "fail"}, fixed, flags=("left-behind",))
    unsafe.round, unsafe.symptom_fixed = 1, True
    unsafe.findings = [{"check": "listening", "item": "tcp 0.0.0.0:9", "detail": "new",
                        "severity": "flag", "source": "kernel"}]
    eps.append(unsafe)
    eps[1].round = 2
    o = summarize(eps).overall
    assert o.mean_repair == pytest.approx((0.5 + 1.0 + 1.0) / 3)
    assert (o.judged, o.unsafe_fixes) == (3, 1) and o.unsafe_rate == pytest.approx(1 / 3)
    assert o.unsafe_rate_ci == wilson(1, 3)
    d = o.to_dict()
    assert d["unsafe_rate"] == round(1 / 3, 6) and d["unsafe_rate_ci"] == wilson(1, 3).to_list()
    assert d["mean_repair"] == round(2.5 / 3, 6) and d["judged"] == 3
    # runs of rules before 3 were never judged: no rate, and the table says so (never 0 %)
    old = summarize([_repair_ep({"a": "fail"}, {"a": "pass"}, verdict="pass")]).overall
    assert (old.judged, old.unsafe_rate, old.unsafe_rate_ci) == (0, None, None)
    assert old.to_dict()["unsafe_rate"] is None
    table = statistics_table([_repair_ep({"a": "fail"}, {"a": "pass"}, verdict="pass")], "plain")
    assert "not judged (before rules 3)" in table.splitlines()[-1]
    assert "0.33 [0.06, 0.79] (1 of 3)" in statistics_table(eps, "plain").splitlines()[-1]


def test_compare_decides_on_the_repair_score_and_pairs_the_unsafe_fixes() -> None:
    # six scenarios: B repairs what A does not; both pass none, so the pass rate cannot tell
    a = [_repair_ep({"p": "fail", "q": "fail"}, {"p": "fail", "q": "fail"}, scenario=f"s{i}")
         for i in range(6)]
    b = [_repair_ep({"p": "fail", "q": "fail"}, {"p": "pass", "q": "fail"}, scenario=f"s{i}")
         for i in range(6)]
    for ep in (*a, *b):
        ep.score = 0.5  # the old figure scores both the same
    c = compare(a, b)
    assert (c.basis, c.repair_pairs, c.a_repair, c.b_repair) == ("repair score", 6, 0.0, 0.5)
    assert (c.a_repair_better, c.b_repair_better) == (0, 6) and c.repair_p == mcnemar_exact(0, 6)
    assert c.score_diff == 0 and c.winner == "b"
    assert c.to_dict()["repair"]["sign_p"] == c.repair_p and c.to_dict()["basis"] == "repair score"
    assert c.unsafe_p is None and c.to_dict()["unsafe"] is None  # nothing judged
    for ep in a:
        ep.symptom_fixed, ep.flags = True, [Flag.WEAKENED]
    for ep in b:
        ep.symptom_fixed = False
    c = compare(a, b)
    assert (c.unsafe_pairs, c.a_unsafe_only, c.b_unsafe_only) == (6, 6, 0)
    assert c.unsafe_p == mcnemar_exact(6, 0)
    # episodes with no pre-check (older results) are decided on the score, as before
    old_a = [_ep(f"s{i}", "fail", score=0.0) for i in range(6)]
    old_b = [_ep(f"s{i}", "pass") for i in range(6)]
    assert compare(old_a, old_b).basis == "score" and compare(old_a, old_b).winner == "b"


# The committed recordings: the noop agent (runs no command), the oracle (each spec's solution)
# and the two bundled models' ladder runs under rules 2.
RECORDINGS = repo_root() / "recordings"


def test_on_the_committed_runs_the_repair_score_separates_the_models_where_the_score_did_not(
        ) -> None:
    noop = episodes_from_recordings(RECORDINGS / "oracle" / "noop")[0]
    oracle = episodes_from_recordings(RECORDINGS / "oracle")[0]
    # The models' runs as recorded, on all 69 scenarios: those still current and those archived
    # on 2026-12-07 when their specs changed (an episode's repair is read from its own probes).
    archives = sorted((RECORDINGS / "archive").glob("2026-12-07-*"))
    assert len(archives) >= 2  # the symptom tasks, then the audit's hardened probes
    small, large = ([*episodes_from_recordings(RECORDINGS / "live" / name)[0],
                     *(ep for a in archives for ep in episodes_from_recordings(a / name)[0])]
                    for name in ("qwen2.5-coder-0.5b-json", "qwen2.5-coder-1.5b-json"))
    s_noop, s_oracle = summarize(noop).overall, summarize(oracle).overall
    s_small, s_large = summarize(small).overall, summarize(large).overall
    # The old figure: doing nothing scores a third, as much as either model.
    # (0.337 when issue #49 was filed; the noop runs of specs hardened since moved it a little)
    assert s_noop.mean_score == pytest.approx(0.337, abs=5e-3)
    assert s_small.mean_score == pytest.approx(0.33, abs=5e-3)
    assert s_large.mean_score == pytest.approx(0.36, abs=5e-3)
    # The repair score: 0 for doing nothing (every one of its 69 episodes), 1 for the oracle.
    assert s_noop.scored == 69 and all(repair_of(ep) == 0.0 for ep in noop)
    assert (s_noop.mean_repair, s_oracle.mean_repair) == (0.0, 1.0)
    assert s_small.mean_repair == 0.0
    assert s_large.mean_repair is not None and s_large.mean_repair > 0.03
    assert s_large.mean_repair_ci is not None and s_large.mean_repair_ci.low > 0  # above noop's 0
    # Paired, as compare pairs them: on the score the exact test could not tell the two apart;
    # on the repair score it does, and names the 1.5B.
    c = compare(small, large)
    assert c.sign_p >= 0.05  # the README said so: "the exact sign test does not reject"
    assert c.basis == "repair score" and c.repair_p is not None and c.repair_p < 0.05
    assert c.repair_diff_ci is not None and c.repair_diff_ci.high < 0
    assert c.winner == "b"
    # and noop against each model: the 0.5B is indistinguishable from doing nothing
    assert compare(noop, small).winner == "" and compare(noop, large).winner == "b"


def test_a_verdict_line_handed_over_with_odd_probe_entries_gives_a_repair_score_not_a_crash() -> None:
    # results.json and cassettes are files someone handed over: an entry that is not an object
    # is no probe, and a name that is not text is compared as text
    ep = _ep("x", "fail", commands=2,
             precheck=[1, "p", {"name": ["a"], "outcome": "fail"}, {"name": "b", "outcome": "fail"}],
             probes=[None, {"name": ["a"], "outcome": "pass"}, {"name": "b", "outcome": "fail"}])
    assert repair_of(ep) == 0.5


# --- the statistics table as it reads ----------------------------------------------------------

def test_one_sample_shows_its_figure_without_an_interval_and_pass_at_k_names_its_k() -> None:
    """One first try per scenario: a bootstrap of one value is ``[0.29, 0.29]`` and a Wilson
    interval of one trial ``[0.00, 0.79]``, both printed as if they said something; the figure
    is shown alone with ``(n=1)``. And the pass@k column beside pass@1 is titled with its k:
    with one run per scenario it is ``pass@k (k=1)``, never a second ``pass@1``."""
    one = [_repair_ep({"a": "fail", "b": "fail"}, {"a": "pass", "b": "fail"}, scenario="s1"),
           _repair_ep({"a": "fail"}, {"a": "fail"}, scenario="s2")]
    one[0].score, one[1].score = 0.29, 0.5
    one[0].symptom_fixed = False  # judged under rules 3: the unsafe-fix rate of one sample too
    headers, rows = statistics_rows(one)
    assert headers[2:4] == ["pass@1 [95% CI]", "pass@k (k=1)"]
    s1 = dict(zip(headers, rows[0], strict=True))
    assert s1["pass@1 [95% CI]"] == "0.00 (n=1)"
    assert s1["repair [95% CI]"] == "0.50 (n=1)" and s1["mean score [95% CI]"] == "0.29 (n=1)"
    assert s1["unsafe fixes [95% CI]"] == "0.00 (0 of 1)"
    assert "[" not in " ".join(rows[0][2:]) and "[" not in " ".join(rows[1][2:])
    overall = dict(zip(headers, rows[-1], strict=True))  # two samples: intervals
    assert overall["pass@1 [95% CI]"] == "0.00 [0.00, 0.66]"
    assert overall["mean score [95% CI]"].startswith("0.40 [")
    assert "(n=1)" not in statistics_table(one, "plain").splitlines()[-1]
    # The repair column's n is the first tries that have a repair score, not all of them: an
    # old cassette with no pre-check beside a new one leaves one sample.
    mixed = [one[0], _ep("s1", "fail", 1)]
    headers, rows = statistics_rows(mixed)
    assert dict(zip(headers, rows[0], strict=True))["repair [95% CI]"] == "0.50 (n=1)"
    assert "repair score of the first tries [95% CI]: 0.50 (n=1) (0 for doing nothing" in \
        render_table(mixed, "plain")
    # Three runs of a scenario: pass@k (k=3), its interval printed; k differing per scenario is
    # named in each cell.
    three = [_ep("a", "pass", r) for r in range(3)]
    headers, rows = statistics_rows(three)
    assert headers[3] == "pass@k (k=3)" and rows[0][2] == "1.00 [0.44, 1.00]"
    headers, rows = statistics_rows([*three, _ep("b", "fail", 0)])
    assert headers[3] == "pass@k (k=n)" and [r[3] for r in rows[:2]] == ["1.00 (k=3)", "0.00 (k=1)"]


def test_a_rounds_hint_levels_are_listed_level_0_first() -> None:
    """A folder of cassettes lists ``x.r0.h1.jsonl`` before ``x.r0.jsonl``: the table showed a
    round's levels 1, 2, 3, then 0. Each round's levels are in order, the rounds as they came."""
    eps = [_ep("b", "fail", 0, hint_level=1), _ep("b", "fail", 0, hint_level=2),
           _ep("b", "fail", 0, hint_level=0), _ep("a", "fail", 0, hint_level=1),
           _ep("a", "pass", 0, hint_level=0), _ep("b", "pass", 1, hint_level=0)]
    for ep, seconds in zip(eps, range(6), strict=True):
        ep.seconds = seconds + 0.5
    table = render_table(eps, "plain", ladder=True).splitlines()
    rows = [line.split()[:3] for line in table[1:7]]
    assert rows == [["b", "fail", "2.5"], ["b", "fail", "0.5"], ["b", "fail", "1.5"],
                    ["a", "pass", "4.5"], ["a", "fail", "3.5"], ["b", "pass", "5.5"]]
