"""An agent for any OpenAI-compatible chat endpoint, in plain ``requests`` (tool calls).

    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_MODEL=qwen \
      rootbench run specs/nginx-stopped.yaml --agent examples/openai_agent.py:OpenAIAgent

OPENAI_API_KEY is sent as a bearer token when set. The harness records the
commands this agent runs and what they printed, not its model calls: the
cassette replays without this file, the endpoint, or the key.
"""

from __future__ import annotations

import json
import os
from typing import Any

import requests

from runner.core.agent_api import Shell

TOOLS = [{"type": "function", "function": {
    "name": "run_command", "description": "Run a shell command as root; see its exit code and output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "finish", "description": "Call when the problem is fixed, with a short summary.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}},
                       "required": ["summary"]}}}]
SYSTEM = ("You are a Linux sysadmin with a root shell on a broken Debian server. Investigate, "
          "fix the cause, check the fix, then call finish. Never start interactive programs.")


class OpenAIAgent:
    name = "openai-example"

    def __init__(self) -> None:
        self.url = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1").rstrip("/")
        self.model = os.environ.get("OPENAI_MODEL", "default")
        key = os.environ.get("OPENAI_API_KEY")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def chat(self, messages: list[dict[str, Any]], timeout: float) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, "tools": TOOLS, "temperature": 0}
        r = requests.post(f"{self.url}/chat/completions", json=body, headers=self.headers,
                          timeout=timeout)
        r.raise_for_status()
        return r.json()["choices"][0]["message"]

    def solve(self, task: str, shell: Shell) -> str | None:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": task}]
        while shell.budget.turns > 0 and shell.budget.seconds > 0:
            reply = self.chat(messages, timeout=max(1.0, min(120.0, shell.budget.seconds)))
            calls = reply.get("tool_calls") or []
            messages.append({"role": "assistant", "content": reply.get("content"),
                             **({"tool_calls": calls} if calls else {})})
            if not calls:
                messages.append({"role": "user", "content": "Use the run_command or finish tool."})
                continue
            for call in calls:
                name, args = call["function"]["name"], json.loads(call["function"]["arguments"] or "{}")
                if name == "finish":
                    shell.finish(str(args.get("summary", "")))
                    return None
                code, output = shell.run(str(args.get("command", "")))
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""),
                                 "content": f"exit code {code}\n{output}"})
        return "out of turns"
