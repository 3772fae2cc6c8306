"""The guest: a root shell inside the VM, seen through one small interface.

The agent loop, the probes and the replayer all talk to a :class:`Guest`.
The real transports (serial console, SSH) live in ``runner.backends``; the
replayed guest in :mod:`runner.core.replay`. Everything above this interface
is the same code whichever answers it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandResult:
    """What one command did. ``exit_code`` is None when it was killed at its timeout."""

    exit_code: int | None
    output: str  # stdout and stderr, merged, decoded (invalid UTF-8 replaced)
    duration: float  # seconds, host-side
    timed_out: bool = False
    truncated: bool = False  # output was cut at the caller's output_limit


@dataclass(frozen=True)
class HttpResult:
    """One HTTP GET made from the host through a forwarded port."""

    status: int | None  # None when no HTTP answer came at all
    body: str
    error: str | None = None  # why there was no answer
    duration: float = 0.0


@dataclass(frozen=True)
class RebootResult:
    """A reboot the guest came back from.

    ``clean`` says whether the guest shut down by itself (``systemctl reboot``)
    or had to be reset from outside after it did not within its grace time;
    ``seconds`` is the host's time from the request to a guest that answers
    again, clock set and boot finished.
    """

    clean: bool
    seconds: float


class Guest(abc.ABC):
    """A root shell in the VM.

    ``exec`` is the agent's channel: state (cwd, variables) persists between
    calls, as in a real login. ``run_clean`` runs in a fresh, clean channel
    with a fixed PATH and no aliases, so nothing the agent defined can fool a
    probe or the fault's setup.

    What an implementation may raise, and nothing else (as Inspect's sandbox
    interface states its own): a command that fails, times out or prints too
    much is a :class:`CommandResult` saying so, never an exception;
    :class:`~runner.core.errors.GuestDown` when the channel itself is gone (the
    VM stopped, the shell died: the run ends ``infra-error``, or judged as it
    stands when the agent shut the guest down); and, for a replayed guest only,
    :class:`~runner.core.errors.ReplayMismatch` when the run asks what the
    cassette does not hold. ``host_http`` and ``alive`` never raise.
    """

    @abc.abstractmethod
    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        """Run ``command`` as root in the agent's shell; kill it at ``timeout`` seconds.

        Raises :class:`~runner.core.errors.GuestDown` when the shell is gone; a
        command killed at its timeout is ``timed_out``, not an exception."""

    @abc.abstractmethod
    def run_clean(self, command: str, timeout: float) -> CommandResult:
        """Run ``command`` in a clean environment the agent cannot have altered.

        Raises :class:`~runner.core.errors.GuestDown` as :meth:`exec` does; a
        program of the clean PATH that is not its package's file is exit 126."""

    def inspect(self, question: str, timeout: float) -> CommandResult:
        """Ask the guest helper itself (a JSON question; its JSON answer is the output).

        The helper answers from ``/proc``, ``lstat``, its own sockets and
        systemd's private socket, starting no program: the probes of rules 2
        use it so that a guest tool root replaced cannot lie to them (see
        :mod:`runner.backends.guestd`). A guest without a helper answers exit
        127, which a probe reports as an error, never as a verdict on the model.
        """
        return CommandResult(127, "this guest cannot answer inspection questions", 0.0)

    @abc.abstractmethod
    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        """GET ``path`` on ``guest_port`` from the host side (through a forwarded port).

        Never raises: no answer is a result with ``status`` None and ``error`` saying why."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """True while the VM runs and the shell answers; never raises."""

    @abc.abstractmethod
    def reboot(self, timeout: float) -> RebootResult:
        """Reboot the VM and return once its shell answers again, its clock set and its boot done.

        Whatever the agent left running is gone; whatever it wrote to disk or
        enabled stays, as after any reboot. A guest that does not come back
        within ``timeout`` seconds is :class:`~runner.core.errors.GuestDown`.
        """

    def on(self, machine: str | None) -> Guest:
        """The guest of ``machine`` in a multi-machine run (:class:`runner.core.machines.Machines`);
        a single machine is the only one there is, named by None."""
        if machine is not None:
            raise ValueError(f"no machine {machine!r}: this run has one machine")
        return self

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the channel; the VM's own teardown belongs to the sandbox."""
