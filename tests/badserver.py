"""A real HTTP server on loopback that misbehaves on purpose, like broken model servers do.

It is the one fake the tests allow: a model server returning garbage is a
fault we cannot make a real llama-server produce on demand.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3}}


OK = completion({"role": "assistant", "content": '{"thought": "t", "command": "uptime"}'})


class BadServer:
    """Serves a script of behaviours, one per request; the last one repeats."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []  # every request body, those then reset included
        self.headers: list[dict[str, str]] = []
        self.connections = 0  # TCP connections accepted, those then reset included
        self.props = '{"total_slots": 1}'  # what GET /props answers ("drip": one byte at a time)
        self.paths: list[str] = []  # every request's path and query, as the server saw it
        self._lock = threading.Lock()

    def next_behaviour(self) -> str:
        with self._lock:
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def _handler(server: BadServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def parse_request(self) -> bool:
            ok = super().parse_request()
            if ok:
                with server._lock:
                    server.paths.append(self.path)
            return ok

        def setup(self) -> None:
            with server._lock:
                server.connections += 1
            super().setup()

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            with server._lock:
                props = server.props
            if props == "drip":
                self._drip_body()
                return
            self._send(200, props.encode())

        def _drip(self, data: bytes, every: float = 0.5) -> None:
            """``data`` one byte at a time, every ``every`` seconds (at most a minute), until the
            client goes away: each read gets a byte long before any socket timeout."""
            end = time.monotonic() + 60
            try:
                for i in range(len(data)):
                    if time.monotonic() > end:
                        break
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(every)
            except OSError:
                pass
            self.close_connection = True

        def _drip_body(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.flush()
            self._drip(b" " * 100000)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            with server._lock:  # counted before any behaviour, a reset included
                server.requests.append(body)
                server.headers.append(dict(self.headers))
            b = server.next_behaviour()
            if b == "ok":
                self._send(200, json.dumps(OK).encode())
            elif b == "invalid-json":
                self._send(200, b"{this is not json")
            elif b == "no-choices":
                self._send(200, b'{"object": "chat.completion"}')
            elif b == "bad-arguments":
                call = {"id": "c1", "type": "function",
                        "function": {"name": "run_command", "arguments": "{not json"}}
                self._send(200, json.dumps(completion({"role": "assistant", "content": None,
                                                       "tool_calls": [call]})).encode())
            elif b == "unknown-tool":
                call = {"id": "c1", "type": "function",
                        "function": {"name": "format_disk", "arguments": "{}"}}
                self._send(200, json.dumps(completion({"role": "assistant", "content": None,
                                                       "tool_calls": [call]})).encode())
            elif b == "empty":
                self._send(200, json.dumps(completion({"role": "assistant", "content": ""})).encode())
            elif b in ("500", "429", "503"):
                self._send(int(b), b'{"error": "busy"}')
            elif b == "context-full":  # llama-server's own words when the prompt is too long
                self._send(400, json.dumps({"error": {
                    "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 8475,
                    "n_ctx": 8192, "message": "request (8475 tokens) exceeds the available "
                    "context size (8192 tokens), try increasing it"}}).encode())
            elif b == "stall":
                time.sleep(30)
                self._send(200, json.dumps(OK).encode())
            elif b == "huge":
                blob = json.dumps(completion({"role": "assistant", "content": "x" * (5 * 1024 * 1024)}))
                self._send(200, blob.encode())
            elif b.startswith("raw:"):  # this exact body, HTTP 200: any JSON text, broken or not
                self._send(200, b[4:].encode())
            elif b == "drip-body":  # headers at once, then the body one byte every 0.5 s
                self._drip_body()
            elif b == "drip-headers":  # the status line, then the headers one byte every 0.5 s
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                self._drip(b"X-Slow: " + b"y" * 10000 + b"\r\n\r\n")
            elif b == "endless":  # a chunked body that never ends, 1 KB every 20 ms (under the cap)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                end = time.monotonic() + 60
                try:
                    while time.monotonic() < end:
                        self.wfile.write(b"400\r\n" + b" " * 1024 + b"\r\n")
                        self.wfile.flush()
                        time.sleep(0.02)
                except OSError:
                    pass
                self.close_connection = True
            elif b == "reset":  # RST instead of a reply: linger on, timeout 0, then close
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.connection.close()
                self.close_connection = True
            else:
                self._send(500, b"unknown behaviour")

    return Handler


class _Server(ThreadingHTTPServer):
    """A client that hangs up on a slow or broken answer is what these tests do, so its
    broken pipe is not printed: a handler thread outlives its test, and its traceback would
    land in the stderr a later test captures (test_hostile_input saw one under load)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


@contextmanager
def bad_server(script: list[str], tls: ssl.SSLContext | None = None
               ) -> Iterator[tuple[str, BadServer]]:
    """(endpoint, state) of a running bad server; shut down on exit. With ``tls`` (a server
    context), it speaks HTTPS: each accepted connection's handshake is made in its handler."""
    state = BadServer(script)
    httpd = _Server(("127.0.0.1", 0), _handler(state))
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True,
                                       do_handshake_on_connect=False)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{httpd.server_address[1]}", state
    finally:
        httpd.shutdown()
        httpd.server_close()
