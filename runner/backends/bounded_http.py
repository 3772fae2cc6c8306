"""One HTTP exchange with a model server, bounded by one deadline, through the user's proxy.

Every request the harness makes to a model server (a chat turn, ``/props``,
``/health``) goes through :func:`http_call`: a hand-held ``http.client``
exchange, because a socket timeout bounds each read and not the exchange, and
a server that drips a byte a second must still end on time.

Proxies follow the usual environment (``HTTPS_PROXY``, ``HTTP_PROXY``,
``ALL_PROXY`` and ``NO_PROXY``, in either case), as curl, pip and requests do,
so a remote ``--endpoint`` behind a company proxy works. Loopback servers
(our own llama-server on 127.0.0.1) are never proxied, whatever ``NO_PROXY``
says: a proxy cannot reach the host's own loopback, and sending it there would
turn "no proxy exception for localhost" into "llama-server never became healthy".
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from runner.core.errors import InvalidInput, ModelServerError

MAX_REPLY_BYTES = 2 * 1024 * 1024  # a chat reply larger than this is a broken server


class ReplyTimeout(OSError):
    """The whole exchange (connect, request, headers, body) outlived its one deadline."""


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy from the environment: where it listens and what it is told (credentials)."""

    host: str
    port: int
    headers: dict[str, str]
    variable: str  # the environment variable it came from, for error messages


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def proxy_for(url: SplitResult) -> Proxy | None:
    """The proxy the environment names for ``url``, or None (no proxy, NO_PROXY, or loopback).

    Only ``http://`` proxies are spoken (a CONNECT tunnel for https URLs, the absolute URL for
    http ones); any other proxy scheme (socks5://, https://) is :class:`InvalidInput` naming
    the variable, since quietly going direct would bypass a proxy the user relies on.
    """
    host = url.hostname or ""
    if not host or _is_loopback(host):
        return None
    proxies = urllib.request.getproxies_environment()  # lower-cased keys; 'no' is NO_PROXY
    if proxies.get("no") and urllib.request.proxy_bypass(host):
        return None
    for key in (url.scheme, "all"):
        if proxies.get(key):
            raw, variable = proxies[key], f"{key.upper()}_PROXY"
            break
    else:
        return None
    if "://" not in raw:
        raw = "http://" + raw  # 'proxy:3128', as curl takes it
    try:
        proxy = urlsplit(raw)
        port = proxy.port or 80
    except ValueError as exc:
        raise InvalidInput(f"not a proxy URL ({exc}): {raw!r}", field=variable) from None
    if proxy.scheme != "http" or not proxy.hostname:
        raise InvalidInput(f"only http:// proxies are supported, not {raw!r}", field=variable)
    headers: dict[str, str] = {}
    if proxy.username is not None:
        pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    return Proxy(proxy.hostname, port, headers, variable)


def _connection(parts: SplitResult, first: float
                ) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
    """The connection for ``parts`` (direct, or to the proxy), the request target, and the
    headers the proxy needs on the request itself (plain http through a proxy)."""
    target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    proxy = proxy_for(parts)
    host, port = parts.hostname or "", parts.port
    if proxy is None:
        if parts.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=first,
                                               context=ssl.create_default_context()), target, {}
        return http.client.HTTPConnection(host, port, timeout=first), target, {}
    if parts.scheme == "https":  # a CONNECT tunnel through the proxy, TLS to the server inside
        conn = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=first,
                                           context=ssl.create_default_context())
        conn.set_tunnel(host, port or 443, headers=proxy.headers)
        return conn, target, {}
    absolute = urlunsplit(("http", parts.netloc.rpartition("@")[2], parts.path or "/",
                           parts.query, ""))
    return http.client.HTTPConnection(proxy.host, proxy.port, timeout=first), absolute, \
        proxy.headers


def http_call(method: str, url: str, *, timeout: float, body: bytes | None = None,
              headers: dict[str, str] | None = None,
              limit: int = MAX_REPLY_BYTES) -> tuple[int, bytes]:
    """One HTTP exchange, bounded by one wall-clock deadline whatever the server does.

    Socket timeouts bound each read, not the exchange: a server that drips a
    byte every second (in its headers or its body) would keep a reader going
    for ever. Here a watchdog thread shuts the socket down when ``timeout``
    seconds (monotonic) have passed since the call began, which ends any
    read in progress at once; the call then raises :class:`ReplyTimeout`.
    A body longer than ``limit`` is :class:`ModelServerError`. Returns
    (status, body).
    """
    start = time.monotonic()
    deadline = start + timeout
    parts = urlsplit(url)
    first = max(0.01, min(timeout, 10.0))  # connecting must not take the whole budget
    conn, target, proxy_headers = _connection(parts, first)
    done = threading.Event()
    expired = threading.Event()

    def watchdog() -> None:
        # Until the call ends: at the deadline, and again every 0.1 s (a socket made after the
        # first cut, while connecting, is cut too), shut the socket down to end any read.
        if done.wait(max(0.0, deadline - time.monotonic())):
            return
        expired.set()
        while not done.is_set():
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            done.wait(0.1)

    guard = threading.Thread(target=watchdog, name="rootbench-http-deadline", daemon=True)
    guard.start()

    def check() -> None:
        if expired.is_set() or time.monotonic() >= deadline:
            raise ReplyTimeout(f"no complete reply within {timeout:.1f}s")

    try:
        conn.connect()
        check()
        if conn.sock is not None:
            conn.sock.settimeout(max(0.01, deadline - time.monotonic()))
        conn.request(method, target, body=body, headers={**(headers or {}), **proxy_headers})
        response = conn.getresponse()
        data = bytearray()
        while True:
            check()
            chunk = response.read1(65536)  # at most one read of the socket
            if not chunk:
                break
            data += chunk
            if len(data) > limit:
                raise ModelServerError(f"the model server's reply is larger than "
                                       f"{limit // (1024 * 1024)} MB")
        check()
        return response.status, bytes(data)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if expired.is_set() or time.monotonic() >= deadline:
            raise ReplyTimeout(f"no complete reply within {timeout:.1f}s") from None
        if isinstance(exc, OSError):
            raise
        raise ConnectionError(f"{type(exc).__name__}: {exc}") from None
    finally:
        done.set()
        conn.close()
        guard.join(1.0)
