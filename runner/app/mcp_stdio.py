"""MCP's stdio wire, made safe to read from a hostile client: one JSON-RPC message per line.

The SDK's stdio transport reads lines without a bound and hands anything to
its JSON parser. Here every line is screened before the SDK sees it
(:func:`screen_message`): a line over :data:`MAX_MESSAGE_BYTES` is refused and
skipped in bounded pieces, one that is not a JSON-RPC message, or holds a lone
surrogate, is answered with a JSON-RPC error instead of reaching the server.
The wire itself sits on private descriptors (:func:`wire`), so a stray
``print`` cannot corrupt the stream. The episode's serving loop is
:mod:`runner.app.mcp_server`'s.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from runner.core.text import one_line

log = logging.getLogger("rootbench.mcp")

# The longest JSON-RPC message read from stdin: the SDK's cap on an HTTP request body, so both
# transports take the same; a longer line is refused (and skipped) without being held whole.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

def _error_line(msg_id: Any, code: int, message: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code,
                                                                  "message": message}})


def _lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in a parsed JSON value (keys too), as ``U+XXXX``, or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"U+{ord(v[exc.start]):04X}"
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def screen_message(line: bytes) -> tuple[str | None, str | None]:
    """One line from stdin: ``(text for the SDK, None)``, or ``(None, the JSON-RPC error to
    answer)`` for what the SDK would drop without a word.

    The SDK's stdio transport answers nothing to a line it cannot parse, to a
    batch (a JSON array, which MCP does not use), to a string with a lone
    surrogate escape (``"\\ud800"``, valid JSON but not Unicode text), nor to
    anything its own reader refuses or takes for a notification (not an object,
    an id that is a float, a bool or null, a wrong ``jsonrpc``, no ``method``,
    nesting deeper than its parser takes): the client then waits for ever. Each
    gets an error naming the request's ``id`` when it has a usable one (JSON-RPC
    2.0: -32700 parse error, -32600 invalid request, -32602 invalid params).
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, _error_line(None, -32700, f"Parse error: the line is not UTF-8 text "
                                               f"(byte {exc.start})")
    if not text.strip():
        return None, None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return None, _error_line(None, -32700, f"Parse error: {one_line(str(exc), 120)}")
    if isinstance(value, list):
        return None, _error_line(None, -32600, "Invalid Request: JSON-RPC batches are not "
                                               "supported; send one message per line")
    if not isinstance(value, dict):
        return None, _error_line(None, -32600, "Invalid Request: a message is a JSON object")
    msg_id = value.get("id")
    usable = isinstance(msg_id, str | int) and not isinstance(msg_id, bool)
    msg_id = msg_id if usable and _lone_surrogate(msg_id) is None else None
    # A request whose id the SDK cannot use is a notification to it, answered with nothing
    # (a response's null id is JSON-RPC's own, and passes).
    if "id" in value and "method" in value and not usable:
        return None, _error_line(None, -32600, "Invalid Request: the id must be a string or "
                                               "an integer")
    if (where := _lone_surrogate(value)) is not None:
        return None, _error_line(msg_id, -32602,
                                 f"Invalid params: a string holds a lone surrogate ({where}), "
                                 "which is not Unicode text; send valid UTF-8")
    if (why := _not_a_message(text)) is not None:
        return None, _error_line(msg_id, -32600, f"Invalid Request: {why}")
    return text, None


def _not_a_message(text: str) -> str | None:
    """Why the SDK cannot read ``text`` as a JSON-RPC message (it would log that and answer
    nothing: a wrong ``jsonrpc``, no ``method``, nesting deeper than its parser takes), in
    one line; None when it can. Its own reader, so the two never disagree."""
    from mcp.types import jsonrpc_message_adapter
    from pydantic import ValidationError

    try:
        jsonrpc_message_adapter.validate_json(text, by_name=False)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[:1]
        where = ".".join(str(x) for x in first[0]["loc"][1:]) if first else ""
        said = first[0]["msg"] if first else str(exc)
        return one_line(f"{where}: {said}" if where else said, 160)
    return None


class StdioOut:
    """The wire's stdout for the SDK's stdio transport: one daemon thread writes, in order.

    ``write`` never blocks the event loop and never raises: a client that has
    gone (EPIPE) or stopped reading leaves the episode to be judged rather than
    an exception through the server (the ExceptionGroup that lost episodes).
    """

    def __init__(self, fd: int) -> None:
        import queue

        self._fd = fd
        self._queue: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.gone = threading.Event()
        threading.Thread(target=self._pump, name="mcp-stdout", daemon=True).start()

    def send(self, text: str) -> None:
        if not self.gone.is_set():
            self._queue.put(text.encode("utf-8", "replace"))

    async def write(self, text: str) -> None:
        self.send(text)

    async def flush(self) -> None:
        return None

    def _pump(self) -> None:
        while True:
            view = memoryview(self._queue.get())
            try:
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError:
                self.gone.set()
                return


class StdioIn:
    """The wire's stdin for the SDK's stdio transport, read by a daemon thread.

    Each line is screened first (:func:`screen_message`; a line over
    :data:`MAX_MESSAGE_BYTES` is refused and skipped in bounded pieces); what
    the SDK would drop silently is answered here on ``out``. ``on_eof`` runs once
    stdin ends: the client has gone.
    """

    def __init__(self, fd: int, out: StdioOut, on_eof: Callable[[], None]) -> None:
        self._fd = fd
        self._out = out
        self._on_eof = on_eof
        self.ended = threading.Event()
        self._receive: Any = None

    def start(self) -> None:
        """Start reading (in the event loop: lines are handed to it)."""
        import anyio
        import anyio.from_thread
        import anyio.lowlevel

        send, self._receive = anyio.create_memory_object_stream[str | None](0)
        token = anyio.lowlevel.current_token()

        def main() -> None:
            reader = io.BufferedReader(io.FileIO(self._fd, "rb", closefd=False))
            try:
                for line in self._lines(reader):
                    text, error = screen_message(line)
                    if error is not None:
                        self._out.send(error + "\n")
                    elif text is not None:
                        anyio.from_thread.run(send.send, text, token=token)
            except Exception as exc:  # noqa: BLE001 - the loop has gone, or stdin broke
                log.debug("stdin reader: %s", exc)
            finally:
                self.ended.set()
                self._on_eof()
                with contextlib.suppress(Exception):
                    anyio.from_thread.run(send.send, None, token=token)

        threading.Thread(target=main, name="mcp-stdin", daemon=True).start()

    def _lines(self, reader: io.BufferedIOBase) -> Iterator[bytes]:
        while True:
            line = reader.readline(MAX_MESSAGE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_MESSAGE_BYTES and not line.endswith(b"\n"):
                while (rest := reader.readline(MAX_MESSAGE_BYTES)) and not rest.endswith(b"\n"):
                    pass  # skip the rest of the line, a bounded piece at a time
                self._out.send(_error_line(None, -32600, "Invalid Request: the message is "
                                           f"longer than {MAX_MESSAGE_BYTES:,} bytes") + "\n")
                continue
            yield line

    def __aiter__(self) -> StdioIn:
        return self

    async def __anext__(self) -> str:
        item = await self._receive.receive()
        if item is None:
            raise StopAsyncIteration
        return str(item)


@contextlib.contextmanager
def wire() -> Iterator[tuple[int, int]]:
    """The stdio wire on private descriptors, and fd 0 and 1 pointed away from it meanwhile
    (stdin at /dev/null, stdout at stderr), as the SDK's own transport does: a stray
    ``print`` or a child's output cannot corrupt the JSON-RPC stream."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        yield wire_in, wire_out
    finally:
        os.close(null)
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        # The wire descriptors stay open: a daemon thread may still be in a read or write on
        # them, and a closed descriptor's number could be reused under it.
