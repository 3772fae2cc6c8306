"""The committed real-model cassettes: one set per action protocol, each replaying to its verdict.

These are runs of real Qwen2.5-Coder models on real VMs (``make bench`` with
``--record-to recordings/live/<model>-<protocol>``). Replaying them offline
needs neither, so this is how the parsers, the prompts and the scoring of each
protocol stay regression-tested in CI: a change that would make any recorded
run ask a different question or reach a different verdict fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.bench import replay_one
from runner.paths import repo_root
from runner.protocol import PROTOCOLS

LIVE = repo_root() / "recordings" / "live"


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _by_protocol() -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for path in sorted(LIVE.rglob("*.jsonl")):
        header = _events(path)[0]
        found.setdefault(header["protocol"]["name"], []).append(path)
    return found


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_each_protocol_has_real_model_cassettes_that_replay(protocol: str) -> None:
    paths = _by_protocol().get(protocol, [])
    assert paths, f"no committed cassette under recordings/live speaks {protocol!r}"
    acted = 0
    for path in paths:
        events = _events(path)
        model = events[0]["model"]
        assert model.get("model_sha256") and model.get("chat_template_sha256"), path
        assert sum(e["type"] == "model" for e in events) >= 1, path
        acted += any(e["type"] == "guest" and e["op"] == "exec" for e in events)
        outcome = replay_one(path, offline=True, progress=lambda _m: None)
        assert outcome.same, f"{path.name}: recorded {outcome.recorded}, replayed {outcome.replayed}: {outcome.note}"
    assert acted, f"no {protocol} cassette ran a command in the guest"
