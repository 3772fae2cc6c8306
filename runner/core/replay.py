"""Replay: a recorded cassette served back as the model, the guest and the clock.

Each of the three streams is served in order. A call that differs from the
recording is a :class:`~runner.core.errors.ReplayMismatch` naming where.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from runner.core.cassette import Cassette, CassetteWriter, first_difference, request_record
from runner.core.clock import Clock
from runner.core.errors import ContextExhausted, GuestDown, ModelServerError, ReplayMismatch
from runner.core.guest import CommandResult, Guest, HttpResult
from runner.core.model import ChatRequest, Model, ModelReply
from runner.core.outcomes import AgentKind


class _Stream:
    def __init__(self, events: list[dict[str, Any]], what: str) -> None:
        self._events: Iterator[dict[str, Any]] = iter(events)
        self.what = what
        self.served = 0

    def next(self, wanted: str) -> dict[str, Any]:
        try:
            event = next(self._events)
        except StopIteration:
            raise ReplayMismatch(f"the cassette has no more {self.what} events "
                                 f"(after {self.served}); the run wanted {wanted}") from None
        self.served += 1
        return event


class ReplayClock(Clock):
    """Serves the recorded clock readings."""

    def __init__(self, cassette: Cassette, writer: CassetteWriter | None = None) -> None:
        super().__init__(writer)
        self._stream = _Stream(cassette.stream("clock"), "clock")

    def now(self) -> float:
        t = float(self._stream.next("a clock reading")["t"])
        if self._writer is not None:
            self._writer.write({"type": "clock", "t": t})
        return t

    def sleep(self, seconds: float) -> None:
        return None


class ReplayModel(Model):
    """Serves recorded replies; a request that differs from the recording is an error.

    With ``lenient`` a differing request is served the recorded reply anyway,
    which is what replaying against a real VM (different PIDs, timestamps) needs.
    """

    def __init__(self, cassette: Cassette, lenient: bool = False) -> None:
        self._stream = _Stream(cassette.stream("model"), "model")
        self._lenient = lenient
        fp = cassette.header.get("model", {})
        self._fingerprint = fp
        self.name = str(fp.get("name", "replay"))
        self.agent = AgentKind.from_fingerprint(fp.get("kind"))
        self.turn = 0
        self.mismatches: list[str] = []

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        self.turn += 1
        event = self._stream.next(f"the reply to turn {self.turn}")
        recorded = event.get("request", {})
        if recorded.get("digest") != request_record(request)["digest"]:
            why = f"turn {self.turn}: the request differs from the recording: " \
                  f"{first_difference(recorded, request)}"
            if not self._lenient:
                raise ReplayMismatch(why)
            self.mismatches.append(why)
        if event["type"] == "model-error":
            message = str(event.get("error", "recorded model error"))
            attempts = event.get("attempts", [])
            if event.get("kind") == "context":
                raise ContextExhausted(message, attempts=attempts)
            raise ModelServerError(message, attempts=attempts,
                                   out_of_time=event.get("kind") == "deadline")
        reply = event["reply"]
        return ModelReply(message=reply["message"], raw=reply.get("raw", {}),
                          usage=reply.get("usage", {}), duration=reply.get("duration", 0.0),
                          attempts=reply.get("attempts", []))

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)


def _served(given: dict[str, Any]) -> dict[str, Any]:
    """The part of a guest call that decides its answer (not its timeout or output cap)."""
    return {k: v for k, v in given.items() if k not in ("timeout", "output_limit")}


# Cassettes recorded before the clean channel was renamed call it "probe".
_OLD_OPS = {"probe": "clean"}


class ReplayGuest(Guest):
    """Serves recorded guest exchanges, in order, checking each call matches."""

    def __init__(self, cassette: Cassette) -> None:
        self._stream = _Stream(cassette.stream("guest"), "guest")

    def _next(self, op: str, given: dict[str, Any]) -> dict[str, Any]:
        event = self._stream.next(f"{op} {given}")
        # A changed timeout or cap does not change what was served; a changed command does.
        recorded_op = _OLD_OPS.get(event.get("op"), event.get("op"))
        if recorded_op != op or _served(event.get("input") or {}) != _served(given):
            raise ReplayMismatch(
                f"guest exchange {self._stream.served}: the run wanted {op} {given!r}, "
                f"the cassette has {event.get('op')} {event.get('input')!r}")
        result = event["result"]
        if result.get("error") == "guest-down":
            raise GuestDown(str(result.get("message", "guest down (recorded)")))
        return result

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        given = {"command": command, "timeout": timeout, "output_limit": output_limit}
        return CommandResult(**self._next("exec", given))

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        return CommandResult(**self._next("clean", {"command": command, "timeout": timeout}))

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        given = {"port": guest_port, "path": path, "timeout": timeout}
        return HttpResult(**self._next("http", given))

    def alive(self) -> bool:
        return bool(self._next("alive", {})["alive"])
