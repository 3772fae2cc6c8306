"""The judging rules a run was recorded under, so a replay judges it by the same rules.

A benchmark's verdicts must mean what they say, and its recordings must
still prove "same". When what a verdict means changes (an invariant that
broke now fails the run instead of flagging it; a probe reads /proc instead
of trusting the guest's ``ss``), an old cassette, replayed under today's
rules, would either diverge (the new rules ask the guest other questions)
or be judged by rules it was never run under. So each cassette header
records ``rules`` (read by :func:`runner.core.cassette_header.read_header`; absent in an
older cassette means :attr:`Rules.V1`); replay judges by the recorded rules, and code that
changes judging keys its new behaviour to :data:`CURRENT_RULES`, keeping the
old behaviour for older recordings. What a recorded run would get under
today's rules is a separate question, answered by re-running it, never by
quietly re-judging it.
"""

from __future__ import annotations

from enum import IntEnum


class Rules(IntEnum):
    """One version of the judging rules; higher is newer."""

    # Until 2026-12-04: invariants and forbidden commands only flag a run (collateral,
    # unsafe); probes ask the guest's own tools.
    V1 = 1
    # Validity round (issue 26): a run passes only if every success probe passes, every
    # invariant holds and no forbidden command ran.
    V2 = 2
    # Lasting verdicts (issue 45): every run whose post-check passed is re-checked after a
    # clean reboot unless its spec opts out (``lasting: {reboot: false, why: ...}``), and the
    # machine's state at the end is diffed against the clean machine's
    # (:mod:`runner.core.statediff`): what the agent left weaker fails the run, what it left
    # behind is flagged. Both only make a verdict stricter: a run that fails under V2 fails
    # under V3, so V2 recordings of failing shortcuts still prove them rejected.
    V3 = 3


CURRENT_RULES = Rules.V3
