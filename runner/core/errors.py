"""The exception tree: one root, two branches the user must tell apart (and a replay's own).

Every failure the harness raises falls in exactly one branch, because each
means something different to the user:

* ``InvalidInput``: the user's input (a spec, a recipe, a flag) is wrong.
  The CLI prints one line naming the file and field and exits 2.
* ``InfraError``: the machinery broke (QEMU died, the model server reset).
  A scenario that hits it is ``infra-error``, never a model failure.

The third outcome, "the scenario failed", is not an exception: it is a
:class:`~runner.core.outcomes.Verdict` (``fail``, or ``invalid-scenario``
when the scenario's own fault did not land).

``ReplayMismatch`` stands apart too: a replayed run diverged from its
cassette. That is neither bad input nor broken machinery, and never a
verdict: the replayer reports it as the outcome ``mismatch``.

``ContextExhausted`` stands apart: the model's own conversation outgrew its
context window. Nothing broke; the agent simply cannot go on, so its run ends
there and is judged on the machine as it stands.
"""

from __future__ import annotations

from typing import Any


class RootbenchError(Exception):
    """Root of every error rootbench raises on purpose."""


class InvalidInput(RootbenchError):
    """Bad user input. ``str()`` is the one line the CLI prints."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.detail = message
        where = ""
        if path:
            where = f"{path}:{line}: " if line else f"{path}: "
        if field:
            where += f"{field}: "
        super().__init__(f"{where}{message}")


class InfraError(RootbenchError):
    """The VM, the guest channel or the model server broke."""


class VMError(InfraError):
    """QEMU could not start, died, or stopped answering."""


class GuestDown(InfraError):
    """The guest stopped answering on its channel (it may have been shut down by the agent)."""


class ModelServerError(InfraError):
    """The model server failed in a way retrying did not fix.

    ``attempts`` lists the failed tries before this one, so the cassette
    shows what was retried. ``out_of_time`` says the call used up all the
    time it was given: when that time was what was left of the scenario's
    budget, the model was slow, not the server broken.
    """

    def __init__(self, message: str, *, attempts: list[dict[str, Any]] | None = None,
                 out_of_time: bool = False) -> None:
        super().__init__(message)
        self.attempts: list[dict[str, Any]] = list(attempts or [])
        self.out_of_time = out_of_time


class AgentInputError(RootbenchError, ValueError):
    """An outside agent sent a value it may not (see :mod:`runner.core.agent_input`).

    Neither bad user input nor broken machinery: the agent's own mistake,
    answered to the agent as an error reply (``str()`` is that one line)
    while its episode goes on. A ``ValueError`` too, so an agent's own
    ``except ValueError`` catches it.
    """


class ContextExhausted(RootbenchError):
    """The conversation no longer fits the model's context window (the agent's limit, not ours).

    ``attempts`` is as for ``ModelServerError``.
    """

    def __init__(self, message: str, *, attempts: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.attempts: list[dict[str, Any]] = list(attempts or [])


class ReplayMismatch(RootbenchError):
    """A replayed run asked for something the cassette does not hold: the run diverged.

    Not an ``InfraError``, on purpose: nothing broke, the code or the
    cassette changed. Were it an ``InfraError``, ``run_episode`` would turn
    it into verdict ``infra-error``, and a cassette recorded as
    ``infra-error`` would then replay as "same" however far the run strayed.
    It passes through ``run_episode`` untouched, and the replayer reports it
    as its own outcome (``mismatch``), naming the turn or guest exchange and
    the first field that differs.
    """
