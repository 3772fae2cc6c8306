"""Replaying a cassette: the recorded model (and, offline, the recorded guest) through the real loop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner.backends.sandbox import Sandbox
from runner.core.cassette import Cassette
from runner.core.clock import Clock
from runner.core.episode import run_episode
from runner.core.errors import InvalidInput
from runner.core.protocol import get_protocol
from runner.core.replay import ReplayClock, ReplayGuest, ReplayModel
from runner.core.spec import scenario_from_dict
from runner.core.text import clean_text


@dataclass
class ReplayOutcome:
    """One cassette replayed: the recorded and replayed verdicts (with flags) side by side."""

    cassette: str
    scenario: str
    recorded: str
    replayed: str
    same: bool
    note: str
    seconds: float
    turns: int


def replay_one(path: Path, *, offline: bool, lenient: bool = False, accel: str = "auto",
               transport: str = "serial") -> ReplayOutcome:
    """Run a recorded episode again, the model (and with ``offline`` the guest) from the cassette."""
    cas = Cassette.load(path)
    if cas.verdict is None:
        raise InvalidInput("the cassette is incomplete (no verdict): it was cut short",
                           path=str(path))
    scenario = scenario_from_dict(cas.header["scenario"])
    protocol = get_protocol(cas.header.get("protocol", {}).get("name", "tools"))
    model = ReplayModel(cas, lenient=lenient)
    if offline:
        ep = run_episode(scenario, ReplayGuest(cas), model, protocol, ReplayClock(cas), None,
                         round_=int(cas.header.get("round", 0)))
    else:
        with Sandbox(scenario.image, accel=accel, transport=transport) as box:
            ep = run_episode(scenario, box.guest, model, protocol, Clock(), None,
                             vm_killed=box.killed_externally)
    rec = cas.verdict
    recorded = rec.get("verdict", "?") + (f" [{','.join(rec['flags'])}]" if rec.get("flags") else "")
    replayed = ep.verdict.value + (f" [{','.join(f.value for f in ep.flags)}]" if ep.flags else "")
    note = ep.reason if recorded != replayed else ("; ".join(model.mismatches)[:200] or "")
    return ReplayOutcome(str(path), scenario.id, recorded, replayed, recorded == replayed,
                         clean_text(note), ep.seconds, ep.turns)
