"""The committed real-model cassettes: one set per action protocol, each replaying to its verdict.

These are runs of real Qwen2.5-Coder models on real VMs (``make bench`` with
``--record-to recordings/live/<model>-<protocol>``), and older ones kept under
``recordings/archive/<date>-<why>/`` beside copies of the specs they were
recorded against (their ``specs/`` folder), so they still prove "same" against
the exact spec file they ran with. Replaying them offline
needs neither, so this is how the parsers, the prompts and the scoring of each
protocol stay regression-tested in CI: a change that would make any recorded
run ask a different question or reach a different verdict fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.app.replay import replay_one
from runner.core.cassette import Cassette
from runner.core.paths import repo_root
from runner.core.protocol import PROTOCOLS

LIVE = repo_root() / "recordings" / "live"
ARCHIVE = repo_root() / "recordings" / "archive"


def _specs_for(path: Path) -> list[Path] | None:
    """The specs a cassette is checked against: an archive's own ``specs/``, else the checkout's."""
    for parent in path.parents:
        if parent.parent == ARCHIVE:
            return [parent / "specs"]
    return None


def _by_protocol() -> dict[str, list[Cassette]]:
    found: dict[str, list[Cassette]] = {}
    for path in sorted([*LIVE.rglob("*.jsonl"), *ARCHIVE.rglob("*.jsonl")]):
        cas = Cassette.load(path)
        found.setdefault(cas.header["protocol"]["name"], []).append(cas)
    return found


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_each_protocol_has_real_model_cassettes_that_replay(protocol: str) -> None:
    cassettes = _by_protocol().get(protocol, [])
    assert cassettes, f"no committed cassette under recordings/live speaks {protocol!r}"
    acted = 0
    for cas in cassettes:
        model = cas.header["model"]
        assert model.get("model_sha256") and model.get("chat_template_sha256"), cas.path
        assert sum(e["type"] == "model" for e in cas.events) >= 1, cas.path
        acted += any(e["type"] == "guest" and e["op"] == "exec" for e in cas.events)
        outcome = replay_one(cas.path, offline=True, specs=_specs_for(cas.path))
        assert outcome.same, f"{cas.path.name}: recorded {outcome.recorded}, replayed {outcome.replayed}: {outcome.note}"
    assert acted, f"no {protocol} cassette ran a command in the guest"
