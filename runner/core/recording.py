"""Recording wrappers: a real guest and a real model, with every exchange written to a cassette,
and what the loop decided of each reply (``decision`` events, see :meth:`Model.decided`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, TypeVar

from runner.core.cassette import CassetteWriter, request_record
from runner.core.errors import ContextExhausted, GuestDown, ModelServerError
from runner.core.guest import CommandResult, Guest, HttpResult, RebootResult
from runner.core.model import ChatRequest, Model, ModelReply

_Result = TypeVar("_Result", CommandResult, HttpResult, RebootResult)


class RecordingGuest(Guest):
    """Passes calls to a real guest and records every exchange.

    ``machine``: the machine's name in a multi-machine run, written into each
    exchange; None for the first machine (and every single-machine run), so
    their exchanges are written exactly as they always were.
    """

    def __init__(self, inner: Guest, writer: CassetteWriter, machine: str | None = None) -> None:
        self.inner = inner
        self.writer = writer
        self.machine = machine

    def _record(self, op: str, given: dict[str, Any], result: dict[str, Any]) -> None:
        event: dict[str, Any] = {"type": "guest", "op": op}
        if self.machine is not None:
            event["machine"] = self.machine
        self.writer.write({**event, "input": given, "result": result})

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        given = {"command": command, "timeout": timeout, "output_limit": output_limit}
        return self._call("exec", given, lambda: self.inner.exec(command, timeout, output_limit))

    def run_clean(self, command: str, timeout: float) -> CommandResult:
        given = {"command": command, "timeout": timeout}
        return self._call("clean", given, lambda: self.inner.run_clean(command, timeout))

    def inspect(self, question: str, timeout: float) -> CommandResult:
        given = {"question": question, "timeout": timeout}
        return self._call("inspect", given, lambda: self.inner.inspect(question, timeout))

    def _call(self, op: str, given: dict[str, Any], fn: Callable[[], _Result]) -> _Result:
        try:
            result = fn()
        except GuestDown as exc:
            self._record(op, given, {"error": "guest-down", "message": str(exc)})
            raise
        self._record(op, given, asdict(result))
        return result

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        given = {"port": guest_port, "path": path, "timeout": timeout}
        return self._call("http", given, lambda: self.inner.host_http(guest_port, path, timeout))

    def reboot(self, timeout: float) -> RebootResult:
        return self._call("reboot", {"timeout": timeout}, lambda: self.inner.reboot(timeout))

    def alive(self) -> bool:
        ok = self.inner.alive()
        self._record("alive", {}, {"alive": ok})
        return ok

    def close(self) -> None:
        self.inner.close()


class RecordingModel(Model):
    """Passes requests to a real model and records request digests and full replies."""

    def __init__(self, inner: Model, writer: CassetteWriter) -> None:
        self.inner = inner
        self.writer = writer
        self.name = inner.name
        self.agent = inner.agent
        self.turn = 0

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        self.turn += 1
        record = request_record(request)
        try:
            reply = self.inner.complete(request, timeout)
        except (ModelServerError, ContextExhausted) as exc:
            kind = ("context" if isinstance(exc, ContextExhausted)
                    else "deadline" if exc.out_of_time else "server")
            self.writer.write({"type": "model-error", "turn": self.turn, "request": record,
                               "kind": kind, "error": str(exc),
                               "attempts": exc.attempts})
            raise
        self.writer.write({"type": "model", "turn": self.turn, "request": record,
                           "reply": {"message": reply.message, "raw": reply.raw,
                                     "usage": reply.usage, "duration": reply.duration,
                                     "attempts": reply.attempts}})
        return reply

    def decided(self, decision: Mapping[str, Any]) -> None:
        """The loop's decision on one action of the last reply, as a ``decision`` event."""
        self.writer.write({"type": "decision", **decision})
        self.inner.decided(decision)

    def fingerprint(self) -> dict[str, Any]:
        return self.inner.fingerprint()

    def template_supports_tools(self) -> bool | None:
        return self.inner.template_supports_tools()

    def accepts_response_format(self) -> bool | None:
        return self.inner.accepts_response_format()

    def makes_native_tool_calls(self) -> bool | None:
        return self.inner.makes_native_tool_calls()
