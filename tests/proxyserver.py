"""A real HTTP forward proxy on loopback: CONNECT tunnels and absolute-form requests.

It speaks the proxy protocol on real sockets, as squid or a company proxy does,
with one difference: it resolves names from its own table (``routes``), so a
test can send ``https://model.example`` through it to a server on 127.0.0.1
without DNS. It records what each client asked of it (method, target, the
Proxy-Authorization header) and, given ``auth``, answers 407 without it.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit


@dataclass
class ProxyState:
    routes: dict[tuple[str, int], tuple[str, int]]  # (host, port) asked -> where it really is
    auth: str | None = None  # the Proxy-Authorization value required, if any
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, target, auth


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """The request head (up to the blank line) and whatever body bytes came with it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes from ``a`` to ``b`` until ``a`` closes, then half-close ``b``."""
    try:
        while chunk := a.recv(65536):
            b.sendall(chunk)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _handler(state: ProxyState) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            head, rest = _read_head(conn)
            if not head:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ", 2)
            headers = [ln for ln in lines[1:] if ln]
            auth = next((ln.split(":", 1)[1].strip() for ln in headers
                         if ln.lower().startswith("proxy-authorization:")), None)
            state.seen.append((method, target, auth))
            if state.auth is not None and auth != state.auth:
                conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                             b"Proxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
                return
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                upstream = socket.create_connection(state.routes[(host, int(port))], timeout=10)
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                upstream.sendall(rest)
            else:  # absolute form: http://host:port/path?query
                url = urlsplit(target)
                upstream = socket.create_connection(
                    state.routes[(url.hostname or "", url.port or 80)], timeout=10)
                kept = [ln for ln in headers if not ln.lower().startswith(
                    ("proxy-authorization:", "connection:", "proxy-connection:"))]
                path = urlunsplit(("", "", url.path or "/", url.query, ""))
                upstream.sendall(f"{method} {path} HTTP/1.1\r\n".encode("latin-1")
                                 + "\r\n".join([*kept, "Connection: close"]).encode("latin-1")
                                 + b"\r\n\r\n" + rest)
            back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
            back.start()
            _pump(conn, upstream)
            back.join(30)
            upstream.close()

    return Handler


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def proxy_server(routes: dict[tuple[str, int], tuple[str, int]], auth: str | None = None
                 ) -> Iterator[tuple[str, ProxyState]]:
    """(``http://127.0.0.1:PORT``, state) of a running proxy; shut down on exit."""
    state = ProxyState(routes=routes, auth=auth)
    server = _Server(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
