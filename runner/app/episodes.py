"""One recorded episode in a fresh sandbox: the unit every bench, verify and live test is made of.

:class:`EpisodeJob` is one episode as data (picklable), so an executor can
run it in this process, in a child process or on a Ray worker; :func:`run_job`
runs it there.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import __version__
from runner.backends.fleet import Fleet
from runner.backends.sandbox import Sandbox
from runner.core.cassette import CassetteWriter
from runner.core.cassette_header import CassetteHeader, Harness, ProtocolChoice, SandboxOptions
from runner.core.clock import Clock
from runner.core.episode import Episode, run_episode
from runner.core.errors import InfraError
from runner.core.guest import Guest
from runner.core.machines import Machines
from runner.core.model import Model
from runner.core.protocol import Protocol, get_protocol
from runner.core.recording import RecordingGuest, RecordingModel
from runner.core.rules import CURRENT_RULES
from runner.core.spec import Scenario, scenario_to_dict
from runner.core.text import one_line


@dataclass(frozen=True)
class RunOptions:
    """How each episode's sandbox is made, which protocol the model speaks, and how runs are graded.

    ``hints`` is the hint level every scenario runs at (capped at the hints
    it has); ``ladder`` instead starts at 0 and climbs a level after each
    failure. ``track_fix`` re-runs the success probes after each agent
    command, for ``fixed_at`` and ``regressed``.
    """

    accel: str = "auto"
    transport: str = "serial"
    protocol: str = "auto"
    repeat: int = 1
    hints: int = 0
    ladder: bool = False
    track_fix: bool = True


def header(scenario: Scenario, model: Model, protocol: Protocol, reason: str,
           opts: RunOptions, round_: int, sandbox: dict[str, Any], *,
           hint_level: int = 0) -> dict[str, Any]:
    """The cassette's first event: everything needed to replay the run without its spec file.

    ``hint_level`` (the task sent) and ``track_fix`` (the extra probe runs
    through the guest) change what the run asks of the model and the guest,
    so replay reads both from here; a header without them is level 0, off.
    """
    seed = getattr(model, "seed", None)
    return CassetteHeader(
        harness=Harness("rootbench", __version__),
        started_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        scenario=scenario_to_dict(scenario), spec_hash=scenario.spec_hash,
        image=sandbox, model=model.fingerprint(), agent=model.agent,
        protocol=ProtocolChoice(protocol.name, reason),
        options=SandboxOptions(opts.accel, opts.transport), round=round_,
        hint_level=hint_level, track_fix=opts.track_fix, rules=CURRENT_RULES,
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
    ).to_event()


@dataclass
class Machinery:
    """A scenario's sandbox or fleet, up: what an episode needs of it."""

    guest: Guest  # the one machine, or every machine as :class:`Machines` (the agent's first)
    killed_externally: Callable[[], bool]
    ready_s: float
    info: dict[str, Any]  # for the cassette header's ``image``


@contextlib.contextmanager
def machinery(scenario: Scenario, accel: str, transport: str,
              wrap: Callable[[Guest, str | None], Guest] | None = None) -> Iterator[Machinery]:
    """The scenario's machine (a :class:`Sandbox`), or its machines (a :class:`Fleet`), up.

    ``wrap(guest, machine)`` wraps each machine's guest (a recorder): ``machine``
    is None for the first, the one every single-machine run has, else its name.
    """
    wrap = wrap or (lambda g, _m: g)
    if not scenario.machines:
        with Sandbox(scenario.image, accel=accel, transport=transport) as box:
            yield Machinery(wrap(box.guest, None), box.killed_externally, box.info.ready_s,
                            box.info.to_dict())
        return
    with Fleet(scenario.machines, accel=accel, transport=transport) as fleet:
        guests = {name: wrap(g, None if i == 0 else name)
                  for i, (name, g) in enumerate(fleet.guests().items())}
        yield Machinery(Machines(guests, scenario.agent_machine), fleet.killed_externally,
                        fleet.ready_s, fleet.info())


def run_one(scenario: Scenario, model: Model, protocol: Protocol, reason: str,
            opts: RunOptions, cassette_path: Path, *, round_: int = 0,
            hint_level: int = 0) -> Episode:
    """One scenario in a fresh sandbox at ``hint_level``, recorded to ``cassette_path``.

    The sandbox's time to a ready guest (``SandboxInfo.ready_s``) becomes the
    episode's ``restore`` phase, so the verdict line holds every phase's time;
    a sandbox that never came up has no phases at all.
    """
    with CassetteWriter(cassette_path) as writer, contextlib.ExitStack() as stack:
        stack.callback(model.close)  # the agent's side ends with the episode, whatever ends it
        try:
            box = stack.enter_context(machinery(
                scenario, opts.accel, opts.transport,
                lambda g, machine: RecordingGuest(g, writer, machine)))
        except InfraError as exc:
            writer.write(header(scenario, model, protocol, reason, opts, round_, {},
                                hint_level=hint_level))
            ep = Episode.infra_error(scenario.id, model.agent, model.name, protocol.name,
                                     f"sandbox: {one_line(str(exc))}", round_=round_,
                                     hint_level=hint_level, cassette=str(cassette_path))
            writer.write({"type": "verdict", **ep.to_dict()})
            return ep
        writer.write(header(scenario, model, protocol, reason, opts, round_, box.info,
                            hint_level=hint_level))
        return run_episode(scenario, box.guest,
                           RecordingModel(model, writer), protocol, Clock(writer), writer,
                           vm_killed=box.killed_externally, round_=round_,
                           hint_level=hint_level, track_fix=opts.track_fix,
                           restore_seconds=box.ready_s)


@dataclass(frozen=True)
class EpisodeJob:
    """One episode of a bench, as data an executor can ship to wherever it runs it.

    ``cassette`` is where the driver keeps the cassette. With ``ship``, the
    worker is on another machine: it records to a temporary file of its own
    and returns the cassette's text, which the driver writes there.
    """

    scenario: Scenario
    model: Model
    protocol: str
    reason: str  # why this protocol, for the cassette header
    opts: RunOptions
    cassette: Path
    round: int = 0
    hint_level: int = 0
    arm: str | None = None  # the bench matrix cell (None in a bench of one)
    ship: bool = False

    def lost(self, why: str) -> Episode:
        """The episode's result when its worker died or was stopped: infra-error, never a loss."""
        return Episode.infra_error(self.scenario.id, self.model.agent, self.model.name,
                                   self.protocol, f"worker: {one_line(why)}", round_=self.round,
                                   hint_level=self.hint_level, arm=self.arm)


@dataclass(frozen=True)
class JobResult:
    """What a worker hands back: the episode and, when shipped, its cassette's text."""

    episode: Episode
    cassette_text: str | None = None


def run_job(job: EpisodeJob) -> JobResult:
    """Run ``job`` here (in the driver, a child process or a Ray worker) and time it."""
    started = time.time()
    protocol = get_protocol(job.protocol)
    text = None
    if job.ship:
        with tempfile.TemporaryDirectory(prefix="rootbench-cassette-") as tmp:
            local = Path(tmp) / job.cassette.name
            ep = run_one(job.scenario, job.model, protocol, job.reason, job.opts, local,
                         round_=job.round, hint_level=job.hint_level)
            if local.is_file():
                text = local.read_text(encoding="utf-8")
    else:
        ep = run_one(job.scenario, job.model, protocol, job.reason, job.opts, job.cassette,
                     round_=job.round, hint_level=job.hint_level)
    ep.cassette = str(job.cassette) if not job.ship or text is not None else None
    ep.arm, ep.started, ep.ended = job.arm, round(started, 3), round(time.time(), 3)
    return JobResult(ep, text)
