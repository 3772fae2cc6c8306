"""Statistics over episodes: pass@k, Wilson intervals, bootstrap means and paired comparisons.

The arithmetic is scipy's, not ours: exact binomial coefficients
(``scipy.special.comb``), the Wilson score interval and the exact binomial
test (``scipy.stats.binomtest``), and the bootstrap (``scipy.stats.bootstrap``).
This module only decides what is counted:

- Only scored runs count (verdict ``pass`` or ``fail``); ``infra-error`` and
  ``invalid-scenario`` say nothing about the model.
- An episode's score is its graded ``score`` when it has one, else 1.0 for a
  pass and 0.0 for a fail.
- Its repair score (:func:`runner.core.record.repair_score`, the headline
  graded figure) counts only what the fault broke, weighted as the spec
  weighs its probes (:func:`probe_weights`): 0 for doing nothing, 1 for the oracle.
- The unsafe-fix rate is the share of judged first tries (rules 3 on: their
  ``unsafe_fix`` is not None) that fixed the symptom with damage or a
  state-diff finding, with its Wilson interval; runs recorded under older
  rules were not judged and have none, never a 0.
- Overall figures of a comparison are means over scenarios, each scenario
  weighing the same, and their intervals come from a bootstrap over
  scenarios: rounds of one scenario are not independent of each other.

scipy is imported inside the functions that use it: ``scipy.stats`` takes
about 0.7 s to import, and most commands (list, validate, --help) never
compute a statistic.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.outcomes import Verdict
from runner.core.paths import default_spec_dirs
from runner.core.record import repair_score
from runner.core.spec import load_spec

log = logging.getLogger("rootbench.stats")

CONFIDENCE = 0.95  # every interval rootbench shows, unless asked otherwise
RESAMPLES = 9999  # bootstrap resamples (scipy's default)
Method = Literal["BCa", "percentile"]  # scipy's names of the bootstrap intervals used here
METHODS: tuple[Method, ...] = ("BCa", "percentile")  # the first that scipy can compute


# --- the estimators ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval ``[low, high]``."""

    low: float
    high: float

    def excludes_zero(self) -> bool:
        """Whether 0 lies outside the interval (the sign of the quantity is shown)."""
        return self.low > 0 or self.high < 0

    def to_list(self) -> list[float]:
        """``[low, high]``, rounded to 6 places, as results JSON holds it."""
        return [round(self.low, 6), round(self.high, 6)]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator of Chen et al. 2021 (the Codex paper, eq. 1).

    With ``n`` runs of which ``c`` passed, the chance that at least one of
    ``k`` runs drawn without replacement passed: ``1 - C(n-c, k) / C(n, k)``.
    The binomial coefficients are exact integers (``scipy.special.comb`` with
    ``exact=True``), so the result is exact up to the final division.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, not n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every draw of k runs holds a pass
    from scipy.special import comb  # heavy import, see the module docstring

    total = comb(n, k, exact=True)
    return (total - comb(n - c, k, exact=True)) / total  # one correctly rounded division


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """The Wilson score interval for ``successes`` out of ``n`` (no continuity correction).

    With no trials nothing is known: ``[0, 1]``.
    """
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, not {successes} of {n}")
    _check_confidence(confidence)
    if n == 0:
        return Interval(0.0, 1.0)
    from scipy.stats import binomtest  # heavy import, see the module docstring

    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(max(0.0, float(ci.low)), min(1.0, float(ci.high)))


def bootstrap_mean(values: Iterable[float], confidence: float = CONFIDENCE,
                   seed: int = 0) -> Interval:
    """A bootstrap confidence interval for the mean of ``values`` (BCa, else percentile).

    Fewer than two values, or values all equal, leave nothing to resample:
    the interval is the mean itself. Where BCa cannot be computed (scipy
    warns of degenerate data) the percentile interval is used. The same
    ``seed`` gives the same interval, whatever order the values come in (they
    are sorted first: a bench's table and ``report`` of the same episodes
    listed them in different orders and printed different intervals).
    """
    data = np.sort(np.asarray(list(values), dtype=float))
    if data.size == 0:
        raise ValueError("the mean of no values has no interval")
    if not np.all(np.isfinite(data)):
        raise ValueError("values must be finite numbers")
    _check_confidence(confidence)
    point = float(data.mean())
    if data.size < 2 or bool(np.all(data == data[0])):
        return Interval(point, point)
    for method in METHODS:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # scipy's DegenerateDataWarning is one
            try:
                low, high = _bootstrap(data, confidence, seed, method)
            except RuntimeWarning:
                continue
        if math.isfinite(low) and math.isfinite(high):
            return Interval(max(low, float(data.min())), min(high, float(data.max())))
    return Interval(float(data.min()), float(data.max()))  # never reached in practice


def _bootstrap(data: np.ndarray, confidence: float, seed: int,
               method: Method) -> tuple[float, float]:
    from scipy.stats import bootstrap  # heavy import, see the module docstring

    rng = np.random.default_rng(seed)
    # scipy 1.15 renamed random_state to rng; both take a Generator.
    if "rng" in inspect.signature(bootstrap).parameters:
        res = bootstrap((data,), np.mean, confidence_level=confidence, n_resamples=RESAMPLES,
                        method=method, rng=rng)
    else:
        res = bootstrap((data,), np.mean, confidence_level=confidence, n_resamples=RESAMPLES,
                        method=method, random_state=rng)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """McNemar's exact test: the two-sided binomial test (p = 1/2) on the discordant pairs.

    ``a_only`` pairs where only A passed, ``b_only`` where only B did. With
    no discordant pair there is no evidence either way: 1.0.
    """
    if a_only < 0 or b_only < 0:
        raise ValueError("counts must not be negative")
    if a_only + b_only == 0:
        return 1.0
    from scipy.stats import binomtest  # heavy import, see the module docstring

    return float(binomtest(a_only, a_only + b_only, 0.5).pvalue)


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence!r}")


# --- what an episode contributes ---------------------------------------------------------------

def score_of(ep: Episode) -> float | None:
    """The episode's score: its graded ``score`` if it has one, else 1.0 pass / 0.0 fail.

    None for a run that is not scored (infra-error, invalid-scenario).
    """
    if not ep.verdict.scored:
        return None
    graded = _number(getattr(ep, "score", None))
    if graded is not None:
        return graded
    return 1.0 if ep.verdict is Verdict.PASS else 0.0


def probe_weights(scenario: str) -> Mapping[str, float]:
    """The ``weight`` of each success probe of ``scenario``, by name, as its spec says now
    (``$ROOTBENCH_SPECS``, else the bundled specs: ``<id>.yaml``); empty (every probe weighs 1)
    when no spec of that id is there or it does not load.

    A verdict line keeps each probe's name and outcome but not its weight, so the repair
    score pairs the spec's weights by name; a probe the spec no longer has weighs 1. Only
    two specs weigh a probe at all, and a repair that is all or nothing needs no weight, so
    :func:`repair_of` asks lazily and each spec is read once."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,127}", scenario):
        return {}  # a recording's name is never a path
    return _weights_in(tuple(default_spec_dirs()), scenario)


@functools.lru_cache(maxsize=1024)
def _weights_in(dirs: tuple[Path, ...], scenario: str) -> Mapping[str, float]:
    for d in dirs:
        path = d / f"{scenario}.yaml"
        if not path.is_file():
            continue
        try:
            spec = load_spec(path)
        except InvalidInput as exc:
            log.warning("%s: probe weights not read (every probe weighs 1): %s", path, exc)
            return {}
        if spec.id == scenario:
            return {p.name: p.weight for p in spec.probes}
    return {}


class _LazyWeights(Mapping[str, float]):
    """:func:`probe_weights` of one scenario, looked up at the first read."""

    def __init__(self, scenario: str) -> None:
        self._scenario = scenario

    def _all(self) -> Mapping[str, float]:
        return probe_weights(self._scenario)

    def __getitem__(self, name: str) -> float:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def repair_of(ep: Episode) -> float | None:
    """The episode's repair score (:func:`runner.core.record.repair_score`, weighted by its
    spec's :func:`probe_weights`); None for a run that is not scored or says nothing of what
    the fault broke."""
    if not ep.verdict.scored:
        return None
    return repair_score(ep, _LazyWeights(ep.scenario))


def unsafe_of(ep: Episode) -> bool | None:
    """Whether the scored episode fixed the symptom unsafely (``Episode.unsafe_fix``); None
    when it was not judged (rules before 3, a run cut short) or is not scored."""
    return ep.unsafe_fix if ep.verdict.scored else None


# Two words, one meaning each, wherever rootbench shows them:
# - the *hint level* of an episode (``Episode.hint_level``) is how many of the scenario's hints
#   its task carried: what it ran at;
# - the *assist* of a round (:func:`assists`) is the lowest hint level at which the round passed:
#   how much help the model needed (None: it never passed).

RoundKey = tuple[str, int]  # (scenario, round): the episodes of one round, every hint level


def deciding(episodes: Sequence[Episode]) -> dict[RoundKey, Episode]:
    """Per (scenario, round), the episode that decides the round: its pass at the lowest hint
    level, else (no level passed) its episode at the highest level tried. Without a ladder every
    round is one episode, which decides it."""
    out: dict[RoundKey, Episode] = {}
    for ep in episodes:
        key = (ep.scenario, ep.round)
        best = out.get(key)
        if best is None:
            out[key] = ep
        elif ep.verdict is Verdict.PASS:
            if best.verdict is not Verdict.PASS or ep.hint_level < best.hint_level:
                out[key] = ep
        elif best.verdict is not Verdict.PASS and ep.hint_level >= best.hint_level:
            out[key] = ep
    return out


def assists(episodes: Sequence[Episode]) -> dict[RoundKey, int | None]:
    """Per (scenario, round): its assist, the lowest hint level that passed, None when none did.

    With ``--ladder`` this is how much help the model needed: 0 solved it
    unaided, k needed the first k hints, None never solved it.
    """
    return {key: ep.hint_level if ep.verdict is Verdict.PASS else None
            for key, ep in deciding(episodes).items()}


def hinted(episodes: Sequence[Episode]) -> bool:
    """Whether any scored episode ran with hints: a run where the assist means something."""
    return any(e.hint_level for e in episodes if e.verdict.scored)


def first_tries(episodes: Sequence[Episode]) -> list[Episode]:
    """Per (scenario, round), the scored run at the lowest hint level, in the order given.

    A ladder round is several episodes (level 0, then one more hint after each
    failure); only its first try is a sample of the model as asked, so pass@k
    and the mean score are about first tries. Without a ladder every round is
    one episode and this is every scored run.
    """
    seen: set[RoundKey] = set()
    first: list[Episode] = []
    for ep in _first_level(episodes):  # a round held twice at that level: its first run
        if (ep.scenario, ep.round) not in seen:
            seen.add((ep.scenario, ep.round))
            first.append(ep)
    return first


def pass_count(episodes: Sequence[Episode]) -> tuple[int, int]:
    """``(passes, n)`` over the first tries (:func:`first_tries`): the pass rate every table and
    plot shows is ``passes / n`` (no first try scored: ``n`` is 0)."""
    scored = first_tries(episodes)
    return sum(e.verdict is Verdict.PASS for e in scored), len(scored)


def verdict_counts(episodes: Sequence[Episode]) -> dict[str, int]:
    """How many episodes ended with each verdict, keyed by the verdict's spelling, every verdict
    present (0 when none ended so)."""
    counts = Counter(ep.verdict for ep in episodes)
    return {v.value: counts[v] for v in Verdict}


def model_speed(episodes: Sequence[Episode]) -> tuple[float, float] | None:
    """The mean prompt and generation speed (tokens a second) of the episodes that timed both
    (``Episode.prompt_tps``, ``Episode.gen_tps``); None when none did."""
    tps = [(p, g) for p, g in ((ep.prompt_tps, ep.gen_tps) for ep in episodes) if p and g]
    if not tps:
        return None
    return sum(p for p, _g in tps) / len(tps), sum(g for _p, g in tps) / len(tps)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


# --- one run: per scenario and overall ---------------------------------------------------------

@dataclass(frozen=True)
class Summary:
    """The statistics of one scenario's runs (or of all of them: ``scenario`` None)."""

    scenario: str | None
    runs: int  # every episode, scored or not (a ladder round counts each level it ran)
    scored: int  # first tries that passed or failed: the n of pass@k
    passes: int  # of those
    pass_at_1: float | None  # None: nothing scored
    pass_at_1_ci: Interval | None  # Wilson
    pass_at_k: dict[int, float]  # k -> pass@k, for k = 1..scored (overall: 1..fewest scored)
    mean_score: float | None
    mean_score_ci: Interval | None  # bootstrap
    mean_assist: float | None = None  # over solved rounds, only when runs had hints
    mean_assist_ci: Interval | None = None
    solved: int | None = None  # rounds that passed at some hint level (None: no hints given)
    unscored: int = 0  # infra-error and invalid-scenario runs
    mean_milestones: float | None = None  # mean milestone fraction of first tries that have one
    fixed: int = 0  # scored runs (any level) whose success probes all passed at some point
    median_fix_s: float | None = None  # their median seconds from first command to that point
    # The headline graded figure: the mean repair score of the first tries that have one
    # (:func:`repair_of`), with its bootstrap interval; None: none has one.
    mean_repair: float | None = None
    mean_repair_ci: Interval | None = None
    judged: int = 0  # first tries whose fix was judged for safety (rules 3: unsafe_fix not None)
    unsafe_fixes: int = 0  # of those, the ones that fixed the symptom unsafely
    unsafe_rate_ci: Interval | None = None  # Wilson; None: nothing judged

    @property
    def unsafe_rate(self) -> float | None:
        """The share of judged first tries that fixed the symptom unsafely; None: none judged."""
        return self.unsafe_fixes / self.judged if self.judged else None

    @property
    def k(self) -> int:
        """The largest k with a pass@k (0 when nothing is scored)."""
        return max(self.pass_at_k, default=0)

    def to_dict(self) -> dict[str, Any]:
        """This summary as results JSON holds it (intervals as ``[low, high]``)."""
        d: dict[str, Any] = {} if self.scenario is None else {"scenario": self.scenario}
        d.update(runs=self.runs, scored=self.scored, passes=self.passes,
                 pass_at_1=_r(self.pass_at_1),
                 pass_at_1_ci=self.pass_at_1_ci.to_list() if self.pass_at_1_ci else None,
                 pass_at_k={str(k): round(v, 6) for k, v in self.pass_at_k.items()},
                 mean_score=_r(self.mean_score),
                 mean_score_ci=self.mean_score_ci.to_list() if self.mean_score_ci else None)
        d.update(mean_milestones=_r(self.mean_milestones), fixed=self.fixed,
                 median_fix_s=_r(self.median_fix_s))
        d.update(mean_repair=_r(self.mean_repair),
                 mean_repair_ci=self.mean_repair_ci.to_list() if self.mean_repair_ci else None,
                 judged=self.judged, unsafe_fixes=self.unsafe_fixes,
                 unsafe_rate=_r(self.unsafe_rate),
                 unsafe_rate_ci=self.unsafe_rate_ci.to_list() if self.unsafe_rate_ci else None)
        if self.solved is not None:
            d.update(solved=self.solved, mean_assist=_r(self.mean_assist),
                     mean_assist_ci=self.mean_assist_ci.to_list() if self.mean_assist_ci else None)
        return d


@dataclass(frozen=True)
class Statistics:
    """A run's statistics: one :class:`Summary` per scenario (first-seen order) and one overall."""

    confidence: float
    scenarios: list[Summary]
    overall: Summary

    def to_dict(self) -> dict[str, Any]:
        """The ``statistics`` entry of results JSON::

            {"confidence": 0.95,
             "scenarios": [{"scenario": ID, "runs", "scored", "passes",
                            "pass_at_1", "pass_at_1_ci": [low, high],      # Wilson
                            "pass_at_k": {"1": p, ..., "<scored>": p},     # Chen et al. 2021
                            "mean_score", "mean_score_ci": [low, high],    # bootstrap
                            "mean_milestones",                             # first tries
                            "fixed", "median_fix_s",                       # any level
                            "mean_repair", "mean_repair_ci",               # bootstrap
                            "judged", "unsafe_fixes",                      # rules 3 on
                            "unsafe_rate", "unsafe_rate_ci",               # Wilson
                            "solved", "mean_assist", "mean_assist_ci"      # only with hints
                           }, ...],
             "overall": {the same fields without "scenario"}}

        Figures are floats rounded to 6 places; a figure with nothing scored
        behind it is null (an unsafe-fix rate with nothing judged too: runs
        recorded before rules 3 say nothing about it). ``scored``, ``passes``,
        pass@k, the mean score, the mean repair score and the unsafe-fix rate
        count first tries (a ladder round's level-0 run, see
        :func:`first_tries`); ``solved`` counts rounds that passed at any
        level, and ``mean_assist`` is the mean lowest passing level over
        those. Overall pass@1 and mean score pool every scored first try;
        overall pass@k is the mean over scenarios (k up to the fewest scored
        runs any scenario has), as in the Codex paper.
        """
        return {"confidence": self.confidence,
                "scenarios": [s.to_dict() for s in self.scenarios],
                "overall": self.overall.to_dict()}


def _summary(scenario: str | None, episodes: Sequence[Episode], confidence: float,
             overall_k: dict[int, float] | None = None, *, hinted: bool) -> Summary:
    """``hinted``: the run gave hints somewhere (a ladder scenario solved unaided then counts as
    solved at level 0, not as "no hints given"), decided over the whole run by the caller."""
    every_scored = [e for e in episodes if e.verdict.scored]  # every hint level
    scored = first_tries(every_scored)
    passes, n = pass_count(scored)
    scores = [s for s in (score_of(e) for e in scored) if s is not None]
    helped = [float(lv) for lv in assists(every_scored).values()
              if lv is not None] if hinted else []
    found = [f for f in (_number(e.milestone_fraction) for e in scored) if f is not None]
    fix_s = [s for s in (_number((e.fixed_at or {}).get("seconds")) for e in every_scored)
             if s is not None]
    repairs = [r for r in (repair_of(e) for e in scored) if r is not None]
    judged = [u for u in (unsafe_of(e) for e in scored) if u is not None]
    by_k = overall_k if overall_k is not None else {
        k: pass_at_k(n, passes, k) for k in range(1, n + 1)}
    return Summary(
        scenario=scenario, runs=len(episodes), scored=n, passes=passes,
        pass_at_1=passes / n if n else None,
        pass_at_1_ci=wilson(passes, n, confidence) if n else None,
        pass_at_k=by_k,
        mean_score=float(np.mean(scores)) if scores else None,
        mean_score_ci=bootstrap_mean(scores, confidence) if scores else None,
        mean_assist=float(np.mean(helped)) if helped else None,
        mean_assist_ci=bootstrap_mean(helped, confidence) if helped else None,
        solved=len(helped) if hinted else None,
        unscored=sum(not e.verdict.scored for e in episodes),
        mean_milestones=float(np.mean(found)) if found else None,
        fixed=len(fix_s), median_fix_s=float(np.median(fix_s)) if fix_s else None,
        mean_repair=float(np.mean(repairs)) if repairs else None,
        mean_repair_ci=bootstrap_mean(repairs, confidence) if repairs else None,
        judged=len(judged), unsafe_fixes=sum(judged),
        unsafe_rate_ci=wilson(sum(judged), len(judged), confidence) if judged else None)


def summarize(episodes: Sequence[Episode], confidence: float = CONFIDENCE) -> Statistics:
    """Per-scenario and overall statistics of one run's episodes."""
    _check_confidence(confidence)
    by: dict[str, list[Episode]] = {}
    for ep in episodes:
        by.setdefault(ep.scenario, []).append(ep)
    helped = hinted(episodes)
    per = [_summary(scenario, eps, confidence, hinted=helped) for scenario, eps in by.items()]
    with_scores = [s for s in per if s.scored]  # overall pass@k: over scenarios with first tries
    k_max = min((s.scored for s in with_scores), default=0)
    overall_k = {k: float(np.mean([s.pass_at_k[k] for s in with_scores]))
                 for k in range(1, k_max + 1)}
    return Statistics(confidence, per, _summary(None, episodes, confidence, overall_k, hinted=helped))


# --- two runs: a paired comparison -------------------------------------------------------------

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
                "a_repair": _r(self.a_repair), "b_repair": _r(self.b_repair),
                "repair_diff": _r(self.repair_diff)}


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
                    "pairs": self.repair_pairs, "a": _r(self.a_repair), "b": _r(self.b_repair),
                    "diff": _r(self.repair_diff),
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
    _check_confidence(confidence)
    pairs, unpaired, by_order = pair_episodes(_first_level(a), _first_level(b))
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


def _first_level(episodes: Sequence[Episode]) -> list[Episode]:
    """The scored runs at their round's lowest scored hint level: :func:`first_tries`, except
    that a round number held twice (a run replayed by ``--record-mode once``) keeps both runs,
    for :func:`pair_episodes` to pair in order."""
    lowest: dict[RoundKey, int] = {}
    for ep in episodes:
        if ep.verdict.scored:
            key = (ep.scenario, ep.round)
            lowest[key] = min(lowest.get(key, ep.hint_level), ep.hint_level)
    return [ep for ep in episodes
            if ep.verdict.scored and ep.hint_level == lowest[(ep.scenario, ep.round)]]


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
