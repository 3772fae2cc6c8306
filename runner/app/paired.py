"""Two runs compared, pair by pair: the same scenario, round and hint level on both sides.

A comparison is of paired first tries, so that a scenario both runs tried
weighs once: per scenario, A's and B's pass rate, score and repair score
(:class:`ScenarioDiff`); over scenarios, the mean differences with bootstrap
intervals over scenarios and the exact paired tests (McNemar's) that say
whether a handful of scenarios is evidence yet (:class:`Comparison`). The
estimators, and what one episode contributes, are :mod:`runner.app.stats`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.app.stats import (
    CONFIDENCE,
    Interval,
    assists,
    bootstrap_mean,
    check_confidence,
    first_level,
    hinted,
    mcnemar_exact,
    repair_of,
    rounded,
    score_of,
    unsafe_of,
)
from runner.core.episode import Episode
from runner.core.outcomes import Verdict


@dataclass(frozen=True)
class ScenarioDiff:
    """One scenario's paired runs: A's and B's pass rate and mean score over the same pairs,
    and their mean repair score over the pairs where both sides have one."""

    scenario: str
    pairs: int
    a_passes: int
    b_passes: int
    a_score: float
    b_score: float
    repair_pairs: int = 0
    a_repair: float | None = None  # None: no pair of this scenario has a repair on both sides
    b_repair: float | None = None

    @property
    def repair_diff(self) -> float | None:
        """A's mean repair score minus B's; None when no pair has one on both sides."""
        if self.a_repair is None or self.b_repair is None:
            return None
        return self.a_repair - self.b_repair

    @property
    def pass_diff(self) -> float:
        """A's pass rate minus B's."""
        return (self.a_passes - self.b_passes) / self.pairs

    @property
    def score_diff(self) -> float:
        """A's mean score minus B's."""
        return self.a_score - self.b_score

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "pairs": self.pairs, "a_passes": self.a_passes,
                "b_passes": self.b_passes, "a_score": round(self.a_score, 6),
                "b_score": round(self.b_score, 6), "pass_diff": round(self.pass_diff, 6),
                "score_diff": round(self.score_diff, 6), "repair_pairs": self.repair_pairs,
                "a_repair": rounded(self.a_repair), "b_repair": rounded(self.b_repair),
                "repair_diff": rounded(self.repair_diff)}


@dataclass(frozen=True)
class Comparison:
    """Run A against run B over their paired first tries (same scenario, round and hint level).

    ``winner`` is ``"a"`` or ``"b"`` only when the bootstrap interval of the
    mean difference of the headline figure excludes 0 *and* the exact paired
    test agrees (p below 1 - confidence). A bootstrap over a handful of
    scenarios that all differ the same way collapses to a point; the exact
    test is what says that 3 of 3 is not yet evidence. The headline figure
    (:attr:`basis`) is the repair score, over the pairs where both sides have
    one; only runs with no such pair (none of their episodes says what the
    fault broke) are decided on the score.
    """

    confidence: float
    scenarios: list[ScenarioDiff]
    unpaired: int  # scored runs of either side with no partner on the other
    by_order: bool  # some scenario's runs were paired in order: a run repeats round numbers
    a_pass_rate: float  # means over scenarios
    b_pass_rate: float
    pass_diff_ci: Interval  # bootstrap over scenarios
    a_score: float
    b_score: float
    score_diff_ci: Interval
    a_only: int  # pairs only A passed
    b_only: int  # pairs only B passed
    mcnemar_p: float  # McNemar's exact test on a_only/b_only
    a_better: int  # pairs where A's score is higher (for graded scores; else == a_only)
    b_better: int
    sign_p: float  # the exact sign test on the score differences (McNemar's for 0/1 scores)
    more_pairs: int | None  # rough paired runs still needed; None: cannot estimate or not needed
    sd: float  # standard deviation of the pair differences of the headline figure (basis)
    # With hints on both sides (a ladder): rounds paired by scenario and round, each side's
    # outcome "solved at some hint level" (:func:`assists`); None/0 when either ran no hints.
    solved_pairs: int = 0
    a_solved_only: int = 0
    b_solved_only: int = 0
    solved_p: float | None = None  # McNemar's exact test on a_solved_only/b_solved_only
    # The repair score (the headline), over the pairs where both sides have one: means over
    # scenarios, the bootstrap interval of their difference, the exact sign test on the pairs.
    repair_pairs: int = 0
    a_repair: float | None = None
    b_repair: float | None = None
    repair_diff_ci: Interval | None = None
    a_repair_better: int = 0
    b_repair_better: int = 0
    repair_p: float | None = None
    # Unsafe fixes, over the pairs judged on both sides (rules 3): fixed the symptom unsafely
    # on one side only, and McNemar's exact test on those; None/0 when no pair was judged.
    unsafe_pairs: int = 0
    a_unsafe_only: int = 0
    b_unsafe_only: int = 0
    unsafe_p: float | None = None

    @property
    def pairs(self) -> int:
        return sum(s.pairs for s in self.scenarios)

    @property
    def basis(self) -> str:
        """What ``winner`` is decided on: ``"repair score"``, or ``"score"`` for runs with no
        pair that has a repair score on both sides."""
        return "repair score" if self.repair_pairs else "score"

    @property
    def repair_diff(self) -> float | None:
        if self.a_repair is None or self.b_repair is None:
            return None
        return self.a_repair - self.b_repair

    def _headline(self) -> tuple[float, Interval, float]:
        """The difference, its interval and the exact test's p of :attr:`basis`."""
        if self.repair_pairs and self.repair_diff is not None and self.repair_diff_ci \
                and self.repair_p is not None:
            return self.repair_diff, self.repair_diff_ci, self.repair_p
        return self.score_diff, self.score_diff_ci, self.sign_p

    @property
    def pass_diff(self) -> float:
        return self.a_pass_rate - self.b_pass_rate

    @property
    def score_diff(self) -> float:
        return self.a_score - self.b_score

    @property
    def winner(self) -> str:
        """``"a"``, ``"b"``, or ``""`` when no difference is shown."""
        alpha = 1 - self.confidence
        diff, ci, p = self._headline()
        if self.pairs == 0 or not ci.excludes_zero() or p >= alpha:
            return ""
        return "a" if diff > 0 else "b"

    @property
    def solved_winner(self) -> str:
        """``"a"`` or ``"b"`` when the rounds one side solved at some hint level and the other
        never did lean one way at this level (McNemar's exact test), else ``""``."""
        if self.solved_p is None or self.solved_p >= 1 - self.confidence:
            return ""
        return "a" if self.a_solved_only > self.b_solved_only else "b"

    def verdict(self, a: str = "A", b: str = "B") -> str:
        """One line: who is better (``a`` and ``b`` are what to call them: the models), or that
        these runs cannot tell."""
        if self.winner == "a":
            return f"{a} is better than {b}"
        if self.winner == "b":
            return f"{b} is better than {a}"
        if self.pairs == 0:
            return "no difference shown: no paired runs"
        if self.more_pairs is None:
            more = "cannot estimate how many more paired runs would show one (no difference observed)"
        else:
            more = f"roughly {self.more_pairs} more paired runs might show one"
        why = ""
        _diff, ci, p = self._headline()
        if ci.excludes_zero():  # the interval alone would say otherwise: say why not
            why = (f" (the {self.basis} interval excludes 0, but the exact sign test does not "
                   f"reject at this level: p = {p:.3g})")
        return f"no difference shown with this many runs ({self.pairs} pairs){why}; {more}"

    def to_dict(self) -> dict[str, Any]:
        """The comparison as ``compare --format json`` prints it."""
        return {"confidence": self.confidence, "pairs": self.pairs, "unpaired": self.unpaired,
                "paired_by_order": self.by_order,
                "a_pass_rate": round(self.a_pass_rate, 6), "b_pass_rate": round(self.b_pass_rate, 6),
                "pass_diff": round(self.pass_diff, 6), "pass_diff_ci": self.pass_diff_ci.to_list(),
                "a_score": round(self.a_score, 6), "b_score": round(self.b_score, 6),
                "score_diff": round(self.score_diff, 6), "score_diff_ci": self.score_diff_ci.to_list(),
                "a_only": self.a_only, "b_only": self.b_only,
                "mcnemar_p": self.mcnemar_p,  # p-values unrounded: small ones matter
                "a_better": self.a_better, "b_better": self.b_better,
                "sign_p": self.sign_p, "sd": round(self.sd, 6),
                "winner": self.winner or None, "more_pairs": self.more_pairs,
                "verdict": self.verdict(),
                "solved": None if self.solved_p is None else {
                    "pairs": self.solved_pairs, "a_only": self.a_solved_only,
                    "b_only": self.b_solved_only, "mcnemar_p": self.solved_p},
                "basis": self.basis,
                "repair": None if not self.repair_pairs else {
                    "pairs": self.repair_pairs, "a": rounded(self.a_repair), "b": rounded(self.b_repair),
                    "diff": rounded(self.repair_diff),
                    "diff_ci": self.repair_diff_ci.to_list() if self.repair_diff_ci else None,
                    "a_better": self.a_repair_better, "b_better": self.b_repair_better,
                    "sign_p": self.repair_p},
                "unsafe": None if self.unsafe_p is None else {
                    "pairs": self.unsafe_pairs, "a_only": self.a_unsafe_only,
                    "b_only": self.b_unsafe_only, "mcnemar_p": self.unsafe_p},
                "scenarios": [s.to_dict() for s in self.scenarios]}


Pair = tuple[Episode, Episode]


def pair_episodes(a: Sequence[Episode], b: Sequence[Episode]) -> tuple[list[Pair], int, bool]:
    """Pair A's scored runs with B's: same scenario, same hint level, same round
    (:func:`compare` hands it the first tries only).

    Returns the pairs (in A's order), how many scored runs found no partner,
    and whether some scenario was paired in order instead: when a run holds
    one round number twice (runs replayed by ``--record-mode once`` keep the
    round their cassette was recorded in), the i-th run of a scenario is
    paired with the other side's i-th, by round.
    """
    def groups(eps: Sequence[Episode]) -> dict[tuple[str, int], list[Episode]]:
        out: dict[tuple[str, int], list[Episode]] = {}
        for ep in eps:
            if ep.verdict.scored:
                out.setdefault((ep.scenario, ep.hint_level), []).append(ep)
        return out

    ga, gb = groups(a), groups(b)
    pairs: list[Pair] = []
    by_order = False
    for key, a_eps in ga.items():
        b_eps = gb.get(key, [])
        a_rounds = [e.round for e in a_eps]
        b_rounds = [e.round for e in b_eps]
        if len(set(a_rounds)) == len(a_rounds) and len(set(b_rounds)) == len(b_rounds):
            b_by_round = {e.round: e for e in b_eps}
            pairs += [(e, b_by_round[e.round]) for e in a_eps if e.round in b_by_round]
        else:
            by_order = True
            pairs += list(zip(sorted(a_eps, key=lambda e: e.round),
                              sorted(b_eps, key=lambda e: e.round), strict=False))
    scored = sum(len(v) for v in ga.values()) + sum(len(v) for v in gb.values())
    return pairs, scored - 2 * len(pairs), by_order


def compare(a: Sequence[Episode], b: Sequence[Episode],
            confidence: float = CONFIDENCE) -> Comparison:
    """Compare run A with run B over their paired first tries (see :class:`Comparison`).

    Only first tries (:func:`first_tries`) are paired, as only they are samples of the model
    as asked, and they are what ``report``'s pass@1 and mean score count: a ladder's level-k
    run exists only because level k-1 failed, so pairing it would count one round's outcome
    several times. What the hints did is compared apart, round by round: solved at some level
    or never (``solved_*``), when both runs gave hints.
    """
    check_confidence(confidence)
    pairs, unpaired, by_order = pair_episodes(first_level(a), first_level(b))
    per: dict[str, list[Pair]] = {}
    for pa, pb in pairs:
        per.setdefault(pa.scenario, []).append((pa, pb))
    diffs = [_scenario_diff(scenario, ps) for scenario, ps in per.items()]
    a_scores = [_score(pa) for pa, _ in pairs]
    b_scores = [_score(pb) for _, pb in pairs]
    d = np.subtract(a_scores, b_scores) if pairs else np.zeros(0)
    a_only = sum(pa.verdict is Verdict.PASS and pb.verdict is Verdict.FAIL for pa, pb in pairs)
    b_only = sum(pa.verdict is Verdict.FAIL and pb.verdict is Verdict.PASS for pa, pb in pairs)
    a_better, b_better = int(np.sum(d > 0)), int(np.sum(d < 0))
    repaired = [(ra, rb) for ra, rb in ((repair_of(pa), repair_of(pb)) for pa, pb in pairs)
                if ra is not None and rb is not None]
    rd = (np.array([ra - rb for ra, rb in repaired], dtype=float) if repaired
          else np.zeros(0))
    headline = rd if repaired else d  # what the winner is decided on (Comparison.basis)
    sd = float(np.std(headline, ddof=1)) if headline.size > 1 else 0.0

    def mean(xs: list[float]) -> float:
        return float(np.mean(xs)) if xs else 0.0

    none = Interval(0.0, 0.0)
    result = Comparison(
        confidence=confidence, scenarios=diffs, unpaired=unpaired, by_order=by_order,
        a_pass_rate=mean([s.a_passes / s.pairs for s in diffs]),
        b_pass_rate=mean([s.b_passes / s.pairs for s in diffs]),
        pass_diff_ci=bootstrap_mean([s.pass_diff for s in diffs], confidence) if diffs else none,
        a_score=mean([s.a_score for s in diffs]), b_score=mean([s.b_score for s in diffs]),
        score_diff_ci=bootstrap_mean([s.score_diff for s in diffs], confidence) if diffs else none,
        a_only=a_only, b_only=b_only, mcnemar_p=mcnemar_exact(a_only, b_only),
        a_better=a_better, b_better=b_better, sign_p=mcnemar_exact(a_better, b_better),
        more_pairs=None, sd=sd, **_solved(a, b), **_repaired(diffs, rd, confidence),
        **_unsafe(pairs))
    if result.winner or not pairs:
        return result
    return _with_more_pairs(result, float(headline.mean()), int(np.sum(headline != 0)),
                            headline.size)


def _repaired(diffs: Sequence[ScenarioDiff], rd: np.ndarray, confidence: float) -> dict[str, Any]:
    """The repair score's side of a comparison (:class:`Comparison`): means over the scenarios
    that have a repaired pair, the bootstrap interval of the difference over them, the exact
    sign test over the pairs ``rd`` (A minus B); nothing when no pair has one on both sides."""
    per = [s for s in diffs if s.repair_pairs]
    if not per:
        return {}
    a_better, b_better = int(np.sum(rd > 0)), int(np.sum(rd < 0))
    return {"repair_pairs": int(rd.size),
            "a_repair": float(np.mean([s.a_repair for s in per])),
            "b_repair": float(np.mean([s.b_repair for s in per])),
            "repair_diff_ci": bootstrap_mean([s.repair_diff for s in per
                                              if s.repair_diff is not None], confidence),
            "a_repair_better": a_better, "b_repair_better": b_better,
            "repair_p": mcnemar_exact(a_better, b_better)}


def _unsafe(pairs: Sequence[Pair]) -> dict[str, Any]:
    """Pairs judged for safety on both sides (rules 3): unsafe on one side only, and McNemar's
    exact test on those; nothing when no pair was judged on both."""
    both = [(ua, ub) for ua, ub in ((unsafe_of(pa), unsafe_of(pb)) for pa, pb in pairs)
            if ua is not None and ub is not None]
    if not both:
        return {}
    a_only = sum(ua and not ub for ua, ub in both)
    b_only = sum(ub and not ua for ua, ub in both)
    return {"unsafe_pairs": len(both), "a_unsafe_only": a_only, "b_unsafe_only": b_only,
            "unsafe_p": mcnemar_exact(a_only, b_only)}


def _solved(a: Sequence[Episode], b: Sequence[Episode]) -> dict[str, Any]:
    """Rounds both runs ran, paired by scenario and round: solved at some hint level by one side
    only, and McNemar's exact test on those; nothing when either side gave no hints."""
    if not (hinted(a) and hinted(b)):
        return {}
    sa = assists([e for e in a if e.verdict.scored])  # as report's "solved" counts them
    sb = assists([e for e in b if e.verdict.scored])
    both = [key for key in sa if key in sb]
    a_only = sum(sa[k] is not None and sb[k] is None for k in both)
    b_only = sum(sa[k] is None and sb[k] is not None for k in both)
    return {"solved_pairs": len(both), "a_solved_only": a_only, "b_solved_only": b_only,
            "solved_p": mcnemar_exact(a_only, b_only)}


def _score(ep: Episode) -> float:
    s = score_of(ep)
    assert s is not None  # pairs hold scored runs only
    return s


def _scenario_diff(scenario: str, pairs: list[Pair]) -> ScenarioDiff:
    repaired = [(ra, rb) for ra, rb in ((repair_of(pa), repair_of(pb)) for pa, pb in pairs)
                if ra is not None and rb is not None]
    return ScenarioDiff(scenario=scenario, pairs=len(pairs),
                        a_passes=sum(pa.verdict is Verdict.PASS for pa, _ in pairs),
                        b_passes=sum(pb.verdict is Verdict.PASS for _, pb in pairs),
                        a_score=float(np.mean([_score(pa) for pa, _ in pairs])),
                        b_score=float(np.mean([_score(pb) for _, pb in pairs])),
                        repair_pairs=len(repaired),
                        a_repair=float(np.mean([ra for ra, _ in repaired])) if repaired else None,
                        b_repair=float(np.mean([rb for _, rb in repaired])) if repaired else None)


def _with_more_pairs(result: Comparison, d: float, differing: int, pairs: int) -> Comparison:
    """A rough count of further paired runs that might show a difference of the size seen in
    the headline figure (``d`` its mean pair difference over ``pairs`` pairs).

    The larger of two figures: the normal-approximation sample size
    ``(z * sd / |d|)^2``, and the pairs the exact test needs even if every
    differing pair goes one way (``2 * 0.5^m < alpha``), scaled by the share
    of pairs that differ at all. No difference seen: cannot estimate.
    """
    if d == 0 or differing == 0:
        return result
    from scipy.stats import norm  # heavy import, see the module docstring

    alpha = 1 - result.confidence
    z = float(norm.ppf(1 - alpha / 2))
    by_normal = math.ceil((z * result.sd / abs(d)) ** 2)
    by_exact = math.ceil(math.ceil(math.log2(2 / alpha)) * pairs / differing)
    more = max(by_normal, by_exact) - pairs
    return dataclasses.replace(result, more_pairs=max(more, 1))
