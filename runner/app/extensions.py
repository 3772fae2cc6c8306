"""Every extension point of rootbench, in one list: what a user picks by name, and where from.

Each entry is a :class:`~runner.core.registry.Registry` kept beside what it holds
(the layers import only downwards, so only the app can see them all). Help text,
docs and "unknown X, did you mean Y" come from these registries;
``tests/unit/test_registry.py`` holds the docs to them, so a probe kind, protocol,
model or executor added in code and not in the docs is a failing test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from runner.app.agent_api import installed_agents
from runner.app.executors import EXECUTORS
from runner.backends.llama import MODELS
from runner.core.probes import KINDS
from runner.core.protocol import PROTOCOLS
from runner.core.registry import Registry

# name -> the registry (agents are read when asked: an agent installed since is there)
EXTENSION_POINTS: Mapping[str, Callable[[], Registry[Any]]] = MappingProxyType({
    "probe kinds": lambda: KINDS,
    "protocols": lambda: PROTOCOLS,
    "models": lambda: MODELS,
    "executors": lambda: EXECUTORS,
    "agents": installed_agents,
})
