"""Statistics over episodes: pass@k, Wilson intervals, bootstrap means, one run's summary.

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
- Two runs are compared pair by pair in :mod:`runner.app.paired`; its
  overall figures are means over scenarios, each scenario
  weighing the same, and their intervals come from a bootstrap over
  scenarios: rounds of one scenario are not independent of each other.

scipy is imported inside the functions that use it: ``scipy.stats`` takes
about 0.7 s to import, and most commands (list, validate, --help) never
compute a statistic.
"""

from __future__ import annotations

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
    check_confidence(confidence)
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
    check_confidence(confidence)
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


def check_confidence(confidence: float) -> None:
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


def first_level(episodes: Sequence[Episode]) -> list[Episode]:
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


def first_tries(episodes: Sequence[Episode]) -> list[Episode]:
    """Per (scenario, round), the scored run at the lowest hint level, in the order given.

    A ladder round is several episodes (level 0, then one more hint after each
    failure); only its first try is a sample of the model as asked, so pass@k
    and the mean score are about first tries. Without a ladder every round is
    one episode and this is every scored run.
    """
    seen: set[RoundKey] = set()
    first: list[Episode] = []
    for ep in first_level(episodes):  # a round held twice at that level: its first run
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


def rounded(x: float | None) -> float | None:
    """A figure as results files keep it: six decimals (None stays None)."""
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
                 pass_at_1=rounded(self.pass_at_1),
                 pass_at_1_ci=self.pass_at_1_ci.to_list() if self.pass_at_1_ci else None,
                 pass_at_k={str(k): round(v, 6) for k, v in self.pass_at_k.items()},
                 mean_score=rounded(self.mean_score),
                 mean_score_ci=self.mean_score_ci.to_list() if self.mean_score_ci else None)
        d.update(mean_milestones=rounded(self.mean_milestones), fixed=self.fixed,
                 median_fix_s=rounded(self.median_fix_s))
        d.update(mean_repair=rounded(self.mean_repair),
                 mean_repair_ci=self.mean_repair_ci.to_list() if self.mean_repair_ci else None,
                 judged=self.judged, unsafe_fixes=self.unsafe_fixes,
                 unsafe_rate=rounded(self.unsafe_rate),
                 unsafe_rate_ci=self.unsafe_rate_ci.to_list() if self.unsafe_rate_ci else None)
        if self.solved is not None:
            d.update(solved=self.solved, mean_assist=rounded(self.mean_assist),
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
    check_confidence(confidence)
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
