"""One recorded episode in a fresh sandbox: the unit every bench, verify and live test is made of."""

from __future__ import annotations

import contextlib
import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import __version__
from runner.backends.sandbox import Sandbox
from runner.core.cassette import FORMAT_VERSION, CassetteWriter
from runner.core.clock import Clock
from runner.core.episode import Episode, run_episode
from runner.core.errors import InfraError
from runner.core.model import Model
from runner.core.outcomes import StopReason, Verdict
from runner.core.protocol import Protocol
from runner.core.recording import RecordingGuest, RecordingModel
from runner.core.spec import Scenario, scenario_to_dict
from runner.core.text import one_line


@dataclass(frozen=True)
class RunOptions:
    """How each episode's sandbox is made and which protocol the model speaks."""

    accel: str = "auto"
    transport: str = "serial"
    protocol: str = "auto"
    repeat: int = 1


def header(scenario: Scenario, model: Model, protocol: Protocol, reason: str,
           opts: RunOptions, round_: int, sandbox: dict[str, Any]) -> dict[str, Any]:
    """The cassette's first event: everything needed to replay the run without its spec file."""
    return {
        "type": "header", "format": FORMAT_VERSION,
        "harness": {"name": "rootbench", "version": __version__},
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "scenario": scenario_to_dict(scenario), "spec_hash": scenario.spec_hash,
        "image": sandbox, "model": model.fingerprint(), "agent": model.agent.value,
        "protocol": {"name": protocol.name, "reason": reason},
        "options": {"accel": opts.accel, "transport": opts.transport}, "round": round_,
    }


def run_one(scenario: Scenario, model: Model, protocol: Protocol, reason: str,
            opts: RunOptions, cassette_path: Path, *, round_: int = 0) -> Episode:
    """One scenario in a fresh sandbox, recorded to ``cassette_path``."""
    with CassetteWriter(cassette_path) as writer, contextlib.ExitStack() as stack:
        try:
            box = stack.enter_context(Sandbox(scenario.image, accel=opts.accel,
                                              transport=opts.transport))
        except InfraError as exc:
            writer.write(header(scenario, model, protocol, reason, opts, round_, {}))
            ep = Episode(scenario=scenario.id, agent=model.agent, model=model.name,
                         protocol=protocol.name, round=round_, verdict=Verdict.INFRA_ERROR,
                         stop=StopReason.INFRA_ERROR, reason=f"sandbox: {one_line(str(exc))}",
                         cassette=str(cassette_path))
            writer.write({"type": "verdict", **ep.to_dict()})
            return ep
        writer.write(header(scenario, model, protocol, reason, opts, round_, box.info.to_dict()))
        return run_episode(scenario, RecordingGuest(box.guest, writer),
                           RecordingModel(model, writer), protocol, Clock(writer), writer,
                           vm_killed=box.killed_externally, round_=round_)
