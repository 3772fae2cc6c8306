"""Any OpenAI-compatible chat server: llama-server, vLLM, Ollama, or a remote API.

The one backend for real models. It retries what is transient inside the
caller's deadline, tells "the conversation outgrew the context" apart from
a broken server, and asks the server once what it can do (the capability
requests ``choose_protocol`` reads). The API key is sent, never recorded.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import time
from typing import Any

import requests

from runner.core.errors import ContextExhausted, ModelServerError
from runner.core.model import ChatRequest, Model, ModelReply
from runner.core.protocol import TOOLS

MAX_REPLY_BYTES = 2 * 1024 * 1024  # a chat reply larger than this is a broken server
_RETRY_STATUS = {429, 500, 502, 503, 504}
# How llama-server, vLLM and OpenAI word "the prompt is longer than the context window".
_CONTEXT_FULL = re.compile(r"exceed_context_size|exceeds the available context|"
                           r"maximum context length|context_length_exceeded", re.I)


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
        self.endpoint = endpoint.rstrip("/")
        if self.endpoint.endswith("/v1"):
            self.endpoint = self.endpoint[:-3]
        self.name = model_name
        self._key = api_key or os.environ.get("ROOTBENCH_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.temperature = temperature
        self.seed = seed
        self.max_tokens = max_tokens
        self.retries = retries
        self._extra = dict(extra_fingerprint or {})
        self._session = requests.Session()
        self._props: dict[str, Any] | None = None
        self._json_ok: bool | None = None
        self._native: bool | None = None

    def clone(self, *, seed: int | None = None, endpoint: str | None = None) -> OpenAIModel:
        """This model for one more episode: its own HTTP session (episodes may run at once, in
        threads or other processes), its own seed, the capability answers already learnt."""
        twin = copy.copy(self)
        twin._session = requests.Session()
        twin._extra = dict(self._extra)
        if seed is not None:
            twin.seed = seed
        if endpoint is not None:
            twin.endpoint = endpoint.rstrip("/")
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
        with self._session.post(f"{self.endpoint}/v1/chat/completions", json=body,
                                headers=self._headers(), timeout=(min(timeout, 10.0), timeout),
                                stream=True) as r:
            data = bytearray()
            deadline = time.monotonic() + timeout
            for chunk in r.iter_content(65536):
                data += chunk
                if len(data) > MAX_REPLY_BYTES:
                    raise ModelServerError(f"the model server's reply is larger than "
                                           f"{MAX_REPLY_BYTES // (1024 * 1024)} MB")
                if time.monotonic() > deadline:
                    raise requests.Timeout("reply body took too long")
            return r.status_code, bytes(data)

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
            except (requests.RequestException, OSError) as exc:
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
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise fail("the model server's reply is not JSON") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise fail("the model server's reply has no choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise fail("the model server's reply has no message")
        return ModelReply(message=message, raw=data, usage=_usage(data), duration=round(seconds, 3),
                          attempts=attempts)

    # --- what the server can do (asked once) ---------------------------------------------------

    def _get_props(self) -> dict[str, Any]:
        if self._props is None:
            try:
                r = self._session.get(f"{self.endpoint}/props", headers=self._headers(), timeout=10)
                self._props = r.json() if r.status_code == 200 else {}
                if not isinstance(self._props, dict):
                    self._props = {}
            except (requests.RequestException, ValueError):
                self._props = {}
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
        return {"kind": self.kind, "endpoint": self.endpoint, "name": self.name,
                "sampling": {"temperature": self.temperature, "seed": self.seed,
                             "max_tokens": self.max_tokens}, **self._extra}

    def close(self) -> None:
        self._session.close()


def _usage(data: dict[str, Any]) -> dict[str, Any]:
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    timings = data.get("timings") if isinstance(data.get("timings"), dict) else {}
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    out: dict[str, Any] = {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": details.get("cached_tokens", timings.get("cache_n")),
        "prompt_evaluated": timings.get("prompt_n"),
        "prompt_ms": timings.get("prompt_ms"),
        "predicted_ms": timings.get("predicted_ms"),
    }
    return {k: v for k, v in out.items() if isinstance(v, int | float) and not isinstance(v, bool)}
