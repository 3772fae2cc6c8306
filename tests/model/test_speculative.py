"""Issue #30, speculative decoding on the real thing: the bundled 1.5B with the bundled 0.5B as
its draft, asked every request a committed run of the 1.5B recorded (rebuilt by an offline
replay, digests checked), beside the same model decoding plainly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner.app.model_figures import BENCH_RECORDINGS, speculative_figures
from runner.core.cassette import Cassette

pytestmark = [pytest.mark.model]

# A short recorded episode of the default bench (three turns), so the test stays quick.
CASSETTE = BENCH_RECORDINGS / "service-not-enabled.r0.jsonl"


def test_recorded_requests_are_asked_again_of_a_plain_and_a_speculative_server(
        tmp_path: Path) -> None:
    shutil.copy(CASSETTE, tmp_path / CASSETTE.name)
    turns = len(Cassette.load(CASSETTE).stream("model"))
    figures = speculative_figures(count=1, folder=tmp_path)
    assert figures["speculative_cassettes"] == 1
    assert figures["speculative_turns"] == turns
    # The replay followed the recording to its end whatever the servers said; how many replies
    # each gave as recorded is the figure (a fresh server's cache history differs from the
    # recorded run's, which can tip a near-tie: docs/performance.md).
    assert 0 <= figures["plain_same_as_recorded"] <= turns
    assert 0 <= figures["speculative_differing_turns"] <= turns
    # Both servers timed every turn, and the draft's proposals were checked.
    assert figures["plain_gen_tps"] > 0 and figures["speculative_gen_tps"] > 0
    assert figures["speculative_acceptance"] is not None
    assert 0 < figures["speculative_acceptance"] <= 1
