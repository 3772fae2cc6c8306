"""Before a bench: who acts, which model server, which executor, and everything refused first.

``run`` and ``bench`` share one set-up. Every agent flag is checked before
any work is done (no image build, no VM, no model server): the agent (a
built-in one, or a user's class imported now), the models, the endpoint's
form, the sampling numbers, the Ray cluster. Then, just before the bench,
every path it writes is checked writable and the endpoint is asked once
whether it answers (:func:`preflight`); the executor is chosen last, so a
Ray cluster that cannot be joined leaves no empty run directory behind
(:func:`run`). The command line only turns its arguments into
:class:`BenchFlags` and prints what :func:`run` returns.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from runner.app import html_report
from runner.app.agent_api import BUILTIN as BUILTIN_AGENTS
from runner.app.agent_api import AgentRef
from runner.app.agent_api import resolve as resolve_agent
from runner.app.agents import AgentChoice
from runner.app.bench import check_bench, run_bench
from runner.app.cliparse import check_range, parse_jobs
from runner.app.episodes import RunOptions
from runner.app.executors import MAX_JOBS, Executor, ExecutorKind, auto_jobs, make_local
from runner.app.outputs import check_dir_target
from runner.app.plan import Arm, matrix
from runner.app.ray_executor import JOIN_TIMEOUT, RayExecutor, reachable, resolve_auto
from runner.app.runs import load_results, new_run_dir
from runner.backends.cachedir import cache_root
from runner.backends.llama import (
    DEFAULT_CTX_SIZE,
    DEFAULT_MODEL,
    MODEL_FILE_HINT,
    MODELS,
    model_threads,
)
from runner.backends.openai import check_endpoint, check_reachable, server_props
from runner.backends.process import guest_nice
from runner.core import layout
from runner.core.cassette import RecordMode
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.outcomes import AgentKind
from runner.core.spec import Scenario

MAX_SEED = 2 ** 32 - 2  # llama-server's seeds are 32-bit; 2**32 - 1 asks it for a random one
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable for the cluster to use
REACH_TIMEOUT = 5.0  # seconds an --endpoint has to answer before any work starts
log = logging.getLogger("rootbench.bench")


@dataclass
class BenchFlags:
    """What ``run`` and ``bench`` were asked; see their ``--help`` for each.

    Not frozen: ``ray_address`` is resolved once (``auto`` to the cluster's
    ``HOST:PORT``), and later checks of the same flags reuse what it came to.
    """

    agent: str = "model"
    model: list[str] | None = None
    model_file: str | None = None
    endpoint: str | None = None
    llama_server: str | None = None
    protocol: list[str] | None = None
    temperature: float = 0.0
    seed: int = 0
    max_tokens: int = 512
    ctx_size: int = DEFAULT_CTX_SIZE
    repeat: int = 1
    hints: list[int] | None = None
    ladder: bool = False
    track_fix: bool = True
    runs_dir: str = "runs"
    jobs: str | None = None
    executor: str = ExecutorKind.LOCAL.value
    ray_address: str | None = None
    ray_timeout: float | None = None
    record_to: str | None = None
    record_mode: str = RecordMode.ALL.value
    accel: str = "auto"
    transport: str = "serial"
    retry_infra: int = 0


def resumed(name: str | None) -> Path | None:
    """``--resume RUNDIR``: a run directory (its run.json there) whose results file reads, so a
    damaged one is reported before anything runs; None without ``--resume``."""
    if not name:
        return None
    resume = Path(name)
    if not (resume / layout.RUN_INFO).is_file():
        raise InvalidInput("not a run directory (no run.json)", path=str(resume),
                           field="--resume")
    load_results(resume)
    return resume


def ray_address(flags: BenchFlags) -> str | None:
    """``--executor ray``: Ray installed and its head answering, checked before any VM starts.

    The address is ``--ray-address``, else the ``RAY_ADDRESS`` environment
    variable (as for Ray's own tools); ``auto`` is resolved by Ray itself
    (:func:`~runner.app.ray_executor.resolve_auto`). The ``HOST:PORT`` it comes to is then checked to answer.
    """
    given = flags.ray_address or os.environ.get(RAY_ADDRESS_ENV) or None
    if flags.executor != ExecutorKind.RAY.value:
        for flag, value in (("--ray-address", flags.ray_address),
                            ("--ray-timeout", flags.ray_timeout)):
            if value not in (None, ""):
                raise InvalidInput(f"{flag} is for --executor ray", field=flag)
        return None
    if flags.ray_timeout is not None:
        check_range(flags.ray_timeout, "--ray-timeout", 1, 3600)
    if not given:
        raise InvalidInput("--executor ray needs --ray-address HOST:PORT (the head's address) "
                           f"or auto (the cluster running on this machine), or {RAY_ADDRESS_ENV}",
                           field="--ray-address")
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a broken or blocked install is no install
        found = False
    if not found:
        raise InvalidInput("Ray is not installed: pip install 'rootbench[ray]'", field="--executor")
    if given.strip().lower() == "auto":
        address = resolve_auto(RAY_ADDRESS_ENV)
        log.info("--ray-address auto: %s", address)
    else:
        address = given
    reachable(address)
    flags.ray_address = address  # resolved once: later checks of the same flags reuse it
    return address


def agent_choices(flags: BenchFlags) -> list[AgentChoice]:
    """The agent flags, checked before any work is done (no image build, no VM, no server):
    one choice per ``--model`` (a matrix when there are several)."""
    agent, agent_ref = agent_kind(flags)
    models = _models(flags, agent)
    if flags.llama_server is not None:
        binary = Path(flags.llama_server)
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise InvalidInput("not an executable file", path=flags.llama_server,
                               field="--llama-server")
    _check_sampling(flags)
    if flags.record_mode != RecordMode.ALL.value and not flags.record_to:
        raise InvalidInput(f"--record-mode {flags.record_mode} needs --record-to DIR",
                           field="--record-mode")
    parse_jobs(flags.jobs)
    ray_address(flags)
    cache_root()  # a cache that cannot be used is bad input too, found before any work
    return [AgentChoice(kind=agent, endpoint=flags.endpoint, model=model,
                        model_file=flags.model_file, llama_server=flags.llama_server,
                        temperature=flags.temperature, seed=flags.seed,
                        max_tokens=flags.max_tokens, ctx_size=flags.ctx_size,
                        agent_ref=agent_ref) for model in models]


def _models(flags: BenchFlags, agent: AgentKind) -> list[str]:
    """The models the flags name, each known (or served by a file or an endpoint of the
    user's); scripted agents have no model, so they get one arm per protocol."""
    models: list[str] = flags.model or [DEFAULT_MODEL]
    if flags.endpoint is not None:
        check_endpoint(flags.endpoint)  # its form here; whether it answers, just before any work
    if flags.model_file is not None:
        if not Path(flags.model_file).is_file():
            raise InvalidInput("no such file", path=flags.model_file, field="--model-file")
        if len(models) > 1:
            raise InvalidInput("--model-file is one model: give it alone, or several --model",
                               field="--model-file")
    elif agent is AgentKind.MODEL and flags.endpoint is None:
        for model in models:
            MODELS.get_or_refuse(model, hint=MODEL_FILE_HINT)
    if agent is not AgentKind.MODEL:
        models = models[:1]  # scripted agents have no model: one arm per protocol
    return models


def _check_sampling(flags: BenchFlags) -> None:
    """The numbers: temperature, tokens, context, rounds and their seeds, hints, retries."""
    check_range(flags.temperature, "--temperature", 0, 2)
    check_range(flags.max_tokens, "--max-tokens", 1, 1 << 20)
    check_range(flags.ctx_size, "--ctx-size", 512, 1 << 22)
    check_range(flags.repeat, "--repeat", 1, 10_000)
    # Round r samples with seed SEED+r; llama-server's seed is 32 bits and its largest value
    # (0xFFFFFFFF) means "random", so every round's seed must be below it.
    top = MAX_SEED - (flags.repeat - 1 if 1 <= flags.repeat <= 10_000 else 0)
    if not 0 <= flags.seed <= top:
        rounds = f"; with --repeat {flags.repeat} (seeds SEED to SEED+{flags.repeat - 1}) at " \
                 f"most {top}" if top != MAX_SEED else ""
        raise InvalidInput(f"must be a number from 0 to {MAX_SEED} (llama-server's seeds are "
                           f"32-bit; {MAX_SEED + 1} asks it for a random one){rounds}, not "
                           f"{flags.seed}", field="--seed")
    for hints in flags.hints or [0]:
        check_range(hints, "--hints", 0, 100)
    if flags.ladder and any(flags.hints or []):
        raise InvalidInput("--ladder climbs the hint levels itself: give --ladder or --hints K, "
                           "not both", field="--ladder")
    check_range(flags.retry_infra, "--retry-infra", 0, 100)


def agent_kind(flags: BenchFlags) -> tuple[AgentKind, AgentRef | None]:
    """``--agent``: a built-in agent, or a user's agent class (imported now, so a missing file or
    name is one line and exit 2 before any VM starts)."""
    if flags.agent in BUILTIN_AGENTS:
        return AgentKind(flags.agent), None
    ref = resolve_agent(flags.agent)
    for protocol in flags.protocol or []:
        if protocol not in ("auto", "tools"):
            raise InvalidInput(f"a Python agent's actions are recorded as tool calls: --protocol "
                               f"{protocol} does not apply", field="--protocol")
    return AgentKind.PYTHON, ref


def server_slots(choices: list[AgentChoice]) -> int | None:
    """An ``--endpoint`` server's parallel slots, if it says (llama-server's /props); else None."""
    endpoint = next((c.endpoint for c in choices if c.kind is AgentKind.MODEL and c.endpoint), None)
    if endpoint is None:
        return None
    slots = server_props(endpoint, timeout=3).get("total_slots")  # {} unless a JSON object
    if isinstance(slots, int) and not isinstance(slots, bool) and 0 < slots <= MAX_JOBS:
        return slots
    return None


def executor_for(flags: BenchFlags, choices: list[AgentChoice]) -> Executor:
    """The executor the flags ask for; ``--jobs auto`` sized here and said in one line."""
    jobs = parse_jobs(flags.jobs)
    address = ray_address(flags)
    if address is not None:
        return RayExecutor(address, max_jobs=jobs if flags.jobs is not None else None,
                           join_timeout=flags.ray_timeout or JOIN_TIMEOUT)
    if jobs is None:
        serving = [c for c in choices if c.kind is AgentKind.MODEL and not c.endpoint]
        reserve = max((model_mib(c) for c in serving), default=0)
        jobs, why = auto_jobs(server_slots=server_slots(choices), reserve_mib=reserve,
                              model_threads=model_threads() if serving else 0)
        log.info("--jobs auto: %s", why)
    return make_local(jobs)


def model_mib(choice: AgentChoice) -> int:
    """What a llama-server of this model holds in memory, roughly: the GGUF file, plus room."""
    size = (Path(choice.model_file).stat().st_size if choice.model_file
            else MODELS[choice.model].size)
    return size // (1 << 20) + 512


def preflight(flags: BenchFlags, choices: list[AgentChoice], scenarios: list[Scenario],
              arms: list[Arm], opts: RunOptions, resume: Path | None) -> None:
    """Everything a bench could be refused for, before any work: no run directory is made, no
    VM restored, no model asked until every path it writes is writable, a resume matches its
    run, every recording ``--record-mode none`` needs is there, and the endpoint answers."""
    guest_nice()  # $ROOTBENCH_GUEST_NICE is read by every VM start: a bad one is refused here
    model_threads()  # and $ROOTBENCH_MODEL_THREADS by every llama-server start
    if resume is not None:
        check_dir_target(resume, "--resume")
    else:
        check_dir_target(Path(flags.runs_dir), "--runs-dir")
    record_to = Path(flags.record_to) if flags.record_to else None
    if record_to is not None:
        check_dir_target(record_to, "--record-to")
    check_bench(scenarios, arms, opts, resume=resume, record_to=record_to,
                record_mode=RecordMode(flags.record_mode))
    if flags.record_mode != RecordMode.NONE.value:  # none replays only: no server is asked
        for endpoint in dict.fromkeys(c.endpoint for c in choices
                                      if c.kind is AgentKind.MODEL and c.endpoint):
            check_reachable(endpoint, REACH_TIMEOUT)


def run(flags: BenchFlags, scenarios: list[Scenario],
        resume: Path | None) -> tuple[list[Episode], Path]:
    """The bench the flags ask for, set up and refused (or not) before any work; its episodes
    and its run directory (``resume``'s, or a new one under ``--runs-dir``)."""
    choices = agent_choices(flags)
    arms = matrix(choices, flags.protocol or ["auto"], flags.hints or [0])
    opts = RunOptions(accel=flags.accel, transport=flags.transport, protocol=arms[0].protocol,
                      repeat=flags.repeat, hints=arms[0].hints, ladder=flags.ladder,
                      track_fix=flags.track_fix)
    preflight(flags, choices, scenarios, arms, opts, resume)
    label = choices[0].label() if len(arms) == 1 else "-".join(
        dict.fromkeys(c.label() for c in choices)) + "-matrix"
    # The executor first: a Ray cluster that cannot be joined leaves no empty run directory.
    with executor_for(flags, choices) as executor:
        run_dir = resume or new_run_dir(Path(flags.runs_dir), label)
        log.info("run directory: %s", run_dir)
        if executor.slots > 1:
            log.info("%d episodes at once (%s)", executor.slots, flags.executor)
        episodes = run_bench(scenarios, choices[0], opts, run_dir, resume=resume is not None,
                             retry_infra=flags.retry_infra,
                             record_to=Path(flags.record_to) if flags.record_to else None,
                             record_mode=RecordMode(flags.record_mode), arms=arms,
                             executor=executor,
                             listeners=[html_report.Refresher(run_dir, log)])
    return episodes, run_dir


def tell_where(run_dir: Path) -> None:
    """The results file and the HTML report of a finished bench, as progress lines (with
    ``--format json`` stdout stays one JSON document); the report last: what a person opens."""
    log.info("results: %s", run_dir / layout.RESULTS)
    if (run_dir / html_report.REPORT_NAME).is_file():
        log.info("report: %s", (run_dir / html_report.REPORT_NAME).resolve())
