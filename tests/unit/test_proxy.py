"""A model server behind the user's proxy: HTTPS_PROXY and friends are followed, loopback never.

Real sockets throughout: a forward proxy on loopback (tests/proxyserver.py), a model server
on loopback (tests/badserver.py), over TLS with a certificate from a throwaway CA (trustme)
that the client trusts through SSL_CERT_FILE, as a company's own CA is trusted.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trustme
from badserver import bad_server
from conftest import Cli
from proxyserver import proxy_server

from runner.backends.bounded_http import proxy_for
from runner.backends.openai import OpenAIModel, check_endpoint, server_props
from runner.core.errors import InvalidInput, ModelServerError
from runner.core.model import ChatRequest

REQ = ChatRequest(messages=[{"role": "user", "content": "hi"}])
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def _no_proxy_of_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the proxy variables it means; the machine's own ones are not inherited."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, object]]:
    """(port, state) of an HTTPS model server on 127.0.0.1 whose certificate names
    model.example, issued by a CA the client trusts (SSL_CERT_FILE) and nothing else does."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("model.example").configure_cert(context)
    with bad_server(["ok"], tls=context) as (url, state):
        yield urlsplit(url).port or 0, state


def test_https_goes_through_the_proxy_in_a_tunnel_with_its_credentials(
        tls_server: tuple[int, object], monkeypatch: pytest.MonkeyPatch) -> None:
    port, state = tls_server
    secret = "Basic " + base64.b64encode(b"ops:p@ss word").decode()
    with proxy_server({("model.example", 443): ("127.0.0.1", port)}, auth=secret) as (proxy, seen):
        monkeypatch.setenv("HTTPS_PROXY", proxy.replace("://", "://ops:p%40ss%20word@"))
        check_endpoint("https://model.example/v1")
        model = OpenAIModel("https://model.example/v1", "m")
        assert model.complete(REQ, 10).message["role"] == "assistant"
        assert server_props("https://model.example", timeout=5) == {"total_slots": 1}
    # one tunnel per call, to the name asked for, with the credentials; TLS inside it was
    # checked against model.example (the CA trusts no other name, and 127.0.0.1 is not it)
    assert seen.seen == [("CONNECT", "model.example:443", secret)] * 2
    assert state.paths == ["/v1/chat/completions", "/props"]  # type: ignore[attr-defined]
    # the proxy's credentials went to the proxy, never to the model server
    assert not any("proxy-authorization" in {k.lower() for k in h}
                   for h in state.headers)  # type: ignore[attr-defined]


def test_plain_http_goes_to_the_proxy_as_an_absolute_url(monkeypatch: pytest.MonkeyPatch) -> None:
    with bad_server(["ok"]) as (url, state):
        port = urlsplit(url).port or 0
        with proxy_server({("model.example", 8080): ("127.0.0.1", port)}) as (proxy, seen):
            monkeypatch.setenv("http_proxy", proxy)  # lower case, as curl prefers it
            OpenAIModel("http://model.example:8080/v1?key=k", "m").complete(REQ, 10)
    assert seen.seen == [("POST", "http://model.example:8080/v1/chat/completions?key=k", None)]
    assert state.paths == ["/v1/chat/completions?key=k"]


def test_a_proxy_that_refuses_says_so_in_the_error(tls_server: tuple[int, object],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    port, _state = tls_server
    with proxy_server({("model.example", 443): ("127.0.0.1", port)}, auth="Basic x") as (proxy, _):
        monkeypatch.setenv("HTTPS_PROXY", proxy)  # no credentials
        with pytest.raises(ModelServerError, match="407 Proxy Authentication Required"):
            OpenAIModel("https://model.example", "m", retries=1).complete(REQ, 10)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_is_never_proxied(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own llama-server on 127.0.0.1 must answer whatever proxy the user set (and no
    NO_PROXY): here every variable names a proxy that is not there."""
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    with bad_server(["ok"]) as (url, state):
        endpoint = url.replace("127.0.0.1", host)
        OpenAIModel(endpoint, "m").complete(REQ, 10)
    assert state.paths == ["/v1/chat/completions"]
    assert proxy_for(urlsplit("http://[::1]:8080/")) is None


def test_no_proxy_and_the_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    url = urlsplit("https://api.example.com/v1")
    assert proxy_for(url) is None
    monkeypatch.setenv("ALL_PROXY", "proxy.corp:3128")  # no scheme: http, as curl reads it
    p = proxy_for(url)
    assert p is not None and (p.host, p.port, p.variable, p.headers) == \
        ("proxy.corp", 3128, "ALL_PROXY", {})
    monkeypatch.setenv("HTTPS_PROXY", "http://other:8000")  # the scheme's own comes first
    assert (proxy_for(url) or p).host == "other"
    monkeypatch.setenv("NO_PROXY", ".example.com,10.0.0.0")
    assert proxy_for(url) is None
    assert proxy_for(urlsplit("https://api.other.org/")) is not None


@pytest.mark.parametrize("value", ["socks5://127.0.0.1:1080", "https://proxy.corp:443",
                                   "http://proxy.corp:99999"])
def test_a_proxy_that_cannot_be_spoken_is_one_line_naming_the_variable(
        cli: Cli, tmp_path: Path, value: str) -> None:
    with pytest.raises(InvalidInput, match="^ALL_PROXY: "):
        check_endpoint_with({"ALL_PROXY": value})
    runs = tmp_path / "runs"
    r = cli("bench", "--runs-dir", str(runs), "--endpoint", "https://api.example.com/v1",
            env={"ALL_PROXY": value, "all_proxy": None, "HTTPS_PROXY": None,
                 "https_proxy": None, "NO_PROXY": None, "no_proxy": None})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "ALL_PROXY" in r.stderr and not runs.exists()


def check_endpoint_with(env: dict[str, str]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        check_endpoint("https://api.example.com/v1")
