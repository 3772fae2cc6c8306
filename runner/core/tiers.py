"""Difficulty tiers from measurement: the rule of docs/validity.md applied to ladder runs.

A *ladder* is one model's hint-ladder run of one scenario (``--ladder``): each round starts at
hint level 0 and, after each failure, runs again with one more hint, until a level passes or
the scenario's hints run out. The tier of a scenario, from the ladders of every bundled model:

- **easy**: some bundled model passed it unaided (a round passed at level 0);
- **medium**: some bundled model passed it, but only with hints;
- **hard**: no bundled model passed it at any level, with every hint;
- **unmeasured**: some bundled model has no *complete* ladder of it (a level is missing, a
  round stopped early, or only infra-error runs there): nothing is claimed from a partial run.

Only scored runs (pass or fail) count: an infra-error run says nothing about the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runner.core.episode import Episode
from runner.core.outcomes import Tier, Verdict


def ladder_complete(episodes: Sequence[Episode], hints: int) -> bool:
    """Whether ``episodes`` (one model's runs of one scenario) hold a whole ladder per round:
    level 0, then each next level after a failing one, up to a pass or to level ``hints``.
    No scored run at all is not a ladder."""
    by_round: dict[int, dict[int, bool]] = {}
    for ep in episodes:
        if ep.verdict.scored:
            levels = by_round.setdefault(ep.round, {})
            levels[ep.hint_level] = levels.get(ep.hint_level, False) or ep.verdict is Verdict.PASS
    if not by_round:
        return False
    for levels in by_round.values():
        level = 0
        while True:
            if level not in levels:
                return False
            if levels[level] or level >= hints:
                break
            level += 1
    return True


def measured_tier(ladders: Mapping[str, Sequence[Sequence[Episode]]], hints: int,
                  models: Sequence[str]) -> Tier:
    """The tier of one scenario with ``hints`` hints, from ``ladders`` (per model, its ladders of
    the scenario: one per run folder) of the bundled ``models``; see the module docstring.
    Other models' ladders are not looked at: the tiers say what the bundled models can do."""
    complete = {m: [lad for lad in ladders.get(m, ()) if ladder_complete(lad, hints)]
                for m in models}
    if not models or any(not found for found in complete.values()):
        return Tier.UNMEASURED
    passes = [ep.hint_level for found in complete.values() for lad in found for ep in lad
              if ep.verdict is Verdict.PASS]
    if not passes:
        return Tier.HARD
    return Tier.EASY if min(passes) == 0 else Tier.MEDIUM
