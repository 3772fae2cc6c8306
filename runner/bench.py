"""Orchestration: many episodes, each in a fresh sandbox, results kept as they happen.

A bench is a run directory::

    runs/<stamp>-<agent>/
      run.json          what was asked (for --resume)
      results.json      every finished episode, rewritten atomically after each one
      results.xml       the same as JUnit XML
      cassettes/<scenario>.r<round>.jsonl
      logs/llama-server.log

One episode's infrastructure failure never stops the bench: it is recorded
as ``infra-error`` and the next scenario runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from runner import __version__
from runner.agent import Episode, clean_text, run_episode
from runner.cassette import (
    Cassette,
    CassetteWriter,
    Clock,
    RecordingGuest,
    RecordingModel,
    ReplayClock,
    ReplayGuest,
    ReplayModel,
)
from runner.errors import InfraError, InvalidInput
from runner.llama import DEFAULT_CTX_SIZE
from runner.model import Model, noop, oracle
from runner.protocol import Protocol, choose_protocol, get_protocol
from runner.report import load_results, write_results
from runner.spec import Budget, Probe, Scenario

Progress = Callable[[str], None]
DEFAULT_MODEL = "qwen2.5-coder-1.5b"


def stderr_progress(message: str) -> None:
    print(clean_text(message), file=sys.stderr, flush=True)


@dataclass
class AgentChoice:
    """Which agent acts: a real model (served or started), the oracle, or noop."""

    kind: str = "model"  # model | oracle | noop
    endpoint: str | None = None  # an OpenAI-compatible server already running
    model: str = DEFAULT_MODEL  # a named model (see `rootbench model fetch`)
    model_file: str | None = None  # any GGUF
    llama_server: str | None = None  # a llama-server binary of the user's
    temperature: float = 0.0
    seed: int = 0
    max_tokens: int = 512
    ctx_size: int = DEFAULT_CTX_SIZE

    def label(self) -> str:
        if self.kind != "model":
            return self.kind
        if self.model_file:
            return Path(self.model_file).stem
        return self.model


@dataclass
class RunOptions:
    accel: str = "auto"
    transport: str = "serial"
    protocol: str = "auto"
    repeat: int = 1


# --- scenarios in cassette headers ------------------------------------------------------

def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    return dataclasses.asdict(s)


def scenario_from_dict(d: dict[str, Any]) -> Scenario:
    """Rebuild the scenario a cassette was recorded with (replay needs no spec file)."""
    try:
        fields = dict(d)
        fields["budget"] = Budget(**fields["budget"])
        for key in ("probes", "invariants"):
            fields[key] = tuple(Probe(**p) for p in fields[key])
        for key in ("tags", "setup", "solution", "forbidden"):
            fields[key] = tuple(fields.get(key) or ())
        return Scenario(**fields)
    except (KeyError, TypeError) as exc:
        raise InvalidInput(f"the cassette's scenario is unreadable: {exc}",
                           field="header.scenario") from None


# --- models -----------------------------------------------------------------------------

class ModelProvider:
    """Gives each episode its model; starts (and restarts) llama-server when needed."""

    def __init__(self, choice: AgentChoice, run_dir: Path, progress: Progress) -> None:
        self.choice = choice
        self.run_dir = run_dir
        self.progress = progress
        self._stack = contextlib.ExitStack()
        self._server: Any = None
        self._model: Model | None = None

    def __enter__(self) -> ModelProvider:
        if self.choice.kind != "model":
            return self
        from runner.llama import LlamaServer, ensure_llama_server, fetch_model, llama_fingerprint
        from runner.model import OpenAIModel

        c = self.choice
        sampling = {"temperature": c.temperature, "seed": c.seed, "max_tokens": c.max_tokens}
        if c.endpoint:
            self.progress(f"[model] using the server at {c.endpoint}; nothing is started")
            self._model = OpenAIModel(c.endpoint, c.model, **sampling)
            return self
        binary = ensure_llama_server(self.progress, path=c.llama_server)
        model_path = Path(c.model_file) if c.model_file else fetch_model(c.model, self.progress)
        if not model_path.is_file():
            raise InvalidInput("no such model file", path=str(model_path), field="--model-file")
        log = self.run_dir / "logs" / "llama-server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.progress(f"[model] starting llama-server with {model_path.name}")
        self._server = self._stack.enter_context(
            LlamaServer(binary, model_path, log, ctx_size=c.ctx_size, seed=c.seed))
        extra = llama_fingerprint(self._server, binary, model_path)
        self._model = OpenAIModel(self._server.endpoint, c.label(), extra_fingerprint=extra,
                                  **sampling)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def protocol(self, requested: str) -> tuple[Protocol, str]:
        if self.choice.kind != "model":
            return get_protocol("tools"), f"{self.choice.kind} agents speak native tool calls"
        assert self._model is not None
        return choose_protocol(self._model, requested=requested)

    def for_scenario(self, scenario: Scenario) -> Model:
        if self.choice.kind == "oracle":
            return oracle(list(scenario.solution))
        if self.choice.kind == "noop":
            return noop()
        if self._server is not None and not self._server.alive():
            self.progress("[model] llama-server is down; restarting it for the next scenario")
            self._server.restart()
        assert self._model is not None
        return self._model


# --- one episode ------------------------------------------------------------------------

def _header(scenario: Scenario, model: Model, protocol: Protocol, reason: str,
            opts: RunOptions, round_: int, image: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "header", "format": 1,
        "harness": {"name": "rootbench", "version": __version__},
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "scenario": scenario_to_dict(scenario), "spec_hash": scenario.spec_hash,
        "image": image, "model": model.fingerprint(), "agent": model.kind,
        "protocol": {"name": protocol.name, "reason": reason},
        "options": {"accel": opts.accel, "transport": opts.transport}, "round": round_,
    }


def run_one(scenario: Scenario, model: Model, protocol: Protocol, reason: str,
            opts: RunOptions, cassette_path: Path, *, round_: int = 0,
            progress: Progress = stderr_progress) -> Episode:
    """One scenario in a fresh sandbox, recorded to ``cassette_path``."""
    from runner.vm import Sandbox

    with CassetteWriter(cassette_path) as writer, contextlib.ExitStack() as stack:
        try:
            box = stack.enter_context(Sandbox(scenario.image, accel=opts.accel,
                                              transport=opts.transport, progress=progress))
        except InfraError as exc:
            writer.write(_header(scenario, model, protocol, reason, opts, round_, {}))
            ep = Episode(scenario=scenario.id, agent=model.kind, model=model.name,
                         protocol=protocol.name, round=round_, verdict="infra-error",
                         stop="infra", reason=f"sandbox: {clean_text(str(exc))[:200]}",
                         cassette=str(cassette_path))
            writer.write({"type": "verdict", **ep.to_dict()})
            return ep
        writer.write(_header(scenario, model, protocol, reason, opts, round_, dict(box.info)))
        ep = run_episode(scenario, RecordingGuest(box.guest, writer), RecordingModel(model, writer),
                         protocol, Clock(writer), writer, log=progress,
                         vm_killed=box.killed_externally, round_=round_)
    return ep


# --- a bench ----------------------------------------------------------------------------

class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; ``code`` is the exit status to use (130 or 143)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"interrupted (exit {code})")
        self.code = code


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM into an exception so every ``with`` block tears down."""
    def handler(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(143 if signum == signal.SIGTERM else 130)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def new_run_dir(base: Path, label: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = base / f"{stamp}-{label}"
    n = 1
    while path.exists():
        n += 1
        path = base / f"{stamp}-{label}-{n}"
    path.mkdir(parents=True)
    return path


def _prepare_sandboxes(images: list[str], opts: RunOptions, progress: Progress) -> None:
    """Build each image and its golden snapshot before the model server starts.

    On a fresh machine this is minutes of work: done here, it shows as set-up
    rather than inside the first scenario, and llama-server does not sit idle
    meanwhile. One sandbox is started and stopped per image. If that fails,
    the bench still goes on: each scenario tries again and reports infra-error.
    """
    from runner.vm import Sandbox

    for image in images:
        try:
            with Sandbox(image, accel=opts.accel, transport=opts.transport, progress=progress) as box:
                how = "restored from its snapshot" if box.info["restored"] else "cold boot"
                progress(f"[bench] sandbox {image} ready in {box.info['ready_s']:.2f}s "
                         f"({box.info['accel']}, {how})")
        except InfraError as exc:
            progress(f"[bench] the sandbox {image} could not start ({clean_text(str(exc))[:200]}); "
                     "each scenario will try again")


def run_bench(scenarios: list[Scenario], choice: AgentChoice, opts: RunOptions, run_dir: Path,
              *, resume: bool = False, retry_infra: int = 0, record_to: Path | None = None,
              progress: Progress = stderr_progress) -> list[Episode]:
    """Run every scenario ``opts.repeat`` times; results are on disk after each one."""
    from runner.report import atomic_write

    run_dir.mkdir(parents=True, exist_ok=True)
    info = {"agent": dataclasses.asdict(choice), "options": dataclasses.asdict(opts),
            "scenarios": [s.path for s in scenarios], "harness": __version__}
    _, done = load_results(run_dir) if resume else ({}, [])
    if not resume:
        atomic_write(run_dir / "run.json", json.dumps(info, indent=2) + "\n")
    episodes: dict[tuple[str, int], Episode] = {(e.scenario, e.round): e for e in done}
    wanted = [(s, r) for r in range(opts.repeat) for s in scenarios]

    def save() -> None:
        order = {key: i for i, key in enumerate((s.id, r) for s, r in wanted)}
        ordered = sorted(episodes.values(), key=lambda e: order.get((e.scenario, e.round), 1 << 30))
        write_results(run_dir, info, ordered)

    with _signals_raise():
        _prepare_sandboxes(sorted({s.image for s, r in wanted if (s.id, r) not in episodes}),
                           opts, progress)
    with _signals_raise(), ModelProvider(choice, run_dir, progress) as provider:
        protocol, reason = provider.protocol(opts.protocol)
        progress(f"[bench] protocol {protocol.name}: {reason}")
        for attempt in range(retry_infra + 1):
            todo = [(s, r) for s, r in wanted
                    if (s.id, r) not in episodes or
                    (attempt > 0 or resume) and episodes[(s.id, r)].verdict == "infra-error"
                    and attempt <= retry_infra]
            if attempt > 0 and not todo:
                break
            if attempt > 0:
                progress(f"[bench] retrying {len(todo)} infra-error run(s), try {attempt}")
            for i, (s, r) in enumerate(todo, 1):
                tag = f"{s.id}" + (f" (round {r + 1})" if opts.repeat > 1 else "")
                progress(f"[bench] {i}/{len(todo)} {tag}")
                cassette = run_dir / "cassettes" / f"{s.id}.r{r}.jsonl"
                ep = run_one(s, provider.for_scenario(s), protocol, reason, opts, cassette,
                             round_=r, progress=progress)
                episodes[(s.id, r)] = ep
                save()
                if record_to is not None:
                    record_to.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(cassette, record_to / cassette.name)
                progress(f"[bench] {tag}: {ep.verdict} in {ep.seconds:.1f}s"
                         + (f" ({clean_text(ep.reason)[:120]})" if ep.verdict != "pass" else ""))
        save()
    return sorted(episodes.values(), key=lambda e: (e.round, [s.id for s in scenarios].index(e.scenario)
                                                    if e.scenario in [s.id for s in scenarios] else 0))


# --- replay -----------------------------------------------------------------------------

@dataclass
class ReplayOutcome:
    cassette: str
    scenario: str
    recorded: str
    replayed: str
    same: bool
    note: str
    seconds: float
    turns: int


def replay_one(path: Path, *, offline: bool, lenient: bool = False, accel: str = "auto",
               transport: str = "serial", progress: Progress = stderr_progress) -> ReplayOutcome:
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
        from runner.vm import Sandbox

        with Sandbox(scenario.image, accel=accel, transport=transport, progress=progress) as box:
            ep = run_episode(scenario, box.guest, model, protocol, Clock(), None,
                             vm_killed=box.killed_externally)
    rec = cas.verdict
    recorded = rec.get("verdict", "?") + (f" [{','.join(rec['flags'])}]" if rec.get("flags") else "")
    replayed = ep.verdict + (f" [{','.join(ep.flags)}]" if ep.flags else "")
    note = ep.reason if recorded != replayed else ("; ".join(model.mismatches)[:200] or "")
    return ReplayOutcome(str(path), scenario.id, recorded, replayed, recorded == replayed,
                         clean_text(note), ep.seconds, ep.turns)
