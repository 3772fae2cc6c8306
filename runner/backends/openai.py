"""Any OpenAI-compatible chat server: llama-server, vLLM, Ollama, or a remote API.

The one backend for real models. It retries what is transient inside the
caller's deadline, tells "the conversation outgrew the context" apart from
a broken server, and asks the server once what it can do (the capability
requests ``choose_protocol`` reads). The API key is sent, never recorded.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import re
import time
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

from runner.backends.bounded_http import http_call, proxy_for
from runner.core.errors import ContextExhausted, InvalidInput, ModelServerError
from runner.core.model import ChatRequest, Model, ModelReply
from runner.core.protocol import TOOLS

_RETRY_STATUS = {429, 500, 502, 503, 504}
# How llama-server, vLLM and OpenAI word "the prompt is longer than the context window".
_CONTEXT_FULL = re.compile(r"exceed_context_size|exceeds the available context|"
                           r"maximum context length|context_length_exceeded", re.I)


# The largest token count or millisecond figure a usage block may hold: 2**53, the last integer
# every JSON reader keeps exact. Anything above is a broken counter, not a count.
MAX_USAGE = 2 ** 53


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- endpoints and bounded HTTP ------------------------------------------------------------------

def check_endpoint(endpoint: str) -> SplitResult:
    """``endpoint`` parsed, or :class:`InvalidInput` naming ``--endpoint`` in one line.

    An http(s) URL with a host and a valid port; a path (a server behind a
    prefix) and a query (an API gateway's key or version) are kept, a
    fragment is refused (it never reaches the server, so it is a typo).
    """
    try:
        url = urlsplit(endpoint)
        port = url.port
    except ValueError as exc:  # 'http://[::1' (an unclosed IPv6 bracket), a port out of range
        raise InvalidInput(f"not a valid URL ({exc}): {endpoint!r}", field="--endpoint") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise InvalidInput(f"not an http(s) URL with a host: {endpoint!r}", field="--endpoint")
    if port == 0:
        raise InvalidInput(f"the port is not a number from 1 to 65535: {endpoint!r}",
                           field="--endpoint")
    if url.fragment:
        raise InvalidInput(f"a URL fragment (#...) never reaches the server: {endpoint!r}",
                           field="--endpoint")
    if any(ord(c) < 33 or ord(c) == 127 for c in endpoint):
        raise InvalidInput(f"spaces or control characters in the URL: {endpoint!r}",
                           field="--endpoint")
    proxy_for(url)  # a proxy variable that cannot be spoken is refused now, not mid-run
    return url


def api_url(endpoint: str, path: str) -> str:
    """The URL of the server's ``path`` (``v1/chat/completions``, ``props``) under ``endpoint``.

    Built from the parsed parts, never by pasting strings: the path goes after
    the endpoint's own path (a trailing ``/v1`` is the API's, so it is not
    doubled) and before its query, which is kept as it was given.
    """
    url = urlsplit(endpoint)
    base = url.path.rstrip("/")
    if base.endswith("/v1") and path.startswith("v1/"):
        base = base[:-3]
    return urlunsplit((url.scheme, url.netloc, f"{base}/{path.lstrip('/')}", url.query, ""))


def check_reachable(endpoint: str, timeout: float) -> None:
    """Refuse, in one line naming ``--endpoint``, a server that does not answer within ``timeout``.

    Asked before any work (a VM restore is ~20 s a scenario): any HTTP
    answer, even an error status, shows something is listening there.
    """
    try:
        http_call("GET", api_url(endpoint, "v1/models"), timeout=timeout, limit=1024 * 1024)
    except ModelServerError:
        return  # it answered, at length
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        proxy = proxy_for(urlsplit(endpoint))
        via = f" (through {proxy.variable} {proxy.host}:{proxy.port})" if proxy else ""
        raise InvalidInput(_one_line(f"nothing answers at {endpoint}{via} within "
                                     f"{timeout:.0f}s: {why}"), field="--endpoint") from None


def finite_json(raw: bytes | str) -> Any:
    """``raw`` parsed as strict JSON: NaN, Infinity and integers too long to read are refused.

    Python's reader takes ``NaN`` and ``Infinity`` though JSON has neither; a
    reply holding one would end up in a cassette no other tool can read.
    Raises ValueError (or RecursionError) with the reason.
    """
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    return json.loads(raw, parse_constant=constant)


class OpenAIModel(Model):
    """``/v1/chat/completions`` over requests: llama-server, vLLM, Ollama, or a remote server.

    Transient failures (429, 5xx, resets, timeouts) are retried with bounded
    exponential backoff inside the caller's deadline; every failed attempt is
    kept for the cassette. The API key is sent, never recorded.
    """

    kind = "openai"  # the backend, for the fingerprint; the agent is AgentKind.MODEL

    def __init__(self, endpoint: str, model_name: str, *, api_key: str | None = None,
                 temperature: float = 0.0, seed: int = 0, max_tokens: int = 512,
                 extra_fingerprint: dict[str, Any] | None = None, retries: int = 3) -> None:
        self.endpoint = _base(endpoint)
        self.name = model_name
        self._key = api_key or os.environ.get("ROOTBENCH_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.temperature = temperature
        self.seed = seed
        self.max_tokens = max_tokens
        self.retries = retries
        self._extra = dict(extra_fingerprint or {})
        self._props: dict[str, Any] | None = None
        self._json_ok: bool | None = None
        self._native: bool | None = None

    def clone(self, *, seed: int | None = None, endpoint: str | None = None) -> OpenAIModel:
        """This model for one more episode (episodes may run at once, in threads or other
        processes; each call has its own connection), its own seed, the capability answers
        already learnt."""
        twin = copy.copy(self)
        twin._extra = dict(self._extra)
        if seed is not None:
            twin.seed = seed
        if endpoint is not None:
            twin.endpoint = _base(endpoint)
        return twin

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self._key:
            h["Authorization"] = f"Bearer {self._key}"
        return h

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "[scrubbed]") if self._key else text

    def _body(self, request: ChatRequest) -> dict[str, Any]:
        return {"model": self.name, **request.payload(), "temperature": self.temperature,
                "seed": self.seed, "max_tokens": self.max_tokens, "cache_prompt": True,
                "stream": False}

    def _post_once(self, body: dict[str, Any], timeout: float) -> tuple[int, bytes]:
        payload = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8",
                                                                                 "surrogatepass")
        return http_call("POST", api_url(self.endpoint, "v1/chat/completions"), timeout=timeout,
                         body=payload, headers=self._headers())

    def complete(self, request: ChatRequest, timeout: float) -> ModelReply:
        body = self._body(request)
        deadline = time.monotonic() + timeout
        attempts: list[dict[str, Any]] = []
        for attempt in range(self.retries + 1):
            left = deadline - time.monotonic()
            if left <= 0.05:
                break
            t0 = time.monotonic()
            try:
                status, raw = self._post_once(body, left)
            except ModelServerError as exc:
                exc.attempts = attempts
                raise
            except OSError as exc:  # refused, reset, or past the deadline (ReplyTimeout)
                attempts.append({"error": self._scrub(_one_line(f"{type(exc).__name__}: {exc}")),
                                 "seconds": round(time.monotonic() - t0, 3)})
                self._backoff(attempt, deadline)
                continue
            if status in _RETRY_STATUS:
                attempts.append({"status": status, "error": self._scrub(_one_line(raw[:200].decode(errors="replace"))),
                                 "seconds": round(time.monotonic() - t0, 3)})
                self._backoff(attempt, deadline)
                continue
            return self._reply(status, raw, attempts, time.monotonic() - t0)
        last = attempts[-1] if attempts else {"error": "no time left"}
        why = f"HTTP {last['status']}" if "status" in last else last.get("error", "?")
        raise ModelServerError(_one_line(f"the model server failed {len(attempts)} time(s); "
                                         f"last: {why}"),
                               attempts=attempts, out_of_time=deadline - time.monotonic() <= 0.1)

    def _backoff(self, attempt: int, deadline: float) -> None:
        pause = min(0.5 * (2 ** attempt), 8.0) * (0.8 + 0.4 * random.random())
        time.sleep(max(0.0, min(pause, deadline - time.monotonic() - 0.05)))

    def _reply(self, status: int, raw: bytes, attempts: list[dict[str, Any]],
               seconds: float) -> ModelReply:
        def fail(why: str, cls: type[ModelServerError | ContextExhausted] = ModelServerError
                 ) -> Exception:
            return cls(_one_line(why), attempts=attempts)

        if status == 400 and _CONTEXT_FULL.search(raw[:2000].decode(errors="replace")):
            raise fail("the conversation outgrew the model's context: "
                       + self._scrub(raw[:200].decode(errors="replace")), ContextExhausted)
        if status != 200:
            raise fail(f"the model server answered HTTP {status}: "
                       f"{self._scrub(raw[:120].decode(errors='replace'))}")
        try:
            data = finite_json(raw)
        except RecursionError:
            raise fail("the model server's reply is not JSON (nested too deeply)") from None
        except ValueError as exc:  # not JSON, NaN or Infinity, an integer too long to read
            raise fail(f"the model server's reply is not JSON: {exc}") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise fail("the model server's reply has no choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise fail("the model server's reply has no message")
        try:
            usage = _usage(data)
        except ValueError as exc:
            raise fail(f"the model server's reply is malformed: {exc}") from None
        return ModelReply(message=message, raw=data, usage=usage, duration=round(seconds, 3),
                          attempts=attempts)

    # --- what the server can do (asked once) ---------------------------------------------------

    def _get_props(self) -> dict[str, Any]:
        if self._props is None:
            self._props = server_props(self.endpoint, timeout=10, headers=self._headers())
        return self._props

    def template_supports_tools(self) -> bool | None:
        caps = self._get_props().get("chat_template_caps")
        if isinstance(caps, dict) and "supports_tools" in caps:
            return bool(caps["supports_tools"])
        return None

    def accepts_response_format(self) -> bool | None:
        """One tiny request constrained by a schema; yes if the answer parses and fits it."""
        if self._json_ok is None:
            schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
                      "required": ["ok"], "additionalProperties": False}
            req = ChatRequest(messages=[{"role": "user", "content": 'Reply {"ok": true}'}],
                              response_format={"type": "json_schema",
                                               "json_schema": {"name": "capability", "schema": schema}})
            try:
                reply = self._ask_capability(req)
                value = json.loads(reply.message.get("content") or "")
                self._json_ok = isinstance(value, dict) and isinstance(value.get("ok"), bool)
            except (ModelServerError, ValueError):
                self._json_ok = False
        return self._json_ok

    def makes_native_tool_calls(self) -> bool | None:
        if self._native is None:
            req = ChatRequest(messages=[{"role": "user", "content": "Run the command `uptime`."}],
                              tools=TOOLS)
            try:
                reply = self._ask_capability(req)
                calls = reply.message.get("tool_calls")
                self._native = isinstance(calls, list) and bool(calls)
            except ModelServerError:
                self._native = False
        return self._native

    def _ask_capability(self, request: ChatRequest) -> ModelReply:
        saved = self.max_tokens
        self.max_tokens = 32
        try:
            return self.complete(request, timeout=120)
        finally:
            self.max_tokens = saved

    def fingerprint(self) -> dict[str, Any]:
        # The endpoint without its query: a gateway's key may ride in it, and keys are never kept.
        url = urlsplit(self.endpoint)
        endpoint = urlunsplit((url.scheme, url.netloc, url.path, "", ""))
        return {"kind": self.kind, "endpoint": endpoint, "name": self.name,
                "sampling": {"temperature": self.temperature, "seed": self.seed,
                             "max_tokens": self.max_tokens}, **self._extra}

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own connection."""


def _base(endpoint: str) -> str:
    """``endpoint`` without a trailing slash or ``/v1`` on its path (the API adds its own), its
    query kept: ``http://h:8080/v1/`` and ``http://h:8080`` are the same server."""
    url = urlsplit(endpoint)
    path = url.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urlunsplit((url.scheme, url.netloc, path, url.query, ""))


def server_props(endpoint: str, *, timeout: float, headers: dict[str, str] | None = None
                 ) -> dict[str, Any]:
    """The server's ``/props`` (llama-server's capabilities and slots) as a JSON object, else {}.

    Any other answer (an error, not JSON, a JSON list or number, a server
    that never finishes) is "the server does not say": {}.
    """
    try:
        status, raw = http_call("GET", api_url(endpoint, "props"), timeout=timeout,
                                headers=headers, limit=1024 * 1024)
        props = finite_json(raw) if status == 200 else {}
    except (OSError, ModelServerError, ValueError, RecursionError):
        return {}
    return props if isinstance(props, dict) else {}


def _count(where: str, value: Any, *, integer: bool) -> int | float | None:
    """One usage figure as sent: None when absent; a count it can be; else ValueError saying why.

    Usage feeds the run's token and speed figures and its cassette. A
    negative, fractional, textual or astronomically large count is a broken
    server, and taking it would put a wrong figure (or one JSON cannot hold)
    into the results, so the reply is refused instead (the episode is then
    ``infra-error`` with this reason; see docs/running.md, "Misbehaving model servers").
    """
    if value is None:
        return None
    if integer and isinstance(value, float) and value.is_integer() and 0 <= value <= MAX_USAGE:
        value = int(value)  # 12.0 tokens is 12 tokens
    ok = (isinstance(value, int) or (not integer and isinstance(value, float))) \
        and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= MAX_USAGE
    if not ok:
        shown = repr(value) if not isinstance(value, int) or value.bit_length() < 64 \
            else f"an integer of {value.bit_length()} bits"
        what = "a count" if integer else "a duration"
        raise ValueError(f"{where} is {_one_line(shown, 40)}, not {what} from 0 to 2**53")
    return value


def _usage(data: dict[str, Any]) -> dict[str, Any]:
    """The reply's token counts and llama-server's timings, each checked by :func:`_count`."""
    usage = v if isinstance(v := data.get("usage"), dict) else {}
    timings = v if isinstance(v := data.get("timings"), dict) else {}
    details = v if isinstance(v := usage.get("prompt_tokens_details"), dict) else {}
    cached = ("usage.prompt_tokens_details.cached_tokens", details["cached_tokens"]) \
        if "cached_tokens" in details else ("timings.cache_n", timings.get("cache_n"))
    fields = {
        "prompt_tokens": ("usage.prompt_tokens", usage.get("prompt_tokens"), True),
        "completion_tokens": ("usage.completion_tokens", usage.get("completion_tokens"), True),
        "cached_tokens": (*cached, True),
        "prompt_evaluated": ("timings.prompt_n", timings.get("prompt_n"), True),
        "prompt_ms": ("timings.prompt_ms", timings.get("prompt_ms"), False),
        "predicted_ms": ("timings.predicted_ms", timings.get("predicted_ms"), False),
    }
    out = {key: _count(where, value, integer=integer)
           for key, (where, value, integer) in fields.items()}
    return {k: v for k, v in out.items() if v is not None}
