"""A guest whose whole state is a set of flags: enough for the episode loop, probes and recorder.

The unit tests of scoring and phase timing drive real episodes through it
without a VM; the same loop runs against real guests in the VM tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from runner.core.errors import GuestDown
from runner.core.guest import CommandResult, Guest, HttpResult, RebootResult


class FlagGuest(Guest):
    """``touch``/``rm`` set and clear flags, ``test -e`` reads one, ``ls`` lists them (and says
    whether ``a`` is missing), ``false`` fails; ``up`` False plays a guest the agent took down.

    For the re-checks: a flag named in ``expires`` vanishes that many seconds after it was
    set (a fix a background job undoes), and a reboot clears the flags that start with
    ``run-`` (state in /run, or a process started by hand); ``reboots`` counts them.
    """

    def __init__(self, flags: Iterable[str] = (), up: bool = True,
                 expires: Mapping[str, float] | None = None) -> None:
        self.flags: set[str] = set(flags)
        self.up = up
        self.expires = dict(expires or {})
        self.set_at: dict[str, float] = {}
        self.reboots = 0

    def _run(self, command: str) -> CommandResult:
        now = time.monotonic()
        self.flags.difference_update([f for f, t in self.set_at.items()
                                      if f in self.expires and now - t >= self.expires[f]])
        words = command.split()
        if words[:1] == ["sudo"]:
            words = words[1:]
        if words[:1] == ["touch"]:
            self.flags.update(words[1:])
            self.set_at.update(dict.fromkeys(words[1:], now))
        elif words[:1] == ["rm"]:
            self.flags.difference_update(w for w in words[1:] if not w.startswith("-"))
        elif words[:2] == ["test", "-e"]:
            return CommandResult(0 if words[2] in self.flags else 1, "", 0.01)
        elif words[:1] == ["ls"]:
            out = " ".join(sorted(self.flags)) + ("" if "a" in self.flags else "\na is missing")
            return CommandResult(0, out, 0.01)
        elif words[:1] == ["false"]:
            return CommandResult(1, "no", 0.01)
        elif words[:1] == ["hang"]:  # a command still running at its timeout
            return CommandResult(None, "waiting", 60.0, timed_out=True)
        return CommandResult(0, "", 0.01)

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        return self._run(command)

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        return self._run(command)

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        return HttpResult(None, "", "no web server here")

    def alive(self) -> bool:
        return self.up

    def reboot(self, timeout: float) -> RebootResult:
        if not self.up:
            raise GuestDown("the flag guest is down")
        self.reboots += 1
        self.flags = {f for f in self.flags if not f.startswith("run-")}
        return RebootResult(True, 0.01)
