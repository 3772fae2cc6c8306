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


def test_a_draft_model_changes_no_reply_of_a_recorded_run(tmp_path: Path) -> None:
    shutil.copy(CASSETTE, tmp_path / CASSETTE.name)
    turns = len(Cassette.load(CASSETTE).stream("model"))
    figures = speculative_figures(count=1, folder=tmp_path)
    assert figures["speculative_cassettes"] == 1
    assert figures["speculative_turns"] == turns
    # At temperature 0 the draft only decides how many tokens are checked at once, never which.
    assert figures["speculative_differing_turns"] == 0
    # Both servers timed every turn, and the draft's proposals were checked.
    assert figures["plain_gen_tps"] > 0 and figures["speculative_gen_tps"] > 0
    assert figures["speculative_acceptance"] is not None
    assert 0 <= figures["speculative_acceptance"] <= 1
