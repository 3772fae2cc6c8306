"""``--agent path/to/file.py:Name``, ``--agent package.module:Name`` or an installed agent's name.

Finds the user's agent class (:class:`runner.core.agent_api.Agent`), checks it
before any work is done (one line, exit 2, when the file, the module or the
name is missing or is not an agent), and makes the episode's model from it:
a :class:`~runner.core.agent_api.ThreadAgentModel`, so the agent drives the
bundled loop and its cassette replays without it.

Installed agents register under the entry-point group ``rootbench.agents``
(``[project.entry-points."rootbench.agents"] myagent = "mypkg.agent:MyAgent"``)
and are named by their entry-point name.

Loading a file runs its top-level code, as ``python file.py`` would: the
user asked for exactly that. What is guarded is the harness: any exception
(or ``SystemExit``) while importing is reported as bad input, not a traceback.

What the agent prints is not rootbench's output: while it is imported and
while a bench of it runs (:func:`agent_output_to_stderr`, entered by the
model provider), descriptor 1 is descriptor 2, so ``--format json`` stays one
JSON document on stdout however the agent writes (``print``, ``os.write(1)``,
a child process). And what the agent starts ends with its episode
(:class:`PythonAgentModel`): a process it forks gets the default signal
dispositions back (rootbench's SIGTERM handler would keep it alive) and dies
with the agent's thread, and when the agent's part of the episode is over
every child of that thread is killed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from runner.backends.process import die_with_parent
from runner.core.agent_api import Agent, ThreadAgentModel
from runner.core.errors import InvalidInput
from runner.core.registry import Registry
from runner.core.text import one_line

GROUP = "rootbench.agents"  # the entry-point group installed agents register under
BUILTIN = ("model", "oracle", "noop")  # the --agent values that are not a user's agent
FIELD = "--agent"
log = logging.getLogger("rootbench.agent")


@dataclass(frozen=True)
class AgentRef:
    """Where an agent class is: a file or a module, and the attribute. Picklable: an episode
    job carries this, and its worker (maybe another process) imports the class itself."""

    attr: str
    path: str | None = None  # absolute path of the file, for a file agent
    module: str | None = None  # dotted module, for a module or entry-point agent
    shown: str = ""  # the file relative to the working directory, or the module
    sha256: str | None = None  # of the file the class comes from, when there is one
    entry_point: str | None = None  # the name it was installed under, if any

    def __call__(self) -> type[Agent]:
        """The agent class (imported afresh in a new process; once per process otherwise)."""
        return _load(self)

    def identity(self) -> dict[str, Any]:
        """What the cassette header's ``model`` records about the agent."""
        out: dict[str, Any] = {"source": self.shown, "class": self.attr, "sha256": self.sha256}
        if self.entry_point:
            out["entry_point"] = self.entry_point
        return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _shown(path: Path) -> str:
    """The file relative to the working directory when it is under it (cassettes travel)."""
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def resolve(value: str) -> AgentRef:
    """Check ``value`` names an agent class and say where it is; InvalidInput otherwise."""
    value = value.strip()
    if ":" not in value:
        return _entry_point(value)
    where, _, attr = value.rpartition(":")
    if not attr.isidentifier() or not where:
        raise InvalidInput(f"{value!r} is not FILE.py:Class, package.module:Class or the name "
                           "of an installed agent", field=FIELD)
    if where.endswith(".py") or "/" in where or os.sep in where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise InvalidInput("no such file", path=where, field=FIELD)
        path = path.resolve()
        ref = AgentRef(attr, path=str(path), shown=_shown(path), sha256=_sha256(path))
    else:
        ref = AgentRef(attr, module=where, shown=where)
    _load(ref)  # the checks: importable, the name exists, it is an agent class
    if ref.module is not None:
        origin = getattr(sys.modules.get(ref.module), "__file__", None)
        if origin and Path(origin).is_file():
            ref = AgentRef(attr, module=where, shown=where, sha256=_sha256(Path(origin)))
    return ref


def installed_agents() -> Registry[str]:
    """The ``--agent`` names: the built-in agents, then every installed one (the entry points
    of :data:`GROUP`, read now: a package installed since is there), each to where it lives."""
    found = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    return Registry("agent", FIELD, {**{b: "built in" for b in BUILTIN}, **found})


def _entry_point(name: str) -> AgentRef:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        raise installed_agents().unknown(
            name, hint=", FILE.py:Class or package.module:Class (installed agents register "
                       f"in the entry-point group {GROUP})")
    module, _, attr = found[0].value.partition(":")
    ref = AgentRef(attr.strip(), module=module.strip(), shown=module.strip(), entry_point=name)
    _load(ref)
    origin = getattr(sys.modules.get(ref.module or ""), "__file__", None)
    if origin and Path(origin).is_file():
        ref = AgentRef(ref.attr, module=ref.module, shown=ref.shown,
                       sha256=_sha256(Path(origin)), entry_point=name)
    return ref


def _import(ref: AgentRef) -> Any:
    """The module ``ref`` points into; any failure while importing is bad input."""
    where = ref.shown or ref.path or ref.module or "?"
    try:
        if ref.module is not None:
            with agent_output_to_stderr():
                return importlib.import_module(ref.module)
        assert ref.path is not None
        name = f"rootbench_agent_{hashlib.sha256(ref.path.encode()).hexdigest()[:16]}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, ref.path)
        if spec is None or spec.loader is None:
            raise InvalidInput("not a Python file", path=where, field=FIELD)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            with agent_output_to_stderr():  # its top-level prints are not our output
                spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    except InvalidInput:
        raise
    except ModuleNotFoundError as exc:
        raise InvalidInput(f"cannot import: {one_line(str(exc))}", path=where, field=FIELD) from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's file: any failure is bad input
        raise InvalidInput(f"importing it raised {type(exc).__name__}: {one_line(str(exc))}",
                           path=where, field=FIELD) from None


def _load(ref: AgentRef) -> type[Agent]:
    module = _import(ref)
    where = ref.shown or ref.path or ref.module or "?"
    obj = getattr(module, ref.attr, None)
    if obj is None:
        raise InvalidInput(f"no {ref.attr!r} in it", path=where, field=FIELD)
    if not isinstance(obj, type) or not callable(getattr(obj, "solve", None)):
        raise InvalidInput(f"{ref.attr!r} is not an agent: a class with a "
                           "solve(self, task, shell) method", path=where, field=FIELD)
    return obj


def agent_name(ref: AgentRef) -> str:
    """The agent's name in tables and cassettes: its ``name`` attribute, else the entry point's
    name, else the class name."""
    name = getattr(_load(ref), "name", None)
    if isinstance(name, str) and name.strip():
        return one_line(name, 60)
    return ref.entry_point or ref.attr


@contextlib.contextmanager
def agent_output_to_stderr() -> Iterator[None]:
    """Within the block, ``sys.stdout`` is ``sys.stderr`` and descriptor 1 is descriptor 2:
    whatever writes to stdout (``print``, ``os.write(1, ...)``, a child process started
    meanwhile, which inherits the descriptor) reaches stderr.

    Both, because an agent's children and C code write to the descriptor, and ``print`` writes
    to ``sys.stdout`` wherever that points. rootbench's own stdout (the table, ``--format
    json``) is written after the block, to the real stdout again. Nested blocks are fine;
    without a descriptor 1 or 2 only ``sys.stdout`` is redirected.
    """
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    saved: int | None = None
    with contextlib.suppress(OSError):
        saved = os.dup(1)
        try:
            os.dup2(2, 1)
        except OSError:
            os.close(saved)
            saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            with contextlib.suppress(Exception):
                sys.stdout.flush()  # what the agent printed goes where it was sent: stderr
            os.dup2(saved, 1)
            os.close(saved)


_ON_AGENT_THREAD = threading.local()  # .model: set on a Python agent's own thread


def _forked_on_agent_thread() -> None:
    """``os.register_at_fork`` (in the child): a process the agent forked gets SIGTERM, SIGINT
    and SIGHUP back to their defaults (rootbench's handler, inherited, turned SIGTERM into an
    exception its copy of the agent swallowed) and dies with the thread that forked it."""
    if getattr(_ON_AGENT_THREAD, "model", None) is None:
        return
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(s, signal.SIG_DFL)
    die_with_parent()


os.register_at_fork(after_in_child=_forked_on_agent_thread)


def thread_children(tid: int) -> list[int]:
    """The processes that thread ``tid`` of this process started (forked or spawned) and that
    still run; empty when the thread is gone or the kernel does not say."""
    try:
        with open(f"/proc/self/task/{tid}/children", encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def end_children(tid: int) -> list[int]:
    """SIGKILL every child of thread ``tid`` (and the process group of one that leads its own),
    reap them, and say which were ended."""
    ended = thread_children(tid)
    for pid in ended:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:  # it made a group of its own (setsid): all of it goes
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in ended:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)  # SIGKILL is not refused: this returns at once
    return ended


class PythonAgentModel(ThreadAgentModel):
    """A Python agent's model (see :class:`~runner.core.agent_api.ThreadAgentModel`) whose
    processes end with it: what its thread starts is killed when its part of the episode is
    over, or when the thread returns."""

    _RUNTIME = (*ThreadAgentModel._RUNTIME, "_tid")
    _tid: int | None = None  # the agent thread's kernel id, once it runs

    @contextlib.contextmanager
    def _on_thread(self) -> Iterator[None]:
        _ON_AGENT_THREAD.model = self
        self._tid = threading.get_native_id()
        try:
            yield
        finally:
            self._end_children()

    def agent_thread(self) -> contextlib.AbstractContextManager[None]:
        return self._on_thread()

    def agent_over(self) -> None:
        self._end_children()

    def _end_children(self) -> None:
        if self._tid is not None and os.getpid() == self._pid:
            ended = end_children(self._tid)
            if ended:
                log.info("ended %d process%s the agent %s started: %s", len(ended),
                         "" if len(ended) == 1 else "es", self.name,
                         " ".join(map(str, ended)))


def python_agent(ref: AgentRef) -> PythonAgentModel:
    """The model for one episode: the agent class ``ref`` names, on its own thread."""
    return PythonAgentModel(ref, agent_name(ref), ref.identity())
