"""MCP over streamable HTTP: a listener that hands out a root shell, and the checks it makes.

It binds loopback unless told otherwise (:func:`parse_http`, :func:`listen`),
is bound before the VM starts, and answers only requests that carry the
server's bearer token (:func:`new_token`, compared in constant time) and whose
``Host`` and ``Origin`` name this server (:func:`host_allowed`: no DNS
rebinding, on loopback too). :func:`guarded_app` puts those checks in front of
the SDK's ASGI app. The episode's serving loop is :mod:`runner.app.mcp_server`'s.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import secrets
import socket
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.core.errors import InvalidInput

log = logging.getLogger("rootbench.mcp")

HTTP_PATH = "/mcp"

_ADDRESS = re.compile(r"^(?:(?P<host>\[[^\]]*\]|[^:\[\]]*):)?(?P<port>[0-9]{1,5})$")


@dataclass(frozen=True)
class HttpAddress:
    """Where ``--http`` listens: checked and resolved before anything starts."""

    host: str  # as given (brackets of an IPv6 address removed); "127.0.0.1" when none was
    port: int
    family: int
    sockaddr: tuple[Any, ...]
    loopback: bool

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{HTTP_PATH}"


def parse_http(value: str, *, remote: bool = False) -> HttpAddress:
    """``--http [HOST:]PORT``, resolved; loopback unless ``remote`` (``--http-remote``).

    Refused with one line (exit 2), before any VM starts: a URL instead of an
    address, a port out of 1..65535, a host that does not resolve, and a host
    that is not loopback without ``--http-remote``.
    """
    text = value.strip()
    if "://" in text or "/" in text:
        raise InvalidInput(f"give HOST:PORT or PORT, not a URL (the server's URL is then "
                           f"http://HOST:PORT{HTTP_PATH}): {value!r}", field="--http")
    m = _ADDRESS.match(text)
    port = int(m.group("port")) if m else 0
    if m is None or not 0 < port < 65536:
        raise InvalidInput(f"not [HOST:]PORT with a port from 1 to 65535 (an IPv6 host in "
                           f"brackets: [::1]:8765): {value!r}", field="--http")
    host = (m.group("host") or "").strip("[]") or "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidInput(f"cannot resolve the host {host!r}: "
                           f"{getattr(exc, 'strerror', None) or exc}", field="--http") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)  # localhost: 127.0.0.1, as clients try first
    family, _, _, _, sockaddr = infos[0]
    loopback = all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)
    if not loopback and not remote:
        raise InvalidInput(f"{host} is not a loopback address, so the root shell would be "
                           "reachable from other machines; add --http-remote to listen there "
                           "anyway", field="--http")
    return HttpAddress(host, port, family, tuple(sockaddr), loopback)


def listen(address: HttpAddress) -> socket.socket:
    """A socket bound and listening at ``address``, or one line (exit 2) saying why not.

    Bound here, before the VM starts, and handed to the HTTP server as it is:
    a busy port is found out at once, and nobody can take the port in between.
    """
    sock = socket.socket(address.family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address.sockaddr)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"cannot listen on {address.host}:{address.port}: "
                           f"{exc.strerror or exc}", field="--http") from None
    return sock


def new_token() -> str:
    """A bearer token for one server: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def write_token_file(path: Path, token: str) -> None:
    """Write ``token`` to ``path``, readable by its owner only (0600, whatever the file's mode
    was); a symbolic link or anything but a regular file is refused (one line, exit 2)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        why = "a symbolic link" if exc.errno == 40 else exc.strerror or str(exc)  # ELOOP
        raise InvalidInput(f"cannot write the token: {why}", path=str(path),
                           field="--http-token-file") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput("cannot write the token: not a regular file", path=str(path),
                               field="--http-token-file")
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.write(fd, (token + "\n").encode())
    except OSError as exc:
        raise InvalidInput(f"cannot write the token: {exc.strerror or exc}", path=str(path),
                           field="--http-token-file") from None
    finally:
        os.close(fd)


@dataclass
class Listener:
    """A bound ``--http`` socket, its address and the bearer token every request must carry."""

    sock: socket.socket
    address: HttpAddress
    token: str


def _split_host(value: str) -> tuple[str, str] | None:
    """``host[:port]`` of a Host header (or an Origin's authority) as (host, port)."""
    m = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]+)(?::([0-9]{1,5}))?", value)
    if m is None:
        return None
    return m.group(1).strip("[]").lower(), m.group(2) or ""


def host_allowed(header: str, address: HttpAddress) -> bool:
    """Whether a request's ``Host`` (or ``Origin`` authority) may name this server.

    DNS rebinding makes a browser send requests to us under a name its page
    controls; so the name must be one no web page can own: ``localhost``, an IP
    address (loopback ones only when we listen on loopback), the name given to
    ``--http``, or, with ``--http-remote``, this machine's own host names. The
    port must be ours.
    """
    parts = _split_host(header)
    if parts is None or parts[1] != str(address.port):
        return False
    name = parts[0]
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        names = {"localhost", address.host.lower()}
        if not address.loopback:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return name in names
    return ip.is_loopback or not address.loopback


def guarded_app(app: Any, listener: Listener, on_end: Callable[[], None]) -> Any:
    """The ASGI app behind the checks every request passes first: ``Host`` and ``Origin`` name
    this server (:func:`host_allowed`), and ``Authorization`` carries the bearer token
    (compared in constant time). A DELETE that ended a session calls ``on_end``."""
    Scope = MutableMapping[str, Any]
    token = listener.token.encode()

    async def refuse(send: Callable[[Any], Awaitable[None]], status: int, text: str,
                     extra: list[tuple[bytes, bytes]]) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"), *extra]})
        await send({"type": "http.response.body", "body": text.encode() + b"\n"})

    async def guarded(scope: Scope, receive: Callable[[], Awaitable[Any]],
                      send: Callable[[Any], Awaitable[None]]) -> None:
        if scope.get("type") == "lifespan":
            await app(scope, receive, send)  # the server's own start and stop
            return
        if scope.get("type") != "http":  # a websocket (or any other kind): nothing for it here
            await send({"type": "websocket.close", "code": 1008})
            return
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(bytes(k).lower(), bytes(v))
        host = headers.get(b"host", b"").decode("latin-1")
        origin = headers.get(b"origin", b"").decode("latin-1")
        if not host_allowed(host, listener.address):
            await refuse(send, 421, "this server does not answer to that Host", [])
            return
        if origin and not (origin.startswith("http://")
                           and host_allowed(origin[len("http://"):], listener.address)):
            await refuse(send, 403, "requests from that Origin are refused", [])
            return
        # The scheme's name is case-insensitive (RFC 9110 11.1); the token is compared whole,
        # in constant time.
        scheme, _, given = headers.get(b"authorization", b"").strip().partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), token):
            await refuse(send, 401, "send the server's token: Authorization: Bearer TOKEN",
                         [(b"www-authenticate", b'Bearer realm="rootbench"')])
            return
        status: list[int] = []

        async def sent(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status.append(int(message.get("status", 0)))
            await send(message)

        await app(scope, receive, sent)
        if scope.get("method") == "DELETE" and status and status[0] < 400:
            on_end()

    return guarded
