"""Cassettes: every model reply, guest exchange and clock reading of a run.

A cassette is JSONL, one event per line, appended and flushed as things
happen, so a crash leaves a readable prefix. While a run is in progress the
file is ``NAME.jsonl.partial``; it is renamed to ``NAME.jsonl`` when the run
ends, so a complete cassette is never half-written.

Replay splits the events into three streams (model, guest, clock) and serves
each in order. The agent loop, the probes and the scoring are the same code
in every mode; only where answers come from changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import IO, Any

from runner.errors import (
    ContextExhausted,
    GuestDown,
    InvalidInput,
    ModelServerError,
    ReplayMismatch,
)
from runner.guest import CommandResult, Guest, HttpResult
from runner.model import ChatRequest, Model, ModelReply

FORMAT_VERSION = 1

# Environment variables whose values must never reach a cassette or a result.
SECRET_ENV_VARS = ("OPENAI_API_KEY", "ROOTBENCH_API_KEY", "LLAMA_API_KEY", "API_KEY")
_SECRET_KEYS = {"authorization", "api_key", "api-key", "x-api-key"}


class RecordMode(str, Enum):
    """As in vcrpy: how a run uses its cassette."""

    NONE = "none"  # replay only; anything missing is an error
    ONCE = "once"  # record if the cassette does not exist yet, else replay
    ALL = "all"  # always record afresh


def digest(obj: Any) -> str:
    """A stable sha256 of any JSON-able value."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def _secrets() -> list[str]:
    return [v for k in SECRET_ENV_VARS if (v := os.environ.get(k)) and len(v) >= 4]


def scrub(obj: Any, secrets: list[str] | None = None) -> Any:
    """Drop auth headers and blank out secret values anywhere in ``obj``."""
    secrets = _secrets() if secrets is None else secrets
    if isinstance(obj, dict):
        return {k: ("[scrubbed]" if str(k).lower() in _SECRET_KEYS else scrub(v, secrets))
                for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [scrub(v, secrets) for v in obj]
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, "[scrubbed]")
        return obj
    return obj


class CassetteWriter:
    """Appends events to ``path`` (as ``path.partial`` until :meth:`close`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.partial, "w", encoding="utf-8")  # noqa: SIM115
        self._secrets = _secrets()
        self.events = 0

    def write(self, event: dict[str, Any]) -> None:
        if self._file is None:
            raise RuntimeError("cassette already closed")
        line = json.dumps(scrub(event, self._secrets), ensure_ascii=False, default=str)
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.events += 1

    def close(self) -> Path:
        """Finish the cassette: rename ``.partial`` into place."""
        if self._file is not None:
            self._file.close()
            self._file = None
            os.replace(self.partial, self.path)
        return self.path

    def __enter__(self) -> CassetteWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Cassette:
    """A cassette read back: the header, the verdict and the three replay streams."""

    def __init__(self, path: Path, events: list[dict[str, Any]]) -> None:
        self.path = path
        self.events = events
        self.header: dict[str, Any] = events[0] if events and events[0].get("type") == "header" else {}
        if not self.header:
            raise InvalidInput("not a rootbench cassette (no header line)", path=str(path))
        if self.header.get("format") != FORMAT_VERSION:
            raise InvalidInput(f"cassette format {self.header.get('format')!r} is not "
                               f"{FORMAT_VERSION}", path=str(path), field="header.format")
        self.verdict: dict[str, Any] | None = next(
            (e for e in reversed(events) if e.get("type") == "verdict"), None)

    @classmethod
    def load(cls, path: str | Path) -> Cassette:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidInput("no such cassette", path=str(path)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"cannot read cassette: {exc}", path=str(path)) from None
        events = []
        for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 etc. are data
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"invalid JSON: {exc.msg}", path=str(path), line=lineno) from None
            if not isinstance(event, dict) or "type" not in event:
                raise InvalidInput("event is not an object with a 'type'", path=str(path),
                                   line=lineno)
            events.append(event)
        return cls(path, events)

    def stream(self, kind: str) -> list[dict[str, Any]]:
        kinds = {"model": ("model", "model-error")}.get(kind, (kind,))
        return [e for e in self.events if e["type"] in kinds]


def find_cassettes(paths: list[str | Path]) -> list[Path]:
    """Expand files and directories (recursively) into ``*.jsonl`` cassettes."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(p.rglob("*.jsonl")))
        elif p.exists():
            found.append(p)
        else:
            raise InvalidInput("no such file or directory", path=str(p))
    if not found:
        raise InvalidInput("no cassettes found", path=", ".join(map(str, paths)))
    return found


# --- requests: what a replay must match -------------------------------------------------

def request_record(request: ChatRequest) -> dict[str, Any]:
    """The digest of a request plus one digest per message, to locate a difference."""
    payload = request.payload()
    rest = {k: v for k, v in payload.items() if k != "messages"}
    return {
        "digest": digest(payload),
        "messages": [digest(m) for m in request.messages],
        "extras": digest(rest),
        "last": request.messages[-1] if request.messages else None,
    }


def _first_difference(recorded: dict[str, Any], request: ChatRequest) -> str:
    now = request_record(request)
    if recorded.get("extras") != now["extras"]:
        return "the tools / response_format fields differ"
    old = recorded.get("messages", [])
    for i, (a, b) in enumerate(zip(old, now["messages"], strict=False)):
        if a != b:
            role = request.messages[i].get("role", "?")
            text = str(request.messages[i].get("content") or "")[:80]
            return f"message {i} ({role}) differs: now {text!r}"
    return f"the recording has {len(old)} messages, the run has {len(now['messages'])}"


# --- recording wrappers -----------------------------------------------------------------

class RecordingGuest(Guest):
    """Passes calls to a real guest and records every exchange."""

    def __init__(self, inner: Guest, writer: CassetteWriter) -> None:
        self.inner = inner
        self.writer = writer

    def _record(self, op: str, given: dict[str, Any], result: dict[str, Any]) -> None:
        self.writer.write({"type": "guest", "op": op, "input": given, "result": result})

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        given = {"command": command, "timeout": timeout, "output_limit": output_limit}
        return self._call("exec", given, lambda: self.inner.exec(command, timeout, output_limit))

    def probe(self, command: str, timeout: float) -> CommandResult:
        given = {"command": command, "timeout": timeout}
        return self._call("probe", given, lambda: self.inner.probe(command, timeout))

    def _call(self, op: str, given: dict[str, Any], fn: Any) -> Any:
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
        self.kind = inner.kind
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

    def fingerprint(self) -> dict[str, Any]:
        return self.inner.fingerprint()

    def template_supports_tools(self) -> bool | None:
        return self.inner.template_supports_tools()

    def accepts_response_format(self) -> bool | None:
        return self.inner.accepts_response_format()

    def makes_native_tool_calls(self) -> bool | None:
        return self.inner.makes_native_tool_calls()


class Clock:
    """Seconds since the run started. All time-based decisions read it.

    A real clock records each reading, so a replay can make the very same
    decisions (budget exhausted, probe deadline passed) without real time.
    """

    def __init__(self, writer: CassetteWriter | None = None) -> None:
        self._start = time.monotonic()
        self._writer = writer

    def now(self) -> float:
        t = round(time.monotonic() - self._start, 6)
        if self._writer is not None:
            self._writer.write({"type": "clock", "t": t})
        return t

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


# --- replay -----------------------------------------------------------------------------

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

    kind = "replay"

    def __init__(self, cassette: Cassette, lenient: bool = False) -> None:
        self._stream = _Stream(cassette.stream("model"), "model")
        self._lenient = lenient
        fp = cassette.header.get("model", {})
        self._fingerprint = fp
        self.name = str(fp.get("name", "replay"))
        self.kind = str(fp.get("kind", "replay"))
        self.turn = 0
        self.mismatches: list[str] = []

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        self.turn += 1
        event = self._stream.next(f"the reply to turn {self.turn}")
        recorded = event.get("request", {})
        if recorded.get("digest") != request_record(request)["digest"]:
            why = f"turn {self.turn}: the request differs from the recording: " \
                  f"{_first_difference(recorded, request)}"
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


class ReplayGuest(Guest):
    """Serves recorded guest exchanges, in order, checking each call matches."""

    def __init__(self, cassette: Cassette) -> None:
        self._stream = _Stream(cassette.stream("guest"), "guest")

    def _next(self, op: str, given: dict[str, Any]) -> dict[str, Any]:
        event = self._stream.next(f"{op} {given}")
        # A changed timeout or cap does not change what was served; a changed command does.
        if event.get("op") != op or _served(event.get("input") or {}) != _served(given):
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

    def probe(self, command: str, timeout: float) -> CommandResult:
        return CommandResult(**self._next("probe", {"command": command, "timeout": timeout}))

    def host_http(self, guest_port: int, path: str, timeout: float) -> HttpResult:
        given = {"port": guest_port, "path": path, "timeout": timeout}
        return HttpResult(**self._next("http", given))

    def alive(self) -> bool:
        return bool(self._next("alive", {})["alive"])
