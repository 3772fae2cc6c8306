"""Who acts in a bench: a real model (served by us or already running), the oracle, noop, or an
agent of the user's (``--agent file.py:Class``, see :mod:`runner.app.agent_api`).

:class:`ModelProvider` owns the model server's lifecycle for a bench: it
builds and starts llama-server when a named model or GGUF file is asked
for (with one slot per episode that may run at once), restarts it if it dies
between scenarios, and stops it at the end.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from runner.app.agent_api import AgentRef, agent_name, agent_output_to_stderr, python_agent
from runner.backends.llama import (
    DEFAULT_CTX_SIZE,
    DEFAULT_MODEL,
    LlamaServer,
    ensure_llama_server,
    fetch_model,
    llama_fingerprint,
)
from runner.backends.openai import OpenAIModel
from runner.core.errors import InvalidInput
from runner.core.model import Model, noop, oracle
from runner.core.outcomes import AgentKind
from runner.core.protocol import Protocol, choose_protocol, get_protocol
from runner.core.spec import Scenario

log = logging.getLogger("rootbench.model")


@dataclass
class AgentChoice:
    """Which agent acts and, for a real model, where it comes from and how it samples."""

    kind: AgentKind = AgentKind.MODEL
    endpoint: str | None = None  # an OpenAI-compatible server already running
    model: str = DEFAULT_MODEL  # a named model (see `rootbench model fetch`)
    model_file: str | None = None  # any GGUF
    llama_server: str | None = None  # a llama-server binary of the user's
    temperature: float = 0.0
    seed: int = 0
    max_tokens: int = 512
    ctx_size: int = DEFAULT_CTX_SIZE
    agent_ref: AgentRef | None = None  # for AgentKind.PYTHON: where the agent class is

    def label(self) -> str:
        """What the run is called: the agent, or the model's name."""
        if self.kind is AgentKind.PYTHON and self.agent_ref is not None:
            return agent_name(self.agent_ref)
        if self.kind is not AgentKind.MODEL:
            return self.kind.value
        if self.model_file:
            return Path(self.model_file).stem
        return self.model


class ModelProvider:
    """Gives each episode its model; starts (and restarts) llama-server when needed."""

    def __init__(self, choice: AgentChoice, run_dir: Path, *, parallel: int = 1,
                 log_label: str | None = None) -> None:
        self.choice = choice
        self.run_dir = run_dir
        self.log_label = log_label
        self.parallel = parallel  # episodes at once: llama-server gets as many slots
        self._lock = threading.Lock()  # one restart at a time, whoever asks
        self._stack = contextlib.ExitStack()
        self._server: LlamaServer | None = None
        self._model: Model | None = None

    def __enter__(self) -> ModelProvider:
        if self.choice.kind is AgentKind.PYTHON:
            # The agent's prints (and its children's) are not rootbench's output: with
            # --format json stdout must stay one JSON document, written after the bench.
            self._stack.enter_context(agent_output_to_stderr())
        if self.choice.kind is not AgentKind.MODEL:
            return self
        c = self.choice
        if c.endpoint:
            log.info("using the server at %s; nothing is started", c.endpoint)
            self._model = OpenAIModel(c.endpoint, c.model, temperature=c.temperature, seed=c.seed,
                                      max_tokens=c.max_tokens)
            return self
        binary = ensure_llama_server(path=c.llama_server)
        model_path = Path(c.model_file) if c.model_file else fetch_model(c.model)
        if not model_path.is_file():
            raise InvalidInput("no such model file", path=str(model_path), field="--model-file")
        server_log = self.run_dir / "logs" / f"llama-server{self._log_suffix()}.log"
        log.info("starting llama-server with %s (%d slot%s of %d tokens)", model_path.name,
                 self.parallel, "" if self.parallel == 1 else "s", c.ctx_size)
        self._server = self._stack.enter_context(
            LlamaServer(binary, model_path, server_log, ctx_size=c.ctx_size, seed=c.seed,
                        parallel=self.parallel))
        extra = llama_fingerprint(self._server, binary, model_path)
        self._model = OpenAIModel(self._server.endpoint, c.label(), extra_fingerprint=extra,
                                  temperature=c.temperature, seed=c.seed, max_tokens=c.max_tokens)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _log_suffix(self) -> str:
        """``llama-server.log`` as always; ``llama-server-<model>.log`` when a matrix bench runs
        several models, so one server's log never mixes with another's."""
        return f"-{self.log_label}" if self.log_label else ""

    def protocol(self, requested: str) -> tuple[Protocol, str]:
        """The action protocol for this bench and, for the cassette, why."""
        if self.choice.kind is AgentKind.PYTHON:
            if requested not in ("auto", "tools"):
                raise InvalidInput("a Python agent acts through run() and finish(), recorded as "
                                   f"tool calls: --protocol {requested} does not apply",
                                   field="--protocol")
            return get_protocol("tools"), "a Python agent's actions are recorded as tool calls"
        if self.choice.kind is not AgentKind.MODEL:
            if requested != "auto":  # scripted agents answer in whatever protocol they are asked
                return get_protocol(requested), f"--protocol {requested}"
            return get_protocol("tools"), f"{self.choice.kind} agents speak native tool calls"
        assert self._model is not None
        return choose_protocol(self._model, requested=requested)

    def for_scenario(self, scenario: Scenario, round_: int = 0, protocol: str = "tools") -> Model:
        """The agent for one episode (scripted agents are made per scenario, speaking ``protocol``).

        A real model samples round ``r`` with seed ``seed + r``: with one seed
        for every round, rounds at a temperature above 0 would repeat each
        other and pass@k would measure nothing. The seed goes into the
        model's fingerprint, so each cassette header records its own.
        """
        if self.choice.kind is AgentKind.ORACLE:
            return oracle(list(scenario.solution), protocol)
        if self.choice.kind is AgentKind.NOOP:
            return noop(protocol)
        if self.choice.kind is AgentKind.PYTHON:
            assert self.choice.agent_ref is not None
            return python_agent(self.choice.agent_ref)  # a fresh agent (and thread) per episode
        with self._lock:
            if self._server is not None and not self._server.alive():
                log.warning("llama-server is down; restarting it for the next scenario")
                self._server.restart()
        assert self._model is not None
        if isinstance(self._model, OpenAIModel):
            # Each episode its own copy: episodes may run at once, each with its round's seed,
            # and a restarted server listens on a new port.
            endpoint = self._server.endpoint if self._server is not None else None
            return self._model.clone(seed=self.choice.seed + round_, endpoint=endpoint)
        return self._model
