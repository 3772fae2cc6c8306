"""A guest whose whole state is a set of flags: enough for the episode loop, probes and recorder.

The unit tests of scoring and phase timing drive real episodes through it
without a VM; the same loop runs against real guests in the VM tests.
"""

from __future__ import annotations

from collections.abc import Iterable

from runner.core.guest import CommandResult, Guest, HttpResult


class FlagGuest(Guest):
    """``touch``/``rm`` set and clear flags, ``test -e`` reads one, ``ls`` lists them (and says
    whether ``a`` is missing), ``false`` fails; ``up`` False plays a guest the agent took down."""

    def __init__(self, flags: Iterable[str] = (), up: bool = True) -> None:
        self.flags: set[str] = set(flags)
        self.up = up

    def _run(self, command: str) -> CommandResult:
        words = command.split()
        if words[:1] == ["sudo"]:
            words = words[1:]
        if words[:1] == ["touch"]:
            self.flags.update(words[1:])
        elif words[:1] == ["rm"]:
            self.flags.difference_update(w for w in words[1:] if not w.startswith("-"))
        elif words[:2] == ["test", "-e"]:
            return CommandResult(0 if words[2] in self.flags else 1, "", 0.01)
        elif words[:1] == ["ls"]:
            out = " ".join(sorted(self.flags)) + ("" if "a" in self.flags else "\na is missing")
            return CommandResult(0, out, 0.01)
        elif words[:1] == ["false"]:
            return CommandResult(1, "no", 0.01)
        return CommandResult(0, "", 0.01)

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        return self._run(command)

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        return self._run(command)

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        return HttpResult(None, "", "no web server here")

    def alive(self) -> bool:
        return self.up
